"""The simulated cluster's librdkafka publisher keeps Publisher's contract on a real broker
(ADR 0052): a key's partition is the one the services' producers pick, a key's records keep
their order, an envelope that breaks its contract never leaves, a refused record fails flush."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from services.adapters.bus import BrokerUnavailable, KeyPartitioner, read_topic
from services.adapters.rdkafka_publisher import DeliveryFailed, RdkafkaPublisher
from services.contracts.codec import ContractError, decode, make_envelope
from services.contracts.events import WorkloadSubmitted
from services.contracts.schemas import topic_specs

pytestmark = pytest.mark.kafka


def submitted(uid: str, n: int, priority=50) -> object:
    record = WorkloadSubmitted(uid=uid, namespace="team-a", name=f"job-{n}", kind="Job", queue_name="q",
                               priority=priority, pod_sets=[{"name": "main", "count": 1, "requests": {"cpu": 1000}}],
                               created_at="2026-12-05T10:00:00Z")  # fmt: skip
    return make_envelope(record, producer="test", occurred_at="2026-12-05T10:00:00Z", identity=(uid, n))


async def test_each_key_lands_on_the_services_partition_in_the_order_sent(kafka_bootstrap, topic_prefix):
    keys = [f"workload-{k}" for k in range(60)]
    async with RdkafkaPublisher(kafka_bootstrap, topic_prefix) as bus:
        for n in range(600):
            await bus.publish("qm.cluster", keys[n % len(keys)], submitted(keys[n % len(keys)], n))
        await bus.flush()  # acknowledged: everything is readable now

    partitions = list(range(topic_specs()["qm.cluster"].partitions))
    assert len(partitions) > 1, "one partition would prove nothing about the partitioner"
    where = KeyPartitioner()
    order: dict[str, list[int]] = defaultdict(list)
    async for record in read_topic(kafka_bootstrap, topic_prefix + "qm.cluster"):
        key = record.key.decode()
        assert record.partition == where(record.key, partitions, partitions), key
        order[key].append(int(decode(record.value).payload.name.removeprefix("job-")))
    assert sum(map(len, order.values())) == 600
    assert all(sent == sorted(sent) for sent in order.values())
    assert len({where(k.encode(), partitions, partitions) for k in keys}) > 1


async def test_an_envelope_that_breaks_its_contract_never_leaves(kafka_bootstrap, topic_prefix):
    async with RdkafkaPublisher(kafka_bootstrap, topic_prefix) as bus:
        with pytest.raises(ContractError, match="priority"):
            await bus.publish("qm.cluster", "w", submitted("w", 1, priority="high"))
        await bus.publish("qm.cluster", "w", submitted("w", 2))
    names = [decode(r.value).payload.name async for r in read_topic(kafka_bootstrap, topic_prefix + "qm.cluster")]
    assert names == ["job-2"]


async def test_a_record_the_broker_refuses_fails_flush_naming_its_topic(kafka_bootstrap, topic_prefix):
    tiny = topic_prefix + "tiny"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(tiny, 1, 1, topic_configs={"max.message.bytes": "1024"})])
    finally:
        await admin.close()
    await asyncio.sleep(0.5)  # the topic's metadata reaches the broker's cache
    async with RdkafkaPublisher(kafka_bootstrap) as bus:
        await bus.publish_raw(tiny, b"k", b"x" * 100)
        await bus.flush()  # its own batch: the broker refuses a batch whole
        await bus.publish_raw(tiny, b"k", b"x" * 8192)
        with pytest.raises(DeliveryFailed, match=rf"1 records not delivered: {tiny}\[0\]: .*[Tt]oo large"):
            await bus.flush()
        await bus.flush()  # said once; what was delivered stays delivered
    assert [len(r.value) async for r in read_topic(kafka_bootstrap, tiny)] == [100]


async def test_a_broker_that_does_not_answer_is_said_at_once_with_what_to_do(monkeypatch):
    monkeypatch.setattr("services.adapters.rdkafka_publisher.CONNECT_TIMEOUT_S", 1.0)
    with pytest.raises(BrokerUnavailable, match=r"no Kafka broker answers at 127\.0\.0\.1:9 within 1 s .*make up"):
        async with RdkafkaPublisher("127.0.0.1:9"):
            pass
