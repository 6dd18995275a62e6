"""Kueue's scalability scenarios in the simulator's terms (services/sim/kueue_scenarios.py):
their shape, their Kueue objects through the quota core, and the wall-clock runner's answers
(against a fake bus, no broker)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import yaml

from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import decode, encode, make_envelope
from services.contracts.events import ActionAdmit, ActionEvict
from services.core.preemption_policy import parse_policy
from services.core.quota import PodSet, Workload, WorkloadStatus, build_snapshot, drain, load_objects
from services.sim.kueue_scenarios import (
    BASELINE,
    LARGE_SCALE,
    WallClockRunner,
    kueue_objects,
    preemption_policy,
    scenario_workloads,
)
from services.sim.runner import _Item
from services.sim.workloads import Compression, at_iso


def test_the_scenarios_have_kueues_counts_and_ideal_times():
    assert BASELINE.total_workloads == 15_000 and LARGE_SCALE.total_workloads == 50_000
    assert BASELINE.ideal_s == 66.0  # 1,320 cpu-seconds per queue on 20 cpu
    assert BASELINE.arrival_window_s == 60.0 and LARGE_SCALE.arrival_window_s == 3.3
    quick = BASELINE.scaled(0.1)
    assert [s.count for s in quick.sets] == [35, 10, 5] and quick.cohorts == 5 and quick.queues_per_cohort == 6
    assert [s.count for s in LARGE_SCALE.scaled(0.01).sets] == [1, 1, 1]  # never an empty set
    with pytest.raises(ValueError):
        BASELINE.scaled(0)


def test_workloads_are_created_on_the_generators_schedule():
    ws = scenario_workloads(BASELINE.scaled(0.1))
    assert len(ws) == 50 * 30 and len({w.uid for w in ws}) == len(ws)
    assert [w.submit_s for w in ws] == sorted(w.submit_s for w in ws)
    one_queue = [w for w in ws if w.cluster_queue == "cq-2-3"]
    large = sorted(w.submit_s for w in one_queue if w.workload_class == "large")
    assert large == [1.2, 2.4, 3.6, 4.8, 6.0]  # the k-th after (k + 1) intervals
    small = next(w for w in one_queue if w.name == "small-0-0-0")
    assert (small.requests, small.run_s, small.priority, small.namespace) == ({"cpu": 1000}, 0.2, 50, "cq-2-3")
    assert Counter(w.workload_class for w in one_queue) == {"small": 35, "medium": 10, "large": 5}
    encode(make_envelope(ActionAdmit(workload_uid=small.uid, namespace="cq-2-3", name=small.name, kind="Job"),
                         producer="t", occurred_at=at_iso(1)))  # fmt: skip


def test_objects_route_by_cohort_and_borrow_up_to_the_limit():
    docs = list(yaml.safe_load_all(yaml.safe_dump_all(kueue_objects(BASELINE))))
    objects = load_objects([("gen", d) for d in docs])
    assert len(objects.cluster_queues) == 30
    assert KueueConfig.from_objects(objects).routing_key("cq-4-5", "cq-4-5") == "cohort:cohort-4"

    def large(i: int) -> Workload:
        return Workload(namespace="cq-0-0", name=f"large-{i}", queue_name="cq-0-0", priority=200,
                        pod_sets=(PodSet(name="main", count=1, requests=(("cpu", 20_000),)),), created_at=float(i),
                        uid=f"u{i}")  # fmt: skip

    # 20 nominal + 100 borrowed from the five idle queues of its cohort: six fit, the seventh waits
    result = drain(build_snapshot(objects, []), [large(i) for i in range(7)], 100.0)
    statuses = [d.status for d in sorted(result.decisions, key=lambda d: d.workload)]
    assert statuses.count(WorkloadStatus.ADMITTED) == 6 and len(statuses) == 7


def test_the_preemption_policy_adds_nothing_to_kueues_rules():
    policy = parse_policy(preemption_policy())
    cls = policy.class_of({"quartermaster.dev/class": "large"})
    assert (cls.name, cls.preemptible, cls.grace_period_s, cls.min_runtime_s, cls.max_preemptions) == (
        "kueue", True, 0, 0.0, None)
    assert policy.namespace_budget_per_hour is None and [c.name for c in policy.classes] == ["kueue"]


class FakeBus:
    """Stands in for the Publisher: keeps what would have been published."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, object]] = []

    async def publish(self, topic: str, key: str, envelope) -> None:
        self.sent.append((topic, key, envelope))

    async def publish_raw(self, topic: str, key: bytes, value: bytes, headers=None) -> None:
        self.sent.append((topic, key.decode(), decode(value)))


async def test_runner_starts_at_the_wall_clock_and_restarts_an_evicted_run():
    (w,) = [w for w in scenario_workloads(BASELINE.scaled(0.01)) if w.cluster_queue == "cq-0-0"
            and w.workload_class == "large"]  # fmt: skip
    runner = WallClockRunner("unused:9092", "t.", [w])
    runner._bus = FakeBus()
    runner._clock = Compression(1.0, time.monotonic() - 10.0)  # the run started ten seconds ago
    await runner._handle(_Item(0.0, w.submit_s, 0, "submit", w.uid))

    def action(payload, at_s: float):
        return make_envelope(payload, producer="queue-manager", occurred_at=at_iso(at_s), identity=(repr(payload), at_s))

    # An admission decided at 2 s but seen at 10 s runs from 10 s, for its whole second.
    runner.on_action(action(ActionAdmit(workload_uid=w.uid, namespace=w.namespace, name=w.name, kind="Job"), 2.0))
    assert runner.admitted_at[w.uid] == pytest.approx(10.0, abs=0.5)
    start = runner._heap[0]
    assert start.kind == "start" and start.sim_s == pytest.approx(10.0, abs=0.5)
    await runner._handle(start)
    runner.on_action(action(ActionEvict(workload_uid=w.uid, namespace=w.namespace, name=w.name, kind="Job",
                                        reason="Preempted", grace_period_s=0), 10.2))  # fmt: skip
    evicted = next(i for i in runner._heap if i.kind == "evicted")
    await runner._handle(evicted)
    assert runner.workloads[w.uid].status == "suspended" and runner.workloads[w.uid].remaining_s == 1.0
    assert [(u, round(b - a, 1)) for u, a, b in runner.intervals] == [(w.uid, round(evicted.sim_s - start.sim_s, 1))]

    runner.on_action(action(ActionAdmit(workload_uid=w.uid, namespace=w.namespace, name=w.name, kind="Job"), 11.0))
    restart = next(i for i in runner._heap if i.kind == "start" and i.attempt == 2)
    await runner._handle(restart)
    finish = next(i for i in runner._heap if i.kind == "finish" and i.attempt == 2)
    assert finish.sim_s == pytest.approx(restart.sim_s + 1.0)  # the whole run time again
    await runner._handle(finish)
    assert runner.done.is_set() and runner.stats.evicted == 1
    kinds = [e.event_type for _, _, e in runner._bus.sent]
    assert kinds == ["workload.submitted.v1", "pod.running.v1", "pod.finished.v1", "pod.running.v1",
                     "pod.finished.v1", "workload.finished.v1"]  # fmt: skip
