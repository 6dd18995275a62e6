"""Trace lifecycle records → cost-accounting events (the replay input of ``services.core.cost``).

Each trace pod is one workload (uid = pod name) with one unnamed pod interval:
``running`` → :class:`PodsRunning` (GPU amount ``num_gpu * gpu_milli`` milli-GPUs, CPU, memory),
``finished``/``deleted`` → :class:`Finished`, ``tick`` → :class:`ClockTick`. ``submitted``
carries no cost. The trace has no quota reservations; with ``reserve=True`` a
:class:`ReservationStarted` of the same size is emitted at the start too (reserved-idle then
stays zero, which is what a replay of an always-immediately-running cluster should show).
The stream starts with one :class:`NamespaceLabeled` per team namespace (cost centers).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from services.core.cost.model import (
    ClockTick,
    CostEvent,
    Finished,
    NamespaceLabeled,
    PodsRunning,
    ReservationStarted,
    ResourceAmounts,
)
from services.trace.alibaba import COST_CENTER_LABEL, TEAM_COST_CENTERS, TraceEvent, TraceEventKind

__all__ = ["cost_events", "namespace_events"]


def namespace_events(at_ms: int, cost_centers: dict[str, str] = TEAM_COST_CENTERS) -> list[NamespaceLabeled]:
    return [
        NamespaceLabeled(f"namespace:{namespace}", namespace, ((COST_CENTER_LABEL, center),), at_ms)
        for namespace, center in cost_centers.items()
    ]


def cost_events(records: Iterable[TraceEvent], *, reserve: bool = False) -> Iterator[CostEvent]:
    first = True
    for record in records:
        if first:
            yield from namespace_events(record.at_ms)
            first = False
        kind = record.kind
        if kind is TraceEventKind.RUNNING:
            amounts = ResourceAmounts.from_mib(record.gpu_milli, record.cpu_milli, record.memory_mib)
            labels = (("quartermaster.dev/workload-class", record.workload_class),)
            if reserve:
                yield ReservationStarted(
                    f"{record.event_id}:reserved",
                    record.pod_name,
                    record.namespace,
                    record.flavor,
                    amounts,
                    record.at_ms,
                    record.pod_name,
                    labels,
                )
            yield PodsRunning(
                record.event_id,
                record.pod_name,
                record.namespace,
                record.flavor,
                amounts,
                record.at_ms,
                "",
                record.pod_name,
                labels,
            )
        elif kind is TraceEventKind.FINISHED or kind is TraceEventKind.DELETED:
            yield Finished(record.event_id, record.pod_name, record.at_ms)
        elif kind is TraceEventKind.TICK:
            yield ClockTick(record.event_id, record.at_ms)
