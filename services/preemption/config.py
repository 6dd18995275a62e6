"""The active PreemptionPolicy, read from the same directory as the Kueue objects (QM_CONFIG_DIR)."""

from __future__ import annotations

from pathlib import Path

from services.contracts import yaml_documents
from services.core.preemption_policy import (
    API_VERSION,
    DEFAULT_POLICY,
    KIND,
    PolicyError,
    PreemptionPolicy,
    parse_policy,
)


def load_policy(directory: str | Path) -> PreemptionPolicy:
    """The one PreemptionPolicy in the *.yaml / *.yml files of `directory`; the defaults
    (training not preemptible, inference may preempt lower-priority batch) when there is none."""
    found: list[tuple[str, dict]] = []
    for path in sorted(Path(directory).glob("*.y*ml")):
        for document in yaml_documents.load_all(path.read_text()):
            if isinstance(document, dict) and document.get("apiVersion") == API_VERSION and document.get("kind") == KIND:
                found.append((str(path), document))
    if not found:
        return DEFAULT_POLICY
    if len(found) > 1:
        names = ", ".join(f"{p}:{(d.get('metadata') or {}).get('name')}" for p, d in found)
        raise PolicyError(found[1][0], str((found[1][1].get("metadata") or {}).get("name")), "kind",
                          f"only one PreemptionPolicy may be active, found {len(found)} ({names})")
    return parse_policy(found[0][1], source=found[0][0])
