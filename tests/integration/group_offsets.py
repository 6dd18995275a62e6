"""A consumer group's progress, staged on the real broker: records appended to a topic that
nobody reads, and the offsets a group has committed (ADR 0049's lag is the gap between them)."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from services.adapters.settings import Settings


def queue_manager_group(app_id_suffix: str) -> str:
    """The queue-manager's consumer group for the services' QM_APP_ID_SUFFIX."""
    return Settings(service="queue-manager", app_id_suffix=app_id_suffix).app_id


async def append(bootstrap: str, topic: str, count: int, partitions: int = 1) -> None:
    """`count` empty bundles, round-robin over the first `partitions` partitions."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for n in range(count):
            await producer.send_and_wait(topic, b"[]", key=b"elsewhere", partition=n % partitions)
    finally:
        await producer.stop()


async def commit(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit `offsets` for `group`, as a member that read up to them would."""
    member = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await member.start()
    try:
        member.assign(list(offsets))
        await member.commit({tp: OffsetAndMetadata(offset, "") for tp, offset in offsets.items()})
    finally:
        await member.stop()
