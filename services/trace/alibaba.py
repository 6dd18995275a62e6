"""The Alibaba GPU cluster trace (``cluster-trace-gpu-v2023``, "openb") → an ordered event stream.

Shared by the replay tests, the demo and the benchmarks. Reading is plain ``csv``; the output
is a list of frozen :class:`TraceEvent` records in event-time order, with times made absolute
by a ``base_epoch_s`` argument (trace times are seconds since the trace start).

Conventions (every consumer relies on them; change them only with an ADR):

* **GPU amount.** A pod uses ``num_gpu`` GPUs, each a ``gpu_milli/1000`` share, so its GPU
  amount is ``gpu_milli_total = num_gpu * gpu_milli`` milli-GPUs: 1 GPU at 460 milli is
  0.46 GPU (460), 8 GPUs at 1000 milli are 8 GPUs (8000). CPU is ``cpu_milli``, memory
  ``memory_mib``.
* **Namespace.** ``TEAM_NAMESPACES[crc32(pod name) % len(TEAM_NAMESPACES)]`` — stable across
  runs, machines and Python versions (not ``hash()``, which is salted). Each team namespace
  has the cost center ``TEAM_COST_CENTERS[ns]`` (label ``quartermaster.dev/cost-center``).
* **Workload class** from QoS: ``LS`` → inference, ``BE`` → batch, ``Burstable`` and
  ``Guaranteed`` → training (anything else → batch).
* **Flavor** from ``gpu_spec`` (``"V100M16|V100M32"`` lists the models a pod accepts): a pod
  without GPUs → ``cpu-flavor``; no constraint → ``gpu-flavor`` (any model); otherwise the
  first accepted model, ``<model lower-case>-flavor`` (``v100m16-flavor``). All accepted
  models are kept in ``gpu_models`` for a scheduler that wants to choose.
* **Lifecycle.** ``submitted`` at ``creation_time``; ``running`` at ``scheduled_time``;
  ``finished`` at ``deletion_time`` for a pod that ran, ``deleted`` for one that never ran.
  - ``scheduled_time`` empty → never ran (Pending pods). ``0`` counts as a real time only
    when ``creation_time`` is also 0 (``openb-pod-0000``), otherwise it means "not set".
    A scheduled time before creation is clamped to creation.
  - ``deletion_time`` empty → the pod lives to the end of the trace (``end_s`` if given,
    else the largest time in the file) and ends there: censored, like the trace's own
    still-Running pods whose deletion time is the trace end. A deletion before the
    scheduled (or creation) time is clamped to it (a zero-length run).
  - A file without time columns (``openb_pod_list_multigpu50.csv`` is a size-only sample)
    can be read with :func:`read_pods` but has no lifecycle: :func:`lifecycle_events`
    raises ``ValueError``.
* **Order.** By time; at equal times ticks first, then ends of pods that started earlier,
  then submissions, then starts, then ends of zero-length lifecycles; ties by pod name.
  Ticks (``tick_every_s``, default hourly) are aligned to multiples of the interval in
  epoch time — UTC hour boundaries for hourly ticks — and a last tick at or after the last
  event closes the final hour.
"""

from __future__ import annotations

import csv
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

__all__ = [
    "DEFAULT_BASE_EPOCH_S",
    "TEAM_COST_CENTERS",
    "TEAM_NAMESPACES",
    "TraceEvent",
    "TraceEventKind",
    "TraceNode",
    "TracePod",
    "WorkloadClass",
    "flavor_for",
    "lifecycle_events",
    "namespace_for",
    "read_nodes",
    "read_pods",
    "workload_class_for",
]

#: 2023-07-01T00:00:00Z — the default origin for trace time 0.
DEFAULT_BASE_EPOCH_S: Final = 1_688_169_600

TEAM_NAMESPACES: Final = (
    "ml-team",
    "nlp-research",
    "vision",
    "recsys",
    "speech",
    "search-ranking",
    "ads-ml",
    "platform",
)
TEAM_COST_CENTERS: Final = {namespace: f"cc-{namespace}" for namespace in TEAM_NAMESPACES}
COST_CENTER_LABEL: Final = "quartermaster.dev/cost-center"


class WorkloadClass(StrEnum):
    INFERENCE = "inference"
    BATCH = "batch"
    TRAINING = "training"


class TraceEventKind(StrEnum):
    TICK = "tick"
    SUBMITTED = "submitted"
    RUNNING = "running"
    FINISHED = "finished"  # ended after running (Succeeded, Failed, or censored at trace end)
    DELETED = "deleted"  # removed without ever running


_QOS_CLASS: Final = {
    "LS": WorkloadClass.INFERENCE,
    "BE": WorkloadClass.BATCH,
    "Burstable": WorkloadClass.TRAINING,
    "Guaranteed": WorkloadClass.TRAINING,
}


def namespace_for(pod_name: str, namespaces: Sequence[str] = TEAM_NAMESPACES) -> str:
    return namespaces[zlib.crc32(pod_name.encode()) % len(namespaces)]


def workload_class_for(qos: str) -> WorkloadClass:
    return _QOS_CLASS.get(qos, WorkloadClass.BATCH)


def flavor_for(num_gpu: int, gpu_models: Sequence[str]) -> str:
    if num_gpu == 0:
        return "cpu-flavor"
    if not gpu_models:
        return "gpu-flavor"
    return f"{gpu_models[0].lower()}-flavor"


@dataclass(frozen=True, slots=True)
class TracePod:
    """One row of an ``openb_pod_list_*.csv`` file; times in trace seconds, ``None`` when empty."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU, as in the trace
    gpu_models: tuple[str, ...] = ()
    qos: str = ""
    phase: str = ""
    creation_s: int | None = None
    deletion_s: int | None = None
    scheduled_s: int | None = None

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def namespace(self) -> str:
        return namespace_for(self.name)

    @property
    def workload_class(self) -> WorkloadClass:
        return workload_class_for(self.qos)

    @property
    def flavor(self) -> str:
        return flavor_for(self.num_gpu, self.gpu_models)

    @property
    def timed(self) -> bool:
        return self.creation_s is not None

    def run_window_s(self, end_s: int) -> tuple[int, int] | None:
        """``(start, end)`` trace seconds the pod ran, by the conventions above; ``None`` if never."""
        creation = self.creation_s or 0
        scheduled = self.scheduled_s
        if scheduled is None or (scheduled == 0 and creation > 0):
            return None
        start = max(scheduled, creation)
        end = self.deletion_s if self.deletion_s is not None else end_s
        return start, max(end, start)


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_model: str

    @property
    def flavor(self) -> str:
        return flavor_for(self.gpu_count, (self.gpu_model,) if self.gpu_model else ())


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One lifecycle step of one pod (or a clock tick, with empty pod fields)."""

    kind: TraceEventKind
    at_ms: int
    event_id: str
    offset_s: int  # trace time (seconds since the trace start)
    pod_name: str = ""
    namespace: str = ""
    workload_class: str = ""
    qos: str = ""
    flavor: str = ""
    gpu_models: tuple[str, ...] = ()
    num_gpu: int = 0
    gpu_milli: int = 0  # total milli-GPUs of the pod: num_gpu * per-GPU milli
    cpu_milli: int = 0
    memory_mib: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = str(self.kind)
        data["gpu_models"] = list(self.gpu_models)
        return data


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    return int(float(text)) if "." in text or "e" in text.lower() else int(text)


def read_pods(path: str | Path) -> list[TracePod]:
    """All pods of an ``openb_pod_list_*.csv`` file, in file order."""
    pods: list[TracePod] = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            spec = (row.get("gpu_spec") or "").strip()
            pods.append(
                TracePod(
                    name=row["name"],
                    cpu_milli=_int(row.get("cpu_milli")) or 0,
                    memory_mib=_int(row.get("memory_mib")) or 0,
                    num_gpu=_int(row.get("num_gpu")) or 0,
                    gpu_milli=_int(row.get("gpu_milli")) or 0,
                    gpu_models=tuple(model for model in spec.split("|") if model and model != "nan"),
                    qos=(row.get("qos") or "").strip(),
                    phase=(row.get("pod_phase") or "").strip(),
                    creation_s=_int(row.get("creation_time")),
                    deletion_s=_int(row.get("deletion_time")),
                    scheduled_s=_int(row.get("scheduled_time")),
                )
            )
    return pods


def read_nodes(path: str | Path) -> list[TraceNode]:
    """All nodes of an ``openb_node_list_*.csv`` file (``sn,cpu_milli,memory_mib,gpu,model``)."""
    with open(path, newline="") as handle:
        return [
            TraceNode(
                name=row["sn"],
                cpu_milli=_int(row.get("cpu_milli")) or 0,
                memory_mib=_int(row.get("memory_mib")) or 0,
                gpu_count=_int(row.get("gpu")) or 0,
                gpu_model=(row.get("model") or "").strip(),
            )
            for row in csv.DictReader(handle)
        ]


def trace_end_s(pods: Iterable[TracePod]) -> int:
    """The largest time in the pod list (the end of the observation window)."""
    end = 0
    for pod in pods:
        for value in (pod.creation_s, pod.scheduled_s, pod.deletion_s):
            if value is not None and value > end:
                end = value
    return end


_RANK_TICK, _RANK_END, _RANK_SUBMIT, _RANK_RUN, _RANK_LATE_END = 0, 1, 2, 3, 4


def lifecycle_events(
    pods: Sequence[TracePod],
    *,
    base_epoch_s: int = DEFAULT_BASE_EPOCH_S,
    tick_every_s: int = 3600,
    end_s: int | None = None,
) -> list[TraceEvent]:
    """The pods' lifecycles as one event-time-ordered list (see the module conventions)."""
    untimed = [pod.name for pod in pods if not pod.timed]
    if untimed:
        raise ValueError(
            f"{len(untimed)} pods have no creation_time (first: {untimed[0]}): a size-only pod list "
            "has no lifecycle; use read_pods() for its sizes"
        )
    horizon_s = end_s if end_s is not None else trace_end_s(pods)
    base_ms = base_epoch_s * 1000
    keyed: list[tuple[int, int, str, TraceEvent]] = []

    def add(kind: TraceEventKind, offset_s: int, rank: int, pod: TracePod) -> None:
        at_ms = base_ms + offset_s * 1000
        event = TraceEvent(
            kind=kind,
            at_ms=at_ms,
            event_id=f"trace:{pod.name}:{kind}",
            offset_s=offset_s,
            pod_name=pod.name,
            namespace=pod.namespace,
            workload_class=str(pod.workload_class),
            qos=pod.qos,
            flavor=pod.flavor,
            gpu_models=pod.gpu_models,
            num_gpu=pod.num_gpu,
            gpu_milli=pod.gpu_milli_total,
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
        )
        keyed.append((at_ms, rank, pod.name, event))

    for pod in pods:
        creation = pod.creation_s or 0
        add(TraceEventKind.SUBMITTED, creation, _RANK_SUBMIT, pod)
        window = pod.run_window_s(horizon_s)
        if window is None:
            deleted = pod.deletion_s if pod.deletion_s is not None else horizon_s
            deleted = max(deleted, creation)
            add(TraceEventKind.DELETED, deleted, _RANK_LATE_END if deleted == creation else _RANK_END, pod)
        else:
            start, end = window
            add(TraceEventKind.RUNNING, start, _RANK_RUN, pod)
            add(TraceEventKind.FINISHED, end, _RANK_LATE_END if end == start else _RANK_END, pod)
    keyed.sort(key=lambda item: item[:3])
    events = [item[3] for item in keyed]
    if tick_every_s > 0 and events:
        events = _with_ticks(events, tick_every_s * 1000, base_ms)
    return events


def _with_ticks(events: list[TraceEvent], every_ms: int, base_ms: int) -> list[TraceEvent]:
    merged: list[TraceEvent] = []
    next_tick = -(-events[0].at_ms // every_ms) * every_ms
    for event in events:
        while next_tick <= event.at_ms:
            merged.append(_tick(next_tick, base_ms))
            next_tick += every_ms
        merged.append(event)
    merged.append(_tick(next_tick, base_ms))  # closes the last period
    return merged


def _tick(at_ms: int, base_ms: int) -> TraceEvent:
    return TraceEvent(TraceEventKind.TICK, at_ms, f"tick:{at_ms}", (at_ms - base_ms) // 1000)
