"""Trace lifecycle records → the ``qm.workloads`` records the cost service consumes, shaped
and keyed exactly as the queue-manager publishes them (replays, tests, demo).

Each trace pod is one workload (uid = pod name) admitted the moment it runs, in the cohort
of its namespace (:func:`trace_cohort`, key of ``qm.workloads``):

* ``running`` → ``workload.quota_reserved.v1``, then what the queue-manager re-keys from
  ``qm.cluster``: ``pod.running.v1`` (same size: reserved-idle stays zero, as in
  :func:`services.trace.cost_events.cost_events` with ``reserve=True``) and
  ``workload.running.v1``;
* ``finished``/``deleted`` → ``pod.finished.v1`` + ``workload.finished.v1``;
* ``tick`` → one ``clock.tick.v1`` per cohort key (the queue-manager's fan-out of ``qm.clock``).

The stream starts with one ``namespace.labels.v1`` per team namespace on ``qm.cluster``
(its cost center label), which the service reads through its replica.
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
    WorkloadRunning,
)
from services.core.cost.units import iso_utc
from services.trace.alibaba import (
    COST_CENTER_LABEL,
    TEAM_COST_CENTERS,
    TEAM_NAMESPACES,
    TraceEvent,
    TraceEventKind,
)

__all__ = ["PRODUCER", "trace_cohort", "trace_envelopes", "trace_labels"]

PRODUCER = "trace-driver"


def trace_cohort(namespace: str) -> str:
    """The cohort key of a team namespace's queue."""
    return f"{namespace}-cohort"


def trace_labels() -> dict[str, dict[str, str]]:
    """namespace → labels, as the stream's ``namespace.labels.v1`` records set them."""
    return {namespace: {COST_CENTER_LABEL: center} for namespace, center in TEAM_COST_CENTERS.items()}


def _requests(record: TraceEvent) -> dict[str, int]:
    return {
        "nvidia.com/gpu": record.gpu_milli,
        "cpu": record.cpu_milli,
        "memory": record.memory_mib * 2**20 * 1000,
    }


def trace_envelopes(records: Iterable[TraceEvent]) -> Iterator[tuple[str, str, Envelope]]:
    """``(topic, key, envelope)`` in trace order; ids are deterministic (same trace → same ids)."""
    first = True
    cohorts = [trace_cohort(namespace) for namespace in TEAM_NAMESPACES]
    for record in records:
        at = iso_utc(record.at_ms)
        if first:
            first = False
            for namespace, labels in trace_labels().items():
                payload = NamespaceLabels(namespace=namespace, labels=labels)
                yield "qm.cluster", namespace, make_envelope(payload, producer=PRODUCER, occurred_at=at, identity=(namespace,))
        uid = record.pod_name
        key = trace_cohort(record.namespace) if record.namespace else ""

        def out(payload, *ident, key=key, at=at, record=record) -> tuple[str, str, Envelope]:
            return "qm.workloads", key, make_envelope(payload, producer=PRODUCER, occurred_at=at, identity=(record.event_id, *ident))

        if record.kind is TraceEventKind.RUNNING:
            yield out(WorkloadQuotaReserved(
                uid=uid,
                namespace=record.namespace,
                name=uid,
                cluster_queue=f"{record.namespace}-cq",
                flavors={"main": {"nvidia.com/gpu": record.flavor}},
                counts={"main": 1},
                usage={record.flavor: _requests(record)},
                reserved_at=at,
                cohort=key,
            ))
            yield out(PodRunning(
                uid=f"{uid}-pod",
                workload_uid=uid,
                namespace=record.namespace,
                name=f"{uid}-0",
                started_at=at,
                requests=_requests(record),
                workload_name=uid,
            ), "pod.running.v1")
            yield out(WorkloadRunning(uid=uid, namespace=record.namespace, name=uid, started_at=at), "workload.running.v1")
        elif record.kind in (TraceEventKind.FINISHED, TraceEventKind.DELETED):
            yield out(PodFinished(
                uid=f"{uid}-pod", workload_uid=uid, namespace=record.namespace, name=f"{uid}-0",
                phase="Succeeded", finished_at=at, workload_name=uid,
            ), "pod.finished.v1")
            yield out(WorkloadFinished(uid=uid, namespace=record.namespace, name=uid, succeeded=True, finished_at=at))
        elif record.kind is TraceEventKind.TICK:
            for cohort in cohorts:
                tick = ClockTick(at=at, source="trace")
                yield "qm.workloads", cohort, make_envelope(
                    tick, producer=PRODUCER, occurred_at=at, identity=(record.event_id, cohort)
                )
