"""The simulated cluster applies qm.actions as Kubernetes would: an admit that arrives while an
eviction's grace period runs starts the workload again once the eviction is done."""

from __future__ import annotations

import asyncio

from services.contracts.codec import make_envelope
from services.contracts.events import ActionAdmit, ActionEvict
from services.sim.runner import Simulator
from services.sim.workloads import Compression, SimWorkload

W = SimWorkload(uid="u1", namespace="ml-team", name="w1", queue_name="team-ml", cluster_queue="gpu-queue",
                workload_class="training", requests={"nvidia.com/gpu": 1000}, submit_s=0.0, run_s=100.0,
                deadline_s=None, succeeds=True, priority=0, cost_center="cc")


class Bus:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def publish(self, topic: str, key: str, envelope) -> None:
        self.sent.append(envelope.event_type)


def action(payload, at: str, n: int):
    return make_envelope(payload, producer="queue-manager", occurred_at=at, identity=(n,))


async def drain(sim: Simulator, until_s: float = float("inf")) -> None:
    """Apply what is due by `until_s` (simulated seconds), in time order."""
    sim._heap.sort()
    while sim._heap and sim._heap[0].sim_s <= until_s:
        await sim._handle(sim._heap.pop(0))
        sim._heap.sort()


ADMIT = dict(workload_uid="u1", namespace="ml-team", name="w1", kind="Job")


def running_workload() -> Simulator:
    """A simulated cluster whose one workload was admitted at 10 s and runs."""
    sim = Simulator("unused", "", [W], speed=1.0, start_delay_s=0.0)
    sim._clock, sim._bus = Compression(speed=1.0, wall0=0.0), Bus()
    sim.workloads["u1"].status = "waiting"
    sim.on_action(action(ActionAdmit(**ADMIT), "2026-11-29T09:00:10Z", 1))
    asyncio.run(drain(sim, until_s=15))
    return sim


def test_an_admit_during_the_grace_period_starts_the_workload_once_evicted():
    sim = running_workload()
    assert sim.workloads["u1"].status == "running"

    sim.on_action(action(ActionEvict(**ADMIT, reason="Preempted", grace_period_s=30), "2026-11-29T09:00:20Z", 2))
    sim.on_action(action(ActionAdmit(**ADMIT), "2026-11-29T09:00:21Z", 3))  # requeued and readmitted at once
    assert sim.workloads["u1"].status == "running"  # still stopping: the admit waits for the eviction
    asyncio.run(drain(sim))
    st = sim.workloads["u1"]
    assert st.status == "done" and st.attempt == 2 and sim.stats.evicted == 1 and sim.stats.admitted == 2
    assert sim._bus.sent.count("pod.running.v1") == 2


def test_an_admit_that_overtakes_the_eviction_command_is_not_lost():
    sim = running_workload()
    # the readmission (queue-manager) arrives before the eviction (preemption service)
    sim.on_action(action(ActionAdmit(**ADMIT), "2026-11-29T09:00:21Z", 3))
    sim.on_action(action(ActionEvict(**ADMIT, reason="Preempted", grace_period_s=0), "2026-11-29T09:00:20Z", 2))
    asyncio.run(drain(sim))
    st = sim.workloads["u1"]
    assert st.status == "done" and st.attempt == 2 and sim._bus.sent.count("pod.running.v1") == 2


def quiet_cluster(status: str = "running") -> Simulator:
    """One workload, its finish due at 1,000 s, hourly-ish ticks every 100 s until then; the
    last event happened at wall 0."""
    sim = Simulator("unused", "", [W], speed=1.0, start_delay_s=0.0, skip_quiet_wall_s=0.25, tick_every_s=100.0)
    sim._clock, sim._bus = Compression(speed=1.0, wall0=0.0), Bus()
    sim.workloads["u1"].status = status
    sim._push("finish", 1000.0, uid="u1")
    for tick in range(100, 1101, 100):
        sim._push("tick", float(tick), extra_wall=2.0)
    sim._last_activity = 0.0
    return sim


def test_a_quiet_stretch_is_skipped_to_the_next_pod_event_with_the_ticks_before_it_due_at_once():
    sim = quiet_cluster()
    assert sim._skip_quiet_stretch(now=10.0)
    order = sorted(sim._heap)
    finish = next(item for item in order if item.kind == "finish")
    assert finish.due_wall == 10.0  # due now
    due_before = [item.sim_s for item in order if item.due_wall < finish.due_wall]
    assert due_before == [100.0 * n for n in range(1, 10)]  # the ticks before it, in time order
    assert [i.sim_s for i in order if i.kind == "tick" and i.due_wall > 10.0] == [1000.0, 1100.0]  # held back as ever
    assert sim._clock.sim_at(10.0) == 1000.0 and sim.stats.skips == 1 and sim.stats.skipped_wall_s == 990.0


def test_no_skip_while_a_decision_or_a_start_is_awaited_or_something_just_happened():
    for status in ("waiting", "starting", "suspended"):
        sim = quiet_cluster(status)
        assert not sim._skip_quiet_stretch(now=10.0), status
    sim = quiet_cluster()
    assert not sim._skip_quiet_stretch(now=0.2)  # quiet for less than 0.25 s
    sim = quiet_cluster()
    sim.skip_quiet_wall_s = None
    assert not sim._skip_quiet_stretch(now=10.0)  # off
    sim = quiet_cluster()
    sim._heap = [item for item in sim._heap if item.kind == "tick"]
    assert not sim._skip_quiet_stretch(now=10.0)  # only ticks left: they keep their pace
