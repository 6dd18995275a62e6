"""Where the evaluator's live inputs come from: Namespaces, qm.usage, qm.budgets, cluster signals.

The webhook and `qm policy what-if` take any `LiveState`. Production wires the admission
service's read-only replicas of the compacted topics; tests, the bench and what-if use
`StaticLiveState` (built from dicts or a snapshot file).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from services.contracts import yaml_documents


class LiveState(Protocol):
    def namespace(self, name: str) -> dict[str, Any] | None: ...
    async def namespace_soon(self, name: str, within_s: float) -> dict[str, Any] | None:
        """The Namespace, waiting up to `within_s` for it if it is not known yet."""
    def usage(self, namespace: str) -> dict[str, Any] | None: ...
    def budget(self, cost_center: str) -> dict[str, Any] | None: ...
    def cluster(self) -> dict[str, Any] | None: ...
    def ready(self) -> bool: ...


@dataclass
class StaticLiveState:
    """An in-memory `LiveState`: the fake for tests and the source for file snapshots."""

    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    usages: dict[str, dict[str, Any]] = field(default_factory=dict)
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    cluster_signals: dict[str, Any] | None = None

    def namespace(self, name: str) -> dict[str, Any] | None:
        return self.namespaces.get(name)

    async def namespace_soon(self, name: str, within_s: float) -> dict[str, Any] | None:
        return self.namespaces.get(name)  # nothing arrives in a static state

    def usage(self, namespace: str) -> dict[str, Any] | None:
        return self.usages.get(namespace)

    def budget(self, cost_center: str) -> dict[str, Any] | None:
        return self.budgets.get(cost_center)

    def cluster(self) -> dict[str, Any] | None:
        return self.cluster_signals

    def ready(self) -> bool:
        return True

    @classmethod
    def build(
        cls,
        namespaces: Iterable[Mapping[str, Any]] = (),
        usages: Iterable[Mapping[str, Any]] = (),
        budgets: Iterable[Mapping[str, Any]] = (),
        cluster: Mapping[str, Any] | None = None,
    ) -> StaticLiveState:
        return cls(
            {n["metadata"]["name"]: dict(n) for n in namespaces},
            {u["namespace"]: dict(u) for u in usages},
            {b["costCenter"]: dict(b) for b in budgets},
            dict(cluster) if cluster else None,
        )


def load_records(path: str | Path) -> list[Any]:
    """Documents of a YAML/JSON file, flattening `List`/`items` and top-level lists."""
    out: list[Any] = []
    for doc in yaml_documents.load_all(Path(path).read_text()):
        if doc is None:
            continue
        if isinstance(doc, list):
            out.extend(doc)
        elif isinstance(doc, dict) and isinstance(doc.get("items"), list) and "kind" in doc:
            out.extend(doc["items"])
        else:
            out.append(doc)
    return out


def load_state_file(path: str | None) -> StaticLiveState:
    """A live-state file (the webhook's and `qm policy where`'s --state): Namespaces, qm.usage
    records, qm.budgets records and cluster signals, told apart by their fields. None: empty."""
    if not path:
        return StaticLiveState()
    ns, usage, budgets, cluster = [], [], [], None
    for rec in load_records(path):
        if not isinstance(rec, dict):
            continue
        if rec.get("kind") == "Namespace":
            ns.append(rec)
        elif "costCenter" in rec:
            budgets.append(rec)
        elif "namespace" in rec and ("total" in rec or "running" in rec or "reserved" in rec):
            usage.append(rec)
        elif rec.get("kind") == "ClusterSignals" or "gpuUtilization" in rec:
            cluster = rec
    return StaticLiveState.build(ns, usage, budgets, cluster)
