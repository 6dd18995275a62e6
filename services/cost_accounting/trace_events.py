"""Trace lifecycle records → the contract events the cost service consumes (replays, tests, demo).

Each trace pod is one workload (uid = pod name) admitted the moment it runs:
``running`` → ``workload.quota_reserved.v1`` (on ``qm.workloads``, key = cohort ``trace``)
followed by ``pod.running.v1`` (on ``qm.cluster``, key = workload uid) of the same size, so
reserved-idle stays zero as in :func:`services.trace.cost_events.cost_events` with
``reserve=True``; ``finished``/``deleted`` → ``pod.finished.v1`` + ``workload.finished.v1``;
``tick`` → ``clock.tick.v1`` on ``qm.clock``. The stream starts with one
``namespace.labels.v1`` per team namespace (its cost center label).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from services.contracts.codec import Envelope, make_envelope
from services.contracts.events import (
    ClockTick,
    NamespaceLabels,
    PodFinished,
    PodRunning,
    WorkloadFinished,
    WorkloadQuotaReserved,
)
from services.core.cost.units import iso_utc
from services.trace.alibaba import COST_CENTER_LABEL, TEAM_COST_CENTERS, TraceEvent, TraceEventKind

__all__ = ["TRACE_COHORT", "trace_envelopes"]

TRACE_COHORT = "trace"
PRODUCER = "trace-driver"


def _requests(record: TraceEvent) -> dict[str, int]:
    return {
        "nvidia.com/gpu": record.gpu_milli,
        "cpu": record.cpu_milli,
        "memory": record.memory_mib * 2**20 * 1000,
    }


def trace_envelopes(records: Iterable[TraceEvent]) -> Iterator[tuple[str, str, Envelope]]:
    """``(topic, key, envelope)`` in trace order; ids are deterministic (same trace → same ids)."""
    first = True
    for record in records:
        at = iso_utc(record.at_ms)
        if first:
            first = False
            for namespace, center in TEAM_COST_CENTERS.items():
                payload = NamespaceLabels(namespace=namespace, labels={COST_CENTER_LABEL: center})
                yield "qm.cluster", namespace, make_envelope(payload, producer=PRODUCER, occurred_at=at, identity=(namespace,))
        uid = record.pod_name
        if record.kind is TraceEventKind.RUNNING:
            reserved = WorkloadQuotaReserved(
                uid=uid,
                namespace=record.namespace,
                name=uid,
                cluster_queue=f"{record.namespace}-cq",
                flavors={"main": {"nvidia.com/gpu": record.flavor}},
                counts={"main": 1},
                usage={record.flavor: _requests(record)},
                reserved_at=at,
                cohort=TRACE_COHORT,
            )
            yield "qm.workloads", TRACE_COHORT, make_envelope(reserved, producer=PRODUCER, occurred_at=at, identity=(record.event_id,))
            pod = PodRunning(
                uid=f"{uid}-pod",
                workload_uid=uid,
                namespace=record.namespace,
                name=f"{uid}-0",
                started_at=at,
                requests=_requests(record),
                workload_name=uid,
            )
            yield "qm.cluster", uid, make_envelope(pod, producer=PRODUCER, occurred_at=at, identity=(record.event_id,))
        elif record.kind in (TraceEventKind.FINISHED, TraceEventKind.DELETED):
            stopped = PodFinished(
                uid=f"{uid}-pod", workload_uid=uid, namespace=record.namespace, name=f"{uid}-0",
                phase="Succeeded", finished_at=at, workload_name=uid,
            )
            yield "qm.cluster", uid, make_envelope(stopped, producer=PRODUCER, occurred_at=at, identity=(record.event_id,))
            done = WorkloadFinished(uid=uid, namespace=record.namespace, name=uid, succeeded=True, finished_at=at)
            yield "qm.workloads", TRACE_COHORT, make_envelope(done, producer=PRODUCER, occurred_at=at, identity=(record.event_id,))
        elif record.kind is TraceEventKind.TICK:
            tick = ClockTick(at=at, source="trace")
            yield "qm.clock", "trace", make_envelope(tick, producer=PRODUCER, occurred_at=at, identity=(record.event_id,))
