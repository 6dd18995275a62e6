"""What the fact lane makes of each qm.cluster record, without a broker: facts are routed, and
everything else is passed over (records that name no fact type before any parse)."""

import asyncio
import dataclasses
from types import SimpleNamespace

from services.admission.fact_lane import FactLane
from services.contracts.codec import encode
from services.sim.workloads import SimWorkload, pod_running, submitted_event

WORKLOAD = SimWorkload(uid="w-1", namespace="team-a", name="train", queue_name="lq-a", cluster_queue="cq-a",
                       workload_class="small", requests={"cpu": 1000}, submit_s=0.0, run_s=1.0,
                       deadline_s=None, succeeds=True, priority=50, cost_center="cc-a")


def lane_and_routed():
    routed = []

    def route(envelope):
        routed.append(envelope.event_type)
        return [envelope.event_type]

    async def never(*_):
        raise AssertionError("nothing here is sent or dead-lettered")

    lane = FactLane("127.0.0.1:1", "qm.cluster", "group", route=route, send=never, dead_letter=never)
    return lane, routed


def facts_of(value):
    lane, routed = lane_and_routed()
    return asyncio.run(lane._facts(SimpleNamespace(value=value))), routed


def test_a_pod_fact_is_routed():
    assert facts_of(encode(pod_running(WORKLOAD, 1, 0.5, "node-1"))) == (["pod.running.v1"], ["pod.running.v1"])


def test_a_submission_a_tombstone_and_unreadable_bytes_are_passed_over():
    assert facts_of(encode(submitted_event(WORKLOAD))) == ([], [])
    assert facts_of(None) == ([], [])
    assert facts_of(b"") == ([], [])
    assert facts_of(b"pod.running.v1 {not json") == ([], [])  # the faust agent dead-letters it


def test_a_record_that_only_mentions_a_fact_type_is_passed_over():
    named = dataclasses.replace(WORKLOAD, trace_pod="pod.running.v1")  # in an annotation
    value = encode(submitted_event(named))
    assert b"pod.running.v1" in value
    assert facts_of(value) == ([], [])
