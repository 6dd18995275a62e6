"""Admission's fact lane on the real broker (ADR 0026): where a partition starts, what it
passes over, and that it resumes at its own commits."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from services.adapters.bus import Publisher, read_topic
from services.adapters.runtime import Output
from services.admission.fact_lane import FactLane
from services.contracts.codec import encode, make_envelope
from services.contracts.events import PodRunning, WorkloadSubmitted
from tests.integration.test_worker_recovery import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
AT = "2026-11-29T10:00:00Z"


def pod_running(n: int):
    return make_envelope(PodRunning(uid=f"pod-{n}", workload_uid="uid-w", namespace="ml-team", name=f"w-{n}",
                                    queue_name="team-ml", workload_name="w", started_at=AT),
                         producer="test", occurred_at=AT)


def submission():
    return make_envelope(WorkloadSubmitted(uid="uid-w", namespace="ml-team", name="w", kind="Job",
                                           queue_name="team-ml", priority=0, labels={}, created_at=AT,
                                           pod_sets=[{"name": "main", "count": 1, "requests": {"cpu": 1000}}]),
                         producer="test", occurred_at=AT)


class Collected:
    """The lane's outputs as the broker would have acknowledged them (pod uids, in order), and
    what it dead-lettered (offset, error)."""

    def __init__(self) -> None:
        self.pods: list[str] = []
        self.dead: list[tuple[int, str]] = []

    async def send(self, outputs: list[Output]) -> None:
        self.pods += [o.envelope.payload.uid for o in outputs]

    async def dead_letter(self, record, error: str, kind: str) -> None:
        assert error.startswith(f"{kind}: ")
        self.dead.append((record.offset, error))


def route(envelope) -> list[Output]:
    return [Output("qm.workloads", "gpu-queue", envelope)]


async def committed(bootstrap: str, group: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items()}


async def run_until(lane: FactLane, collected: Collected, pods: int, what: str) -> None:
    task = asyncio.create_task(lane.run())
    try:
        async def forwarded():
            if task.done():
                task.result()  # a crashed lane fails the test with its own error
            return len(collected.pods) >= pods

        await wait_for(forwarded, 60, what)
        await asyncio.sleep(1.5)  # anything more would come within a fetch or two
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_new_lane_starts_at_the_beginning_or_where_the_takeover_group_stopped(kafka_bootstrap, topic_prefix):
    topic = topic_prefix + "qm.cluster"
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:  # one key: one partition, in this order
        for envelope in [pod_running(0), submission(), pod_running(1), pod_running(2), pod_running(3)]:
            await bus.publish("qm.cluster", "uid-w", envelope)
        await bus.publish_raw("qm.cluster", b"uid-w", b"{not json")
        broken = orjson.loads(encode(pod_running(9)))
        del broken["payload"]["started_at"]  # a fact's type, not a fact: the lane alone validates it
        await bus.publish_raw("qm.cluster", b"uid-w", orjson.dumps(broken))
        await bus.publish("qm.cluster", "uid-w", pod_running(4))
        await bus.flush()
    records = [r async for r in read_topic(kafka_bootstrap, topic)]
    partition = records[0].partition
    assert [r.offset for r in records] == list(range(8))

    # the group that forwarded before the lane existed had read up to pod-2 (offset 3)
    old_group = f"old-admission-{uuid.uuid4().hex[:8]}"
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=old_group, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, partition)])
        await consumer.commit({TopicPartition(topic, partition): 3})
    finally:
        await consumer.stop()

    group = f"lane-{uuid.uuid4().hex[:8]}"
    taking_over = Collected()
    await run_until(FactLane(kafka_bootstrap, topic, group, route, taking_over.send, taking_over.dead_letter, takeover_group=old_group),
                    taking_over, 3, "the lane to forward from the takeover group's offset")
    # the submission is not a fact, the record that is not JSON is the faust agent's to
    # dead-letter; the pod fact without its start time is the lane's
    assert taking_over.pods == ["pod-2", "pod-3", "pod-4"]
    assert [(offset, "started_at" in error) for offset, error in taking_over.dead] == [(6, True)]
    assert (await committed(kafka_bootstrap, group))[partition] == 8

    # restarted: it resumes at its own commit, and forwards only what came since
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        await bus.publish("qm.cluster", "uid-w", pod_running(5))
        await bus.flush()
    resumed = Collected()
    await run_until(FactLane(kafka_bootstrap, topic, group, route, resumed.send, resumed.dead_letter, takeover_group=old_group),
                    resumed, 1, "the restarted lane to forward the new fact")
    assert resumed.pods == ["pod-5"]

    # without a takeover group a new lane reads the partition from its beginning
    fresh = Collected()
    await run_until(FactLane(kafka_bootstrap, topic, f"lane-{uuid.uuid4().hex[:8]}", route, fresh.send, fresh.dead_letter),
                    fresh, 6, "a new lane to forward every fact")
    assert fresh.pods == ["pod-0", "pod-1", "pod-2", "pod-3", "pod-4", "pod-5"]


async def test_a_fact_the_lane_cannot_route_is_dead_lettered_and_the_lane_goes_on(kafka_bootstrap, topic_prefix):
    """As in the faust agents: a handler's unexpected exception costs that record, not the stream."""
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        for n in range(3):
            await bus.publish("qm.cluster", "uid-w", pod_running(n))
        await bus.flush()

    def picky_route(envelope) -> list[Output]:
        if envelope.payload.uid == "pod-1":
            raise RuntimeError("no route for pod-1")
        return route(envelope)

    collected = Collected()
    lane = FactLane(kafka_bootstrap, topic_prefix + "qm.cluster", f"lane-{uuid.uuid4().hex[:8]}", picky_route,
                    collected.send, collected.dead_letter)
    await run_until(lane, collected, 2, "the lane to forward the other two")
    assert collected.pods == ["pod-0", "pod-2"]
    assert [(offset, error) for offset, error in collected.dead] == [(1, "handler: RuntimeError: no route for pod-1")]


async def test_a_lane_commits_what_it_forwarded_before_its_partitions_move(kafka_bootstrap, topic_prefix, monkeypatch):
    """Commits are at most once per QM_FACT_LANE_COMMIT_S, and always before a revocation: a
    second replica joining takes over partitions without forwarding their facts again."""
    monkeypatch.setattr("services.admission.fact_lane.COMMIT_EVERY_S", 3600.0)  # only the revocation commits
    topic = topic_prefix + "qm.cluster"
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        for n in range(24):  # keys over every partition
            await bus.publish("qm.cluster", f"uid-{n}", pod_running(n))
        await bus.flush()
    group = f"lane-{uuid.uuid4().hex[:8]}"
    first, second = Collected(), Collected()
    lane_one = FactLane(kafka_bootstrap, topic, group, route, first.send, first.dead_letter)
    lane_two = FactLane(kafka_bootstrap, topic, group, route, second.send, second.dead_letter)
    one = asyncio.create_task(lane_one.run())
    two = None
    try:
        async def all_forwarded():
            return len(first.pods) >= 24

        await wait_for(all_forwarded, 60, "the first lane to forward every fact")
        assert await committed(kafka_bootstrap, group) == {}  # not due yet
        two = asyncio.create_task(lane_two.run())

        async def both_joined():
            return lane_two.joined.is_set() and bool(await committed(kafka_bootstrap, group))

        await wait_for(both_joined, 60, "the second lane to join and the first to commit on revocation")
        await asyncio.sleep(2)  # the second lane fetches from its partitions' commits
    finally:
        for task in (one, two):
            if task is not None:
                task.cancel()
        await asyncio.gather(one, *([two] if two else []), return_exceptions=True)
    assert sorted(first.pods) == sorted(f"pod-{n}" for n in range(24))
    assert second.pods == []  # its partitions' facts were committed by the first lane before they moved
