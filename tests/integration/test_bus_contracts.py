"""Every event type survives codec -> real Kafka -> codec unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path

import pytest

from services.adapters.bus import Publisher, read_envelopes
from services.adapters.live_replica import APPLIED, LiveReplica
from services.contracts.codec import decode, make_envelope
from services.contracts.events import NamespaceLabels, NodeCapacity

pytestmark = pytest.mark.kafka
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "schemas" / "examples" / "valid").glob("*.json"))


async def test_every_event_type_round_trips_through_kafka(kafka_bootstrap, topic_prefix):
    sent = [decode(p.read_bytes()) for p in EXAMPLES]
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        for envelope in sent:
            await bus.publish("qm.cluster", envelope.event_id, envelope)
        await bus.flush()
    received = [env async for _, env in read_envelopes(kafka_bootstrap, topic_prefix + "qm.cluster")]
    assert sorted(received, key=lambda e: e.event_id) == sorted(sent, key=lambda e: e.event_id)


async def test_a_replica_applies_only_its_types_and_outlives_unreadable_records(kafka_bootstrap, topic_prefix):
    """follow() passes over, unparsed, records that name none of its types; a record that names
    one but cannot be read is logged and skipped, and what follows it is still applied. The lazy
    replica (the cost service's) still catches up, and still sees what is published after."""
    sent = [decode(p.read_bytes()) for p in EXAMPLES]
    labels = [e for e in sent if isinstance(e.payload, NamespaceLabels)]
    nodes = [e for e in sent if isinstance(e.payload, NodeCapacity)]
    assert labels and nodes
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        await bus.publish_raw("qm.cluster", b"k", b'{"event_type": "namespace.labels.v1", "broken"')  # names it, unreadable
        await bus.publish_raw("qm.cluster", b"k", b"not json at all")
        for envelope in sent:
            await bus.publish("qm.cluster", "k", envelope)  # one partition: the order is kept
        await bus.flush()
    # What the replica must hold: its own types applied in order, nothing else.
    expected = LiveReplica(kafka_bootstrap, {})
    for envelope in sent:
        if envelope.event_type in APPLIED:
            expected.apply(envelope.payload)
    replica = LiveReplica(kafka_bootstrap, {"qm.cluster": topic_prefix + "qm.cluster"}, behind_by_ms=200)
    follower = asyncio.create_task(replica.run())
    try:
        await asyncio.wait_for(replica.caught_up.wait(), 30)
        held = ("namespaces", "usages", "budgets", "nodes")
        assert {name: getattr(replica, name) for name in held} == {name: getattr(expected, name) for name in held}
        assert replica.namespace(labels[0].payload.namespace) is not None and replica.nodes
        later = dataclasses.replace(labels[0].payload, namespace="arrived-later", labels={"team": "late"})
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            await bus.publish("qm.cluster", "k", make_envelope(later, producer="test", occurred_at=labels[0].occurred_at,
                                                               identity=("later",)))
            await bus.flush()
        for _ in range(100):
            if replica.namespace("arrived-later"):
                break
            await asyncio.sleep(0.05)
        assert replica.namespace("arrived-later")["metadata"]["labels"] == {"team": "late"}
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower


async def test_read_past_waits_for_what_came_before_a_record_on_another_partition(kafka_bootstrap, topic_prefix):
    """Admission reads a submission with one consumer and the namespaces with its replica's
    (ADR 0040). read_past() returns once everything appended before the submission is applied,
    here on a replica whose fetch waits two seconds for data, and a second question about a
    record the first one covered is answered at once."""
    from aiokafka import AIOKafkaProducer

    from services.contracts.codec import encode

    topic = topic_prefix + "qm.cluster"
    at = "2026-11-29T10:00:00Z"
    replica = LiveReplica(kafka_bootstrap, {"qm.cluster": topic}, behind_by_ms=2000)
    follower = asyncio.create_task(replica.run())
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await asyncio.wait_for(replica.caught_up.wait(), 30)
        fresh = make_envelope(NamespaceLabels(namespace="fresh-team", labels={"team": "fresh"}),
                              producer="test", occurred_at=at)
        await producer.send_and_wait(topic, key=b"namespace-uid", value=encode(fresh), partition=0)
        node = make_envelope(NodeCapacity(node="gpu-node-1", flavor="a100", allocatable={"nvidia.com/gpu": 8000}),
                             producer="test", occurred_at=at)
        later = await producer.send_and_wait(topic, key=b"another-uid", value=encode(node), partition=1)
        assert replica.namespace("fresh-team") is None  # the lazy fetch has not brought it yet
        assert await replica.read_past(later.topic, later.partition, later.offset, 30)
        assert replica.namespace("fresh-team") == {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fresh-team", "labels": {"team": "fresh"}}}
        assert await replica.read_past(later.topic, later.partition, later.offset, 0.001)
    finally:
        await producer.stop()
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
