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
    found = [
        (path, document)
        for path, document in yaml_documents.documents_in(directory)
        if isinstance(document, dict) and document.get("apiVersion") == API_VERSION and document.get("kind") == KIND
    ]
    if not found:
        return DEFAULT_POLICY
    if len(found) > 1:
        names = ", ".join(f"{p}:{(d.get('metadata') or {}).get('name')}" for p, d in found)
        raise PolicyError(found[1][0], str((found[1][1].get("metadata") or {}).get("name")), "kind",
                          f"only one PreemptionPolicy may be active, found {len(found)} ({names})")
    return parse_policy(found[0][1], source=found[0][0])
