"""`qm status` as a pure function: queues, usage and budgets at a glance, from envelopes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from services.contracts.codec import Envelope
from services.explain import GPU, _ordered, holders_by_cluster_queue

__all__ = ["Status", "status"]


@dataclass(slots=True)
class Status:
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)  # cluster queue -> counts and GPUs
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)  # namespace -> latest usage snapshot
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)  # cost center -> latest status
    rejected: int = 0
    as_of: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"as_of": self.as_of, "queues": self.queues, "usage": self.usage, "budgets": self.budgets,
                "rejected": self.rejected}


def status(envelopes: Iterable[Envelope]) -> Status:
    """Per ClusterQueue: pending (latest event Pending), reserved and running workloads and their
    GPUs; per namespace the latest usage snapshot; per cost center the latest budget status."""
    trail = _ordered(envelopes)
    out = Status()
    last: dict[str, Envelope] = {}  # uid -> latest lifecycle event on qm.workloads
    cq_of: dict[str, str] = {}
    for e in trail:
        out.as_of = max(out.as_of, e.occurred_at)
        p = e.payload
        t = e.event_type
        if t == "usage.snapshot.v1":
            out.usage[p.namespace] = {"reserved": p.reserved, "running": p.running, "total": p.total, "as_of": p.as_of}
        elif t == "budget.status.v1":
            out.budgets[p.cost_center] = {"period": p.period, "unit": p.unit, "limit": p.limit, "used": p.used,
                                          "remaining": p.remaining, "exhausted": p.exhausted}
        elif t.startswith("workload.") and t != "workload.submitted.v1":
            last[p.uid] = e
            if getattr(p, "cluster_queue", None):
                cq_of[p.uid] = p.cluster_queue
    for uid, e in last.items():
        if e.event_type == "workload.rejected.v1":
            out.rejected += 1
            continue
        cq = cq_of.get(uid)
        if cq is None:
            continue
        row = out.queues.setdefault(cq, {"pending": 0, "reserved": 0, "running": 0, "gpu_reserved": 0, "gpu_running": 0})
        if e.event_type in ("workload.pending.v1", "workload.validated.v1", "workload.requeued.v1"):
            row["pending"] += 1
    holders = holders_by_cluster_queue(trail)
    for cq in list(out.queues) + sorted({h for h in cq_of.values()} - set(out.queues)):
        row = out.queues.setdefault(cq, {"pending": 0, "reserved": 0, "running": 0, "gpu_reserved": 0, "gpu_running": 0})
        for h in holders.get(cq, ()):
            key = "running" if h.running else "reserved"
            row[key] += 1
            row[f"gpu_{key}"] += h.gpu_milli
    out.queues = dict(sorted(out.queues.items()))
    out.usage = dict(sorted(out.usage.items()))
    out.budgets = dict(sorted(out.budgets.items()))
    return out


def gpus(milli: int) -> str:
    return f"{milli / 1000:g}"


def usage_gpus(by_flavor: dict) -> int:
    return sum(by_res.get(GPU, 0) for by_res in by_flavor.values())
