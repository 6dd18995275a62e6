"""Kueue's own scalability scenarios on the simulator, and a runner that answers like Kueue's.

Kueue holds its scheduler to ``test/performance/scheduler/configs/<name>/generator.yaml``
(kubernetes-sigs/kueue). This module expresses those scenarios in the simulator's terms, so
the same numbers can be measured on Quartermaster's full stack (``bench/bench_kueue.py``):

* **Objects.** One ResourceFlavor ``rf`` (no node labels, as the generator's default); per
  cohort ``cohort-<c>`` and queue ``<q>`` a ClusterQueue ``cq-<c>-<q>`` covering ``cpu`` with
  the scenario's nominal quota and borrowing limit and its preemption settings
  (``reclaimWithinCohort``, ``withinClusterQueue``), a namespace of the same name and a
  LocalQueue of the same name in it (the generator's naming).
* **Workloads.** Per ClusterQueue and workload set, ``count`` workloads, the k-th (from 0)
  created ``(k + 1) * creationIntervalMs`` after the start (the generator sleeps before each
  create), one pod requesting ``cpu`` cores, its ``runtimeMs`` and ``priority``. The sets of a
  queue, and all queues, are generated concurrently, as in the generator.
* **Preemption policy.** Plain Kueue: no Quartermaster class rule, grace period, minimum
  runtime or cap stands in the way, so Kueue's ClusterQueue settings alone decide who gives way.
* **Runner.** :class:`WallClockRunner` answers ``qm.actions`` as Kueue's runner
  (``test/performance/scheduler/runner/controller``) does: a pod starts the moment the
  admission is seen and finishes its run time of *wall clock* later; an evicted workload
  loses its progress and runs its whole run time again when readmitted.

``scale`` (0 < scale <= 1) keeps the queues and shrinks every set's count (at least one), so
a quick run has the same shape, fewer workloads and a shorter arrival window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from services.contracts.codec import Envelope, encode, parse_utc
from services.contracts.events import ActionAdmit
from services.sim.runner import Simulator, _Item
from services.sim.workloads import SIM_EPOCH, SimWorkload, at_iso, submitted_event

__all__ = [
    "BASELINE",
    "DIAGNOSTIC",
    "FLAVOR",
    "LARGE_SCALE",
    "SCENARIOS",
    "SMALLS_PHASE",
    "KueueScenario",
    "WallClockRunner",
    "WorkloadSet",
    "kueue_objects",
    "preemption_policy",
    "scenario_workloads",
]

V1BETA1: Final = "kueue.x-k8s.io/v1beta1"
FLAVOR: Final = "rf"  # the generator's default ResourceFlavor name
_UID_NS: Final = uuid.UUID("0c7f3a52-9f0e-4a55-8d1e-6b75657565e1")


@dataclass(frozen=True, slots=True)
class WorkloadSet:
    """One ``workloadsSets`` entry with its single workload template."""

    class_name: str
    count: int
    creation_interval_ms: int
    runtime_ms: int
    priority: int
    cpu: int  # cores requested by the one pod


@dataclass(frozen=True, slots=True)
class KueueScenario:
    name: str
    cohorts: int
    queues_per_cohort: int
    nominal_cpu: int
    borrowing_limit_cpu: int
    sets: tuple[WorkloadSet, ...]
    reclaim_within_cohort: str = "Any"
    within_cluster_queue: str = "LowerPriority"

    def scaled(self, scale: float) -> KueueScenario:
        """The same queues with every set's count times ``scale`` (rounded, at least one)."""
        if not 0 < scale <= 1:
            raise ValueError(f"scale must be in (0, 1], got {scale}")
        sets = tuple(dataclasses.replace(s, count=max(1, round(s.count * scale))) for s in self.sets)
        return dataclasses.replace(self, sets=sets)

    @property
    def cluster_queues(self) -> list[tuple[str, str]]:
        """(ClusterQueue, cohort) pairs; the ClusterQueue's name is also its namespace and LocalQueue."""
        return [(f"cq-{c}-{q}", f"cohort-{c}") for c in range(self.cohorts) for q in range(self.queues_per_cohort)]

    @property
    def workloads_per_queue(self) -> int:
        return sum(s.count for s in self.sets)

    @property
    def total_workloads(self) -> int:
        return self.workloads_per_queue * self.cohorts * self.queues_per_cohort

    @property
    def arrival_window_s(self) -> float:
        """When the last workload is created."""
        return max(s.count * s.creation_interval_ms for s in self.sets) / 1000

    @property
    def demand_cpu_s_per_queue(self) -> float:
        return sum(s.count * s.cpu * s.runtime_ms for s in self.sets) / 1000

    @property
    def ideal_s(self) -> float:
        """Wall time at perfect packing: every queue's demand on its own nominal quota, or the
        arrival window, whichever is longer (every queue has the same demand)."""
        return max(self.demand_cpu_s_per_queue / self.nominal_cpu, self.arrival_window_s)


BASELINE: Final = KueueScenario(
    "kueue-baseline", cohorts=5, queues_per_cohort=6, nominal_cpu=20, borrowing_limit_cpu=100,
    sets=(
        WorkloadSet("small", 350, 100, 200, 50, 1),
        WorkloadSet("medium", 100, 500, 500, 100, 5),
        WorkloadSet("large", 50, 1200, 1000, 200, 20),
    ),
)
LARGE_SCALE: Final = KueueScenario(
    "kueue-large-scale", cohorts=10, queues_per_cohort=100, nominal_cpu=20, borrowing_limit_cpu=100,
    sets=(
        WorkloadSet("small", 35, 60, 150, 50, 1),
        WorkloadSet("medium", 11, 300, 350, 100, 5),
        WorkloadSet("large", 4, 700, 700, 200, 20),
    ),
)
SCENARIOS: Final = {s.name: s for s in (BASELINE, LARGE_SCALE)}
# Not Kueue's: kueue-baseline's last phase alone, in ~40 s. On each queue one 20-cpu workload of
# priority 200 holds the whole quota for 25 s while the queue's 350 smalls arrive (1 ms apart) and
# are judged; then the smalls run with nothing else, as after baseline's last medium. It also
# checks that the 20-cpu workloads are admitted at once over the arriving smalls (ADR 0039).
SMALLS_PHASE: Final = KueueScenario(
    "smalls-phase", cohorts=5, queues_per_cohort=6, nominal_cpu=20, borrowing_limit_cpu=100,
    sets=(
        WorkloadSet("small", 350, 1, 200, 50, 1),
        WorkloadSet("large", 1, 1, 25_000, 200, 20),
    ),
)
DIAGNOSTIC: Final = {SMALLS_PHASE.name: SMALLS_PHASE}


def kueue_objects(scenario: KueueScenario) -> list[dict[str, Any]]:
    """The ResourceFlavor, ClusterQueues and LocalQueues (plain dicts, ready for YAML)."""
    objects: list[dict[str, Any]] = [
        {"apiVersion": V1BETA1, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}, "spec": {}}
    ]
    for cq, cohort in scenario.cluster_queues:
        objects.append({
            "apiVersion": V1BETA1, "kind": "ClusterQueue", "metadata": {"name": cq},
            "spec": {
                "cohort": cohort, "namespaceSelector": {},
                "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [{"name": FLAVOR, "resources": [
                    {"name": "cpu", "nominalQuota": scenario.nominal_cpu,
                     "borrowingLimit": scenario.borrowing_limit_cpu}]}]}],
                "preemption": {"reclaimWithinCohort": scenario.reclaim_within_cohort,
                               "withinClusterQueue": scenario.within_cluster_queue},
            },
        })  # fmt: skip
        objects.append({"apiVersion": V1BETA1, "kind": "LocalQueue", "metadata": {"name": cq, "namespace": cq},
                        "spec": {"clusterQueue": cq}})  # fmt: skip
    return objects


def preemption_policy() -> dict[str, Any]:
    """A Quartermaster PreemptionPolicy that adds nothing to Kueue's own rules: one class,
    preemptible by any priority (Kueue's settings already say who may be), no grace period,
    no minimum runtime, no caps."""
    return {
        "apiVersion": "quartermaster.dev/v1alpha1", "kind": "PreemptionPolicy", "metadata": {"name": "plain-kueue"},
        "spec": {
            "replaceDefaultClasses": True, "defaultClass": "kueue", "preemptionBudgetPerHour": None,
            "classes": [{"name": "kueue", "preemptible": True, "mayPreempt": [{"class": "kueue", "priority": "Any"}],
                         "gracePeriod": "0s", "minRuntimeBeforePreemption": "0s",
                         "maxPreemptionsPerWorkload": None}],
        },
    }  # fmt: skip


def scenario_workloads(scenario: KueueScenario) -> list[SimWorkload]:
    """Every workload of the scenario, by creation time (ties by ClusterQueue and name)."""
    out = []
    for cq, _cohort in scenario.cluster_queues:
        for set_index, s in enumerate(scenario.sets):
            for k in range(s.count):
                name = f"{s.class_name}-{set_index}-{k}-0"  # the generator's naming
                out.append(SimWorkload(
                    uid=str(uuid.uuid5(_UID_NS, f"{scenario.name}/{cq}/{name}")), namespace=cq, name=name,
                    queue_name=cq, cluster_queue=cq, workload_class=s.class_name, requests={"cpu": s.cpu * 1000},
                    submit_s=(k + 1) * s.creation_interval_ms / 1000, run_s=s.runtime_ms / 1000, deadline_s=None,
                    succeeds=True, priority=s.priority, cost_center=f"cc-{cq}",
                ))  # fmt: skip
    out.sort(key=lambda w: (w.submit_s, w.cluster_queue, w.name))
    return out


class WallClockRunner(Simulator):
    """The simulator at speed 1 answering like Kueue's scalability runner (see the module doc).

    Event times of the answers are the wall clock (seconds since the start on the SIM_EPOCH
    scale), not the action's own event time, so a late admission is not run in the past.
    What it saw is kept for the figures: ``admitted_at`` (first admission seen, per uid),
    ``intervals`` ((uid, started, stopped) of every pod run), ``submit_lag_s`` (how late each
    submission left, behind its creation time), ``done`` (set once every workload has finished)."""

    def __init__(self, bootstrap: str, prefix: str, workloads: Sequence[SimWorkload], **options: Any) -> None:
        super().__init__(bootstrap, prefix, workloads, speed=1.0, start_delay_s=0.0, **options)
        # Encoding validates strictly (~30 us each): done before the clock starts, so a burst of
        # creations (large-scale: 50,000 in 3.3 s) leaves on time instead of seconds late.
        self._submissions = {w.uid: encode(submitted_event(w)) for w in workloads}
        self.admitted_at: dict[str, float] = {}
        self.intervals: list[tuple[str, float, float]] = []
        self.submit_lag_s: list[float] = []
        self.done = asyncio.Event()
        self._started: dict[str, float] = {}
        self._finished = 0

    def now_s(self) -> float:
        """Seconds since the run started (its sim time at speed 1)."""
        return self._clock.sim_at(time.monotonic()) if self._clock is not None else 0.0

    def on_action(self, envelope: Envelope) -> None:
        if self._clock is not None:
            now = self.now_s()
            if now > (parse_utc(envelope.occurred_at) - SIM_EPOCH).total_seconds():
                envelope = dataclasses.replace(envelope, occurred_at=at_iso(now))
            payload = envelope.payload
            if isinstance(payload, ActionAdmit) and payload.workload_uid in self.workloads:
                self.admitted_at.setdefault(payload.workload_uid, now)
        super().on_action(envelope)

    async def _handle(self, item: _Item) -> None:
        if item.kind == "submit":
            self.submit_lag_s.append(max(0.0, self.now_s() - item.sim_s))
            await self._submit(item)
            return
        st = self.workloads.get(item.uid)
        before = st.status if st is not None else None
        await super()._handle(item)
        if st is None or st.status == before:
            return
        if st.status == "running":
            self._started[item.uid] = item.sim_s
        elif before == "running":
            self.intervals.append((item.uid, self._started.pop(item.uid), item.sim_s))
        if item.kind == "evicted":
            st.remaining_s = st.w.run_s  # Kueue's runner restarts the clock on readmission
        if st.status == "done":
            self._finished += 1
            if self._finished == len(self.workloads):
                self.done.set()

    async def _submit(self, item: _Item) -> None:
        """The simulator's submission (Kueue workloads have no owner deadline), pre-encoded."""
        st = self.workloads[item.uid]
        st.status = "waiting"
        self.stats.submitted += 1
        assert self._bus is not None
        await self._bus.publish_raw("qm.cluster", item.uid.encode(), self._submissions[item.uid])
        self.stats.events_published += 1
