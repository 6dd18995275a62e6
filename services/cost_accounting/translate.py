"""Contract envelopes → the cost core's events (pure: no I/O, no clock).

The bus events do not carry everything the core wants in one message: ``pod.running.v1``
has the pod's requests but not its flavor, ``workload.running.v1`` has neither. So the
translation takes a small per-workload memo (:class:`WorkloadMemo`, kept by the service
next to the core state) and returns the core events plus the memo's new value.

Rules (docs/adr/0007-cost-service-keys.md):

* ``workload.quota_reserved.v1`` → :class:`ReservationStarted` for the workload's *GPU
  flavor*: the flavor of ``usage`` with the most GPU (ties: by name). The core keeps one
  reservation per workload, so the other flavors of a multi-flavor reservation (usually
  CPU-only) are not billed as reserved-idle.
* ``pod.running.v1`` → :class:`PodsRunning` named by the pod uid, in the workload's
  reserved flavor. Before the reservation is known the event is *deferred* (the memo
  holds it) and replayed when the reservation arrives: topics interleave freely.
* ``workload.running.v1`` → one unnamed :class:`PodsRunning` with the reserved amounts, unless
  pod-level observations exist. The first ``pod.running`` after it supersedes it: the
  unnamed interval is closed at its own start (zero length), so nothing is counted twice.
* ``workload.prefreeze_expired.v1`` → :class:`PreFreezeExpired`; ``released`` →
  :class:`Released`; ``evicted`` → :class:`Evicted`; ``finished`` → :class:`Finished`;
  ``pod.finished.v1`` → :class:`PodsStopped`; ``namespace.labels.v1`` →
  :class:`NamespaceLabeled` (deleted → no labels); ``clock.tick.v1`` → :class:`ClockTick`.
* Everything else (validated, pending, requeued, …) → nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from services.contracts.codec import Envelope, parse_utc
from services.contracts.events import (
    ClockTick as ClockTickRecord,
)
from services.contracts.events import (
    NamespaceLabels,
    PodFinished,
    PodRunning,
    WorkloadEvicted,
    WorkloadFinished,
    WorkloadPrefreezeExpired,
    WorkloadQuotaReserved,
    WorkloadReleased,
    WorkloadRunning,
)
from services.core.cost import (
    ClockTick,
    CostEvent,
    Evicted,
    Finished,
    NamespaceLabeled,
    PodsRunning,
    PodsStopped,
    PreFreezeExpired,
    Released,
    ReservationStarted,
    ResourceAmounts,
)
from services.core.frozen import quick_init

__all__ = ["RELEVANT_EVENT_TYPES", "Translation", "WorkloadMemo", "at_ms", "translate", "workload_uid_of"]

GPU: Final = "nvidia.com/gpu"
PODS: Final = "pods"  # Kueue's pod-count resource

#: The event types the cost service reads; everything else on its topics is skipped early.
RELEVANT_EVENT_TYPES: Final = frozenset(
    {
        "workload.quota_reserved.v1",
        "workload.running.v1",
        "workload.prefreeze_expired.v1",
        "workload.released.v1",
        "workload.evicted.v1",
        "workload.finished.v1",
        "pod.running.v1",
        "pod.finished.v1",
        "namespace.labels.v1",
        "clock.tick.v1",
    }
)


@quick_init
@dataclass(frozen=True, slots=True)
class WorkloadMemo:
    """What the translation remembers about one workload (JSON-able via to_dict/from_dict)."""

    flavor: str | None = None
    reserved: tuple[int, int, int] = (0, 0, 0)  # gpu, cpu, memory milli of the reserved flavor
    pod_level: bool = False  # a pod.running was seen: workload.running no longer counts
    unnamed_start_ms: int | None = None  # an unnamed interval from workload.running is open
    deferred: tuple[dict[str, Any], ...] = ()  # pod.running payloads waiting for the flavor (+ event id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "flavor": self.flavor,
            "reserved": list(self.reserved),
            "podLevel": self.pod_level,
            "unnamedStartMs": self.unnamed_start_ms,
            "deferred": list(self.deferred),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkloadMemo:
        return cls(
            flavor=data["flavor"],
            reserved=tuple(data["reserved"]),  # type: ignore[arg-type]
            pod_level=data["podLevel"],
            unnamed_start_ms=data["unnamedStartMs"],
            deferred=tuple(data["deferred"]),
        )


@quick_init
@dataclass(frozen=True, slots=True)
class Translation:
    events: tuple[CostEvent, ...]
    memo: WorkloadMemo | None  # the workload's new memo (None: the event is not about a workload)


def at_ms(text: str) -> int:
    """ISO-8601 UTC → epoch milliseconds (the core's time unit)."""
    moment = parse_utc(text)
    return int(moment.timestamp()) * 1000 + moment.microsecond // 1000


def workload_uid_of(envelope: Envelope) -> str | None:
    payload = envelope.payload
    if isinstance(payload, (PodRunning, PodFinished)):
        return payload.workload_uid
    if envelope.event_type.startswith("workload."):
        return payload.uid
    return None


def _amounts(resources: Mapping[str, Any] | None) -> ResourceAmounts:
    resources = resources or {}
    return ResourceAmounts(
        gpu_milli=int(resources.get(GPU, 0)),
        cpu_milli=int(resources.get("cpu", 0)),
        memory_milli=int(resources.get("memory", 0)),
    )


def _gpu_flavor(usage: Mapping[str, Mapping[str, int]]) -> str | None:
    if not usage:
        return None
    # a flavor that holds only Kueue's pod count bills nothing: it is not the one to price by
    billed = [flavor for flavor, resources in usage.items() if set(resources) - {PODS}] or list(usage)
    return min(billed, key=lambda flavor: (-int(usage[flavor].get(GPU, 0)), flavor))


def _pod_running(event_id: str, pod: Mapping[str, Any], flavor: str) -> PodsRunning:
    return PodsRunning(
        event_id=event_id,
        workload_uid=pod["workload_uid"],
        namespace=pod["namespace"],
        flavor=flavor,
        resources=_amounts(pod.get("requests")),
        at_ms=at_ms(pod["started_at"]),
        pod_name=pod["uid"],
        workload_name=pod.get("workload_name") or "",
    )


def _pod_level(memo: WorkloadMemo, first_pod_event_id: str, uid: str) -> tuple[list[CostEvent], WorkloadMemo]:
    """Switch a workload to pod-level accounting: close its unnamed interval at its start."""
    events: list[CostEvent] = []
    if memo.unnamed_start_ms is not None:
        events.append(PodsStopped(f"{first_pod_event_id}:supersedes", uid, memo.unnamed_start_ms, ""))
    return events, replace(memo, pod_level=True, unnamed_start_ms=None)


def translate(envelope: Envelope, memo: WorkloadMemo | None = None) -> Translation:
    """The core events for one envelope, given the workload's memo (None when unknown)."""
    payload = envelope.payload
    memo = memo or WorkloadMemo()
    eid = envelope.event_id

    if isinstance(payload, ClockTickRecord):
        return Translation((ClockTick(eid, at_ms(payload.at)),), None)
    if isinstance(payload, NamespaceLabels):
        labels = () if payload.deleted else tuple(sorted(payload.labels.items()))
        return Translation((NamespaceLabeled(eid, payload.namespace, labels, at_ms(envelope.occurred_at)),), None)

    if isinstance(payload, WorkloadQuotaReserved):
        flavor = _gpu_flavor(payload.usage)
        if flavor is None:
            return Translation((), memo)
        amounts = _amounts(payload.usage[flavor])
        events: list[CostEvent] = [
            ReservationStarted(
                eid,
                payload.uid,
                payload.namespace,
                flavor,
                amounts,
                at_ms(payload.reserved_at),
                payload.name,
            )
        ]
        deferred = memo.deferred
        memo = replace(
            memo, flavor=flavor, reserved=(amounts.gpu_milli, amounts.cpu_milli, amounts.memory_milli), deferred=()
        )
        for pending in deferred:  # pods seen before their reservation, in arrival order
            events.append(_pod_running(pending["event_id"], pending, flavor))
        return Translation(tuple(events), memo)

    if isinstance(payload, PodRunning):
        uid = payload.workload_uid
        events = []
        if not memo.pod_level:
            events, memo = _pod_level(memo, eid, uid)
        if memo.flavor is None:
            record = {
                "event_id": eid,
                "uid": payload.uid,
                "workload_uid": uid,
                "namespace": payload.namespace,
                "started_at": payload.started_at,
                "requests": dict(payload.requests or {}),
                "workload_name": payload.workload_name,
            }
            return Translation(tuple(events), replace(memo, deferred=(*memo.deferred, record)))
        pod = {
            "uid": payload.uid,
            "workload_uid": uid,
            "namespace": payload.namespace,
            "started_at": payload.started_at,
            "requests": payload.requests,
            "workload_name": payload.workload_name,
        }
        events.append(_pod_running(eid, pod, memo.flavor))
        return Translation(tuple(events), memo)

    if isinstance(payload, PodFinished):
        return Translation(
            (PodsStopped(eid, payload.workload_uid, at_ms(payload.finished_at), payload.uid),), memo
        )

    if isinstance(payload, WorkloadRunning):
        if memo.pod_level or memo.flavor is None:
            return Translation((), memo)  # pods are counted one by one / nothing known to count
        gpu, cpu, memory = memo.reserved
        start = at_ms(payload.started_at)
        event = PodsRunning(
            eid,
            payload.uid,
            payload.namespace,
            memo.flavor,
            ResourceAmounts(gpu, cpu, memory),
            start,
            "",
            payload.name,
        )
        return Translation((event,), replace(memo, unnamed_start_ms=start))

    if isinstance(payload, WorkloadPrefreezeExpired):
        return Translation((PreFreezeExpired(eid, payload.uid, at_ms(payload.expired_at)),), memo)
    if isinstance(payload, WorkloadReleased):
        return Translation((Released(eid, payload.uid, at_ms(payload.released_at)),), memo)
    if isinstance(payload, WorkloadEvicted):
        return Translation((Evicted(eid, payload.uid, at_ms(payload.evicted_at)),), memo)
    if isinstance(payload, WorkloadFinished):
        return Translation((Finished(eid, payload.uid, at_ms(payload.finished_at)),), memo)
    return Translation((), None)

