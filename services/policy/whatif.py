"""What-if: evaluate a new or changed policy against the live workloads before applying it.

The source of "live" is pluggable (`SnapshotSource`): today a JSON/YAML snapshot file;
the admission service can provide one built from its Kafka replicas.

A workload that is already admitted or running is part of its namespace's usage. Asking
"would it be refused if submitted now?" with that usage would count it twice, so its own
GPUs are removed from the usage first (Kueue's SimulateWorkloadUsageRemoval, as a copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from services.policy.evaluate import evaluate
from services.policy.live import StaticLiveState, load_records
from services.policy.loader import PolicySet
from services.policy.model import EnforcementAction, EnforcementPoint
from services.policy.views import GPU, cost_center_of, workload_view

_WORKLOAD_KINDS = {
    "Job",
    "Workload",
    "Pod",
    "JobSet",
    "PyTorchJob",
    "TFJob",
    "MPIJob",
    "Deployment",
    "StatefulSet",
}


@dataclass(frozen=True)
class ClusterSnapshot:
    workloads: tuple[dict[str, Any], ...]
    live: StaticLiveState


class SnapshotSource(Protocol):
    def snapshot(self) -> ClusterSnapshot: ...


@dataclass(frozen=True)
class FileSnapshotSource:
    """Workloads (and optionally Namespaces, usage, budgets, cluster signals) from files.

    Each file may hold YAML documents, a JSON/YAML list, or a Kubernetes `List`. Records are
    recognised by shape: objects with a workload `kind`, `kind: Namespace`, usage records
    (`namespace` + `total`/`running`/`reserved`), budget records (`costCenter`), and cluster
    signals (`gpuUtilization`).
    """

    workloads: str | Path
    extra: tuple[str | Path, ...] = ()

    def snapshot(self) -> ClusterSnapshot:
        workloads, namespaces, usages, budgets = [], [], [], []
        cluster: dict[str, Any] | None = None
        for path in (self.workloads, *self.extra):
            for rec in load_records(path):
                if not isinstance(rec, dict):
                    continue
                kind = rec.get("kind")
                if kind == "Namespace":
                    namespaces.append(rec)
                elif kind in _WORKLOAD_KINDS:
                    workloads.append(rec)
                elif "costCenter" in rec:
                    budgets.append(rec)
                elif "namespace" in rec and any(k in rec for k in ("total", "running", "reserved")):
                    usages.append(rec)
                elif "gpuUtilization" in rec:
                    cluster = rec
        return ClusterSnapshot(tuple(workloads), StaticLiveState.build(namespaces, usages, budgets, cluster))


@dataclass(frozen=True)
class WhatIfRow:
    namespace: str
    name: str
    kind: str
    policy: str
    enforcement_action: str
    message: str
    blocked_now: bool  # the current version of the same policy already denies it


@dataclass(frozen=True)
class WhatIfReport:
    evaluated: int
    rows: tuple[WhatIfRow, ...] = field(default=())

    @property
    def blocked(self) -> tuple[WhatIfRow, ...]:
        return tuple(r for r in self.rows if r.enforcement_action == EnforcementAction.DENY)

    @property
    def newly_blocked(self) -> tuple[WhatIfRow, ...]:
        return tuple(r for r in self.blocked if not r.blocked_now)


def counts_in_usage(obj: dict[str, Any]) -> bool:
    """True when the workload already holds quota (so it is inside its namespace's usage)."""
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if kind == "Workload":
        if status.get("admission"):
            return True
        return any(
            c.get("type") in ("QuotaReserved", "Admitted") and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
    if kind == "Job":
        if status.get("completionTime") or any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in status.get("conditions") or []
        ):
            return False
        return spec.get("suspend") is False or (spec.get("suspend") is None and bool(status.get("startTime")))
    if kind == "Pod":
        return status.get("phase") in ("Pending", "Running")
    return False


def usage_without(usage: dict[str, Any] | None, gpu_milli: int) -> dict[str, Any] | None:
    """A copy of a usage record with `gpu_milli` of GPU removed from the namespace total."""
    if usage is None or gpu_milli <= 0:
        return usage
    total = dict(usage.get("total") or {})
    total[GPU] = max(0, int(total.get(GPU, 0)) - gpu_milli)
    return {**usage, "total": total}


def what_if(
    candidate: PolicySet,
    snapshot: ClusterSnapshot,
    current: PolicySet | None = None,
    *,
    operation: str = "CREATE",
    enforcement_point: str = EnforcementPoint.WEBHOOK,
) -> WhatIfReport:
    rows: list[WhatIfRow] = []
    live = snapshot.live
    for obj in snapshot.workloads:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace", "")
        ns_obj = live.namespace(ns)
        usage = live.usage(ns)
        if counts_in_usage(obj):
            usage = usage_without(usage, workload_view(obj)["gpuMilli"])
        cc = cost_center_of(obj, ns_obj)
        args = (ns_obj, usage, live.budget(cc) if cc else None, live.cluster(), operation)
        decision = evaluate(candidate, obj, *args, enforcement_point=enforcement_point)
        if not decision.violations:
            continue
        denied_now: set[str] = set()
        if current is not None:
            denied_now = {
                v.policy for v in evaluate(current, obj, *args, enforcement_point=enforcement_point).denials
            }
        for v in decision.violations:
            rows.append(
                WhatIfRow(
                    ns,
                    meta.get("name", ""),
                    obj.get("kind", ""),
                    v.policy,
                    v.enforcement_action.value,
                    v.message,
                    v.policy in denied_now,
                )  # fmt: skip
            )
    return WhatIfReport(len(snapshot.workloads), tuple(rows))
