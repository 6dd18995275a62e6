"""The services' librdkafka output producer keeps faust's producer contract on a real broker
(ADR 0054): `send` returns a future the broker's acknowledgement settles, a key lands on the
partition aiokafka's partitioner picks and keeps its order, a refused record fails its own
future naming where it was bound, and `close` says how many records it could not deliver."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from services.adapters.bus import KeyPartitioner, read_topic
from services.adapters.rdkafka_publisher import DeliveryFailed, OutputProducer
from services.contracts.schemas import topic_specs

pytestmark = pytest.mark.kafka


def producer(bootstrap: str) -> OutputProducer:
    return OutputProducer(bootstrap, client_id="output-test", linger_ms=0, max_record_bytes=1 << 20)


async def test_every_future_settles_once_acknowledged_and_keys_keep_their_partition_and_order(
        kafka_bootstrap, topic_prefix):
    topic = topic_prefix + "qm.workloads"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    partitions = topic_specs()["qm.workloads"].partitions
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    keys = [f"cohort-{k}".encode() for k in range(40)]
    outputs = producer(kafka_bootstrap)
    futures = [await outputs.send(topic, keys[n % len(keys)], str(n).encode(), None, None,
                                  [("n", str(n).encode())] if n % 2 else None) for n in range(2000)]
    assert not all(f.done() for f in futures), "a future settled before any acknowledgement could come"
    await asyncio.wait_for(asyncio.gather(*futures), 30)
    assert outputs.close(1.0) == 0

    where, every = KeyPartitioner(), list(range(partitions))
    order: dict[bytes, list[int]] = defaultdict(list)
    async for record in read_topic(kafka_bootstrap, topic):
        assert record.partition == where(record.key, every, every), record.key
        order[record.key].append(int(record.value))
    assert sum(map(len, order.values())) == 2000
    assert all(sent == sorted(sent) for sent in order.values())


async def test_a_record_the_broker_refuses_fails_its_own_future_naming_topic_and_partition(
        kafka_bootstrap, topic_prefix):
    tiny = topic_prefix + "tiny"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(tiny, 1, 1, topic_configs={"max.message.bytes": "1024"})])
    finally:
        await admin.close()
    await asyncio.sleep(0.5)  # the topic's metadata reaches the broker's cache
    outputs = producer(kafka_bootstrap)
    small = await outputs.send(tiny, b"k", b"x" * 100)
    await asyncio.wait_for(small, 30)  # its own batch: the broker refuses a batch whole
    large = await outputs.send(tiny, b"k", b"x" * 8192)
    with pytest.raises(DeliveryFailed, match=rf"{tiny}\[0\]: .*[Tt]oo large"):
        await asyncio.wait_for(large, 30)
    assert outputs.close(1.0) == 0
    assert [len(r.value) async for r in read_topic(kafka_bootstrap, tiny)] == [100]


async def test_partitions_and_timestamps_are_not_chosen_by_callers(kafka_bootstrap):
    outputs = producer(kafka_bootstrap)
    with pytest.raises(ValueError, match="partitions by key"):
        await outputs.send("t", b"k", b"v", 3, None)
    outputs.close(0)

