"""The simulated cluster sends its facts as the watcher does (ADR 0075): with the services'
config, a workload's pod and workload facts go straight onto its cohort's stream, in one bundle
per cohort key and burst, as the records admission's fact lane would have made of them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.adapters.cohort_stream import FactRouter, cohort_stream_outputs
from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import decode, decode_all, make_envelope
from services.contracts.events import ActionAdmit
from services.sim.runner import Simulator, fact_router_for
from services.sim.workloads import (
    PRODUCER,
    Compression,
    SimWorkload,
    pod_finished,
    pod_running,
    workload_finished,
)

SEED = Path(__file__).resolve().parents[3] / "examples" / "seed"
IN_TEAM_ML = SimWorkload(uid="u1", namespace="ml-team", name="w1", queue_name="team-ml", cluster_queue="gpu-queue",
                         workload_class="training", requests={"nvidia.com/gpu": 1000}, submit_s=0.0, run_s=100.0,
                         deadline_s=None, succeeds=True, priority=0, cost_center="cc")
NOWHERE = SimWorkload(uid="u2", namespace="ml-team", name="w2", queue_name="no-such-queue", cluster_queue="no-such-cq",
                      workload_class="training", requests={"nvidia.com/gpu": 1000}, submit_s=0.0, run_s=100.0,
                      deadline_s=None, succeeds=True, priority=0, cost_center="cc")


class Bus:
    """What the simulator sent, per topic: (key, event types of the record)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, list]] = []

    async def publish(self, topic: str, key: str, envelope) -> None:
        self.records.append((topic, key, [envelope]))

    async def publish_raw(self, topic: str, key: bytes, value: bytes) -> None:
        self.records.append((topic, key.decode(), decode_all(value) if value.startswith(b"[") else [decode(value)]))

    def on(self, topic: str) -> list[tuple[str, list[str]]]:
        return [(key, [e.event_type for e in envelopes]) for t, key, envelopes in self.records if t == topic]


def run_to_the_end(sim: Simulator, *uids: str) -> Bus:
    """Admit each workload at 10 s and apply everything due, sending routed facts at 50 s (a
    burst boundary of the run loop) and at the end."""
    bus = Bus()
    sim._clock, sim._bus = Compression(speed=1.0, wall0=0.0), bus
    for n, uid in enumerate(uids):
        sim.workloads[uid].status = "waiting"
        admit = ActionAdmit(workload_uid=uid, namespace="ml-team", name=sim.workloads[uid].w.name, kind="Job")
        sim.on_action(make_envelope(admit, producer="queue-manager", occurred_at="2026-11-29T09:00:10Z",
                                    identity=(n,)))

    async def apply(until_s: float) -> None:
        sim._heap.sort()
        while sim._heap and sim._heap[0].sim_s <= until_s:
            await sim._handle(sim._heap.pop(0))
            sim._heap.sort()
        await sim._send_routed()

    asyncio.run(apply(50))
    asyncio.run(apply(float("inf")))
    return bus


def test_a_queued_workloads_facts_go_onto_its_cohorts_stream_not_qm_cluster():
    config = KueueConfig.load(SEED)
    sim = Simulator("unused", "", [IN_TEAM_ML], speed=1.0, start_delay_s=0.0, fact_router=fact_router_for(SEED))
    bus = run_to_the_end(sim, "u1")

    key = config.routing_key("ml-team", "team-ml")
    assert bus.on("qm.cluster") == []
    assert bus.on("qm.workloads") == [
        (key, ["pod.running.v1", "workload.running.v1"]),  # sent when the run loop waited (50 s)
        (key, ["pod.finished.v1", "workload.finished.v1"]),  # the finish's burst: one record
    ]
    # the very records admission's fact lane makes of the same facts (ids included), from the simulator
    w = IN_TEAM_ML
    sources = [pod_running(w, 1, 10.0, "", None), pod_finished(w, 1, 110.0, "Succeeded", None, None),
               workload_finished(w, 110.0, True, None)]
    expected = [o.envelope for source in sources for o in cohort_stream_outputs(source, config, PRODUCER)]
    sent = [e for topic, _, envelopes in bus.records if topic == "qm.workloads" for e in envelopes]
    assert [(e.event_id, e.producer) for e in sent] == [(e.event_id, PRODUCER) for e in expected]
    assert sim.stats.events_published == 3  # three facts, as before


def test_without_a_config_or_a_known_queue_the_facts_go_to_qm_cluster_as_before():
    unrouted = run_to_the_end(Simulator("unused", "", [IN_TEAM_ML], speed=1.0, start_delay_s=0.0), "u1")
    assert [types for _, types in unrouted.on("qm.cluster")] == [["pod.running.v1"], ["pod.finished.v1"],
                                                                  ["workload.finished.v1"]]
    assert unrouted.on("qm.workloads") == []

    router = FactRouter(KueueConfig.load(SEED), PRODUCER)
    unknown = run_to_the_end(Simulator("unused", "", [NOWHERE], speed=1.0, start_delay_s=0.0, fact_router=router),
                             "u2")
    assert len(unknown.on("qm.cluster")) == 3  # admission's fact lane stops such a Job (ADR 0065)
    assert unknown.on("qm.workloads") == []
