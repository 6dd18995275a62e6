"""Pure parts of the simulator: trace pods → simulated workloads, their events, and time.

* **Time.** Simulated time starts at :data:`SIM_EPOCH` (2026-11-29T09:00:00Z) for the trace
  offset ``start_s``: sim time = epoch + (trace offset − start_s). :class:`Compression` maps
  sim seconds to wall seconds (``speed`` sim seconds per wall second).
* **Workloads.** One trace pod = one Job workload of one pod set (``count`` 1, requests
  ``nvidia.com/gpu`` = num_gpu × gpu_milli, ``cpu`` milli, ``memory`` bytes × 1000), uid a
  uuid5 of the pod name, name the pod name, in the pod's team namespace, queued in the
  namespace's LocalQueue. Labels: the queue name, ``quartermaster.dev/class`` (training |
  inference | batch, from the QoS) and the cost center. Priority: inference 1000, training 500,
  batch 100.
* **Run time.** A pod that ran in the trace runs ``deletion − scheduled`` seconds once
  admitted (the remainder after an eviction: checkpoints are assumed). A pod that never ran
  in the trace is deleted by its owner at its deletion time, wherever it is by then.
* **Ids.** Every event id derives from identity tuples (make_envelope), so two runs of the
  same trace with the same admissions produce the same ids.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Final

from services.contracts.codec import Envelope, make_envelope, utc_iso
from services.contracts.events import (
    ClockTick,
    NamespaceLabels,
    NodeCapacity,
    PodFinished,
    PodRunning,
    WorkloadFinished,
    WorkloadSubmitted,
)
from services.sim.config import (
    CPU_FLAVOR,
    GPU_CLASS_LABEL,
    MIB_MILLI,
    QUEUE_LABEL,
    cluster_queue_name,
    local_queue_name,
)
from services.trace.alibaba import COST_CENTER_LABEL, TEAM_COST_CENTERS, TraceNode, TracePod, trace_end_s

__all__ = [
    "CLASS_LABEL",
    "PRODUCER",
    "SIM_EPOCH",
    "Compression",
    "SimWorkload",
    "at_iso",
    "namespace_events",
    "node_events",
    "pod_finished",
    "pod_running",
    "pod_uid",
    "submitted_event",
    "tick_event",
    "workload_finished",
    "workloads_from_trace",
]

PRODUCER: Final = "cluster-sim"
CLOCK_SOURCE: Final = "cluster-sim"
SIM_EPOCH: Final = datetime(2026, 11, 29, 9, 0, 0, tzinfo=UTC)
CLASS_LABEL: Final = "quartermaster.dev/class"
PRIORITY: Final = {"inference": 1000, "training": 500, "batch": 100}
_UID_NS: Final = uuid.UUID("6f1b0d3e-5a57-4c2e-9b8e-7175617274e1")


def at_iso(sim_s: float) -> str:
    """Sim seconds since the epoch → the bus's UTC timestamp (whole milliseconds), as
    `utc_iso` writes it. Every simulated event has several: the second's text is made once
    (through datetime it was ~9% of the Kueue runner's CPU)."""
    whole, milli = divmod(round(sim_s * 1000), 1000)
    second = _SECONDS.get(whole)
    if second is None:
        if len(_SECONDS) > 100_000:
            _SECONDS.clear()
        second = _SECONDS[whole] = utc_iso(SIM_EPOCH + timedelta(seconds=whole))[:-1]
    return f"{second}.{milli * 1000:06d}Z" if milli else f"{second}Z"


_SECONDS: dict[int, str] = {}  # whole sim second -> its text without the Z


@dataclass(frozen=True, slots=True)
class Compression:
    """Sim time ↔ wall time: ``speed`` simulated seconds per wall second, from ``wall0``."""

    speed: float
    wall0: float
    sim0: float = 0.0

    def wall_for(self, sim_s: float) -> float:
        return self.wall0 + (sim_s - self.sim0) / self.speed

    def sim_at(self, wall: float) -> float:
        return self.sim0 + (wall - self.wall0) * self.speed


@dataclass(frozen=True, slots=True)
class SimWorkload:
    uid: str
    namespace: str
    name: str
    queue_name: str
    cluster_queue: str
    workload_class: str
    requests: dict  # resource -> milli-units (read-only)
    submit_s: float  # sim seconds since the epoch
    run_s: float | None  # how long it runs once admitted; None: never ran in the trace
    deadline_s: float | None  # the owner deletes it then (pods that never ran)
    succeeds: bool
    priority: int
    cost_center: str
    gpu_models: tuple[str, ...] = ()
    trace_pod: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def gpu_milli(self) -> int:
        return self.requests.get("nvidia.com/gpu", 0)


def workload_uid(pod_name: str) -> str:
    return str(uuid.uuid5(_UID_NS, pod_name))


@lru_cache(maxsize=1 << 16)  # asked for at a pod's start and again at its end; uuid5 was 5% of the runner
def pod_uid(workload_uid_: str, attempt: int) -> str:
    return str(uuid.uuid5(_UID_NS, f"{workload_uid_}/pod/{attempt}"))


def workloads_from_trace(
    pods: Sequence[TracePod], *, start_s: int = 0, duration_s: float | None = None
) -> list[SimWorkload]:
    """The pods created in ``[start_s, start_s + duration_s)`` as simulated workloads, by
    submission time (ties by name). Pods without a creation time are skipped."""
    end = trace_end_s(pods)
    out: list[SimWorkload] = []
    for pod in pods:
        if pod.creation_s is None or pod.creation_s < start_s:
            continue
        submit = float(pod.creation_s - start_s)
        if duration_s is not None and submit >= duration_s:
            continue
        window = pod.run_window_s(end)
        if window is None:
            run_s, deadline = None, float(max(pod.deletion_s if pod.deletion_s is not None else end, pod.creation_s) - start_s)
        else:
            run_s, deadline = float(window[1] - window[0]), None
        requests = {"cpu": pod.cpu_milli, "memory": pod.memory_mib * MIB_MILLI}
        if pod.gpu_milli_total > 0:
            requests["nvidia.com/gpu"] = pod.gpu_milli_total
        cls = str(pod.workload_class)
        out.append(
            SimWorkload(
                uid=workload_uid(pod.name),
                namespace=pod.namespace,
                name=pod.name,
                queue_name=local_queue_name(pod.namespace),
                cluster_queue=cluster_queue_name(pod.namespace),
                workload_class=cls,
                requests=requests,
                submit_s=submit,
                run_s=run_s,
                deadline_s=deadline,
                succeeds=pod.phase != "Failed",
                priority=PRIORITY.get(cls, 100),
                cost_center=TEAM_COST_CENTERS.get(pod.namespace, f"cc-{pod.namespace}"),
                gpu_models=pod.gpu_models,
                trace_pod=pod.name,
            )
        )
    out.sort(key=lambda w: (w.submit_s, w.name))
    return out


def _env(payload, sim_s: float, identity: tuple, cause: Envelope | None = None) -> Envelope:
    return make_envelope(payload, producer=PRODUCER, occurred_at=at_iso(sim_s), identity=identity, cause=cause)


def submitted_event(w: SimWorkload) -> Envelope:
    labels = {QUEUE_LABEL: w.queue_name, CLASS_LABEL: w.workload_class, COST_CENTER_LABEL: w.cost_center}
    annotations = {"quartermaster.dev/trace-pod": w.trace_pod}
    if w.gpu_models:
        annotations["quartermaster.dev/gpu-models"] = "|".join(w.gpu_models)
    record = WorkloadSubmitted(
        uid=w.uid,
        namespace=w.namespace,
        name=w.name,
        kind="Job",
        queue_name=w.queue_name,
        priority=w.priority,
        pod_sets=[{"name": "main", "count": 1, "requests": dict(w.requests)}],
        labels=labels,
        annotations=annotations,
        created_at=at_iso(w.submit_s),
    )
    return _env(record, w.submit_s, (w.uid, "submitted"))


def namespace_events(namespaces: Sequence[str], sim_s: float = 0.0) -> list[Envelope]:
    return [
        _env(
            NamespaceLabels(
                namespace=ns,
                labels={
                    "kubernetes.io/metadata.name": ns,
                    COST_CENTER_LABEL: TEAM_COST_CENTERS.get(ns, f"cc-{ns}"),
                    "quartermaster.dev/team": ns,
                },
            ),
            sim_s,
            (ns, "labels"),
        )
        for ns in namespaces
    ]


def node_events(nodes: Sequence[TraceNode], sim_s: float = 0.0) -> list[Envelope]:
    out = []
    for node in nodes:
        allocatable = {"cpu": node.cpu_milli, "memory": node.memory_mib * MIB_MILLI}
        labels = {"kubernetes.io/hostname": node.name}
        flavor = CPU_FLAVOR
        if node.gpu_count and node.gpu_model:
            allocatable["nvidia.com/gpu"] = node.gpu_count * 1000
            labels[GPU_CLASS_LABEL] = node.gpu_model.lower()
            flavor = node.flavor
        out.append(
            _env(
                NodeCapacity(node=node.name, allocatable=allocatable, capacity=dict(allocatable), flavor=flavor,
                             labels=labels),
                sim_s,
                (node.name, "capacity"),
            )
        )
    return out


def node_for(w: SimWorkload, flavors: dict | None, nodes_by_flavor: dict[str, list[str]]) -> str:
    """A deterministic node of the admitted GPU flavor (or any node)."""
    flavor = None
    for by_res in (flavors or {}).values():
        flavor = by_res.get("nvidia.com/gpu") or flavor or by_res.get("cpu")
    candidates = nodes_by_flavor.get(flavor or "", []) or [n for names in nodes_by_flavor.values() for n in names]
    if not candidates:
        return f"sim-node-{flavor or 'any'}"
    return candidates[zlib.crc32(w.uid.encode()) % len(candidates)]


def pod_running(w: SimWorkload, attempt: int, sim_s: float, node: str, cause: Envelope | None = None) -> Envelope:
    uid = pod_uid(w.uid, attempt)
    record = PodRunning(
        uid=uid, workload_uid=w.uid, namespace=w.namespace, name=f"{w.name}-{attempt}", started_at=at_iso(sim_s),
        node=node, requests=dict(w.requests), queue_name=w.queue_name, workload_name=w.name,
    )
    return _env(record, sim_s, (uid, "running"), cause)


def pod_finished(w: SimWorkload, attempt: int, sim_s: float, phase: str, node: str | None,
                 cause: Envelope | None = None) -> Envelope:
    uid = pod_uid(w.uid, attempt)
    record = PodFinished(
        uid=uid, workload_uid=w.uid, namespace=w.namespace, name=f"{w.name}-{attempt}", phase=phase,
        finished_at=at_iso(sim_s), node=node, queue_name=w.queue_name, workload_name=w.name,
    )
    return _env(record, sim_s, (uid, "finished"), cause)


def workload_finished(w: SimWorkload, sim_s: float, succeeded: bool, cause: Envelope | None = None) -> Envelope:
    record = WorkloadFinished(
        uid=w.uid, namespace=w.namespace, name=w.name, succeeded=succeeded, finished_at=at_iso(sim_s),
        cluster_queue=w.cluster_queue, queue_name=w.queue_name,
    )
    return _env(record, sim_s, (w.uid, "finished"), cause)


def tick_event(sim_s: float) -> Envelope:
    at = at_iso(sim_s)
    return _env(ClockTick(at=at, source=CLOCK_SOURCE), sim_s, (CLOCK_SOURCE, at))
