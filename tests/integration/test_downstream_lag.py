"""GroupLag on the real broker (ADR 0049): the records of a topic a consumer group has not
committed, summed over partitions, and None for a group that has committed nothing there."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from services.adapters.downstream_lag import GroupLag

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def test_the_lag_is_what_the_group_has_not_committed(kafka_bootstrap, topic_prefix):
    topic = f"{topic_prefix}qm.workloads"
    group = f"qm-queue-manager-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for n in range(30):
            await producer.send_and_wait(topic, b"{}", key=b"cohort", partition=n % 2)
    finally:
        await producer.stop()
    lag = GroupLag(kafka_bootstrap, group, topic)
    await lag.start()
    try:
        assert await lag.records_behind() is None  # nothing committed yet: not known
        member = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
        await member.start()
        try:
            member.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
            await member.commit({TopicPartition(topic, 0): OffsetAndMetadata(10, ""),
                                 TopicPartition(topic, 1): OffsetAndMetadata(15, "")})
        finally:
            await member.stop()
        assert await lag.records_behind() == (15 - 10) + (15 - 15)
        # another topic's commits are not this topic's lag
        other = GroupLag(kafka_bootstrap, group, f"{topic_prefix}qm.cluster")
        await other.start()
        try:
            assert await other.records_behind() is None
        finally:
            await other.stop()
    finally:
        await lag.stop()


def test_qm_status_says_how_far_behind_the_queue_manager_is(kafka_bootstrap, topic_prefix):
    """On call: `qm status` shows the lag admission paces itself by (ADR 0049)."""
    import asyncio
    import json

    import typer
    from typer.testing import CliRunner

    from services.cli import status_cmd

    app = typer.Typer()
    status_cmd.register(app)

    @app.callback()
    def _root() -> None:  # keep "status" a sub-command
        pass

    suffix = f"-{uuid.uuid4().hex[:8]}"
    topic = f"{topic_prefix}qm.workloads"

    async def queue_manager_read_two_of_five() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for _ in range(5):
                await producer.send_and_wait(topic, b"[]", key=b"cohort", partition=0)
        finally:
            await producer.stop()
        member = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=f"qm-queue-manager{suffix}",
                                  enable_auto_commit=False)
        await member.start()
        try:
            member.assign([TopicPartition(topic, 0)])
            await member.commit({TopicPartition(topic, 0): OffsetAndMetadata(2, "")})
        finally:
            await member.stop()

    runner = CliRunner()
    args = ["status", "--json", "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix, "--app-id-suffix", suffix]
    before = runner.invoke(app, args)
    assert before.exit_code == 0, before.output
    assert json.loads(before.output)["queueManagerRecordsBehind"] is None
    asyncio.run(queue_manager_read_two_of_five())
    after = runner.invoke(app, args)
    assert json.loads(after.output)["queueManagerRecordsBehind"] == 3
    text = runner.invoke(app, args[:1] + args[2:])
    assert "queue-manager: 3 record(s) of qm.workloads not read yet" in text.output
