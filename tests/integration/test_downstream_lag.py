"""GroupLag on the real broker (ADR 0049): the records of a topic a consumer group has not
committed, summed over partitions, and None for a group that has committed nothing there."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import TopicPartition

from services.adapters.downstream_lag import GroupLag
from tests.integration.group_offsets import append, commit, queue_manager_group

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def test_the_lag_is_what_the_group_has_not_committed(kafka_bootstrap, topic_prefix):
    topic = f"{topic_prefix}qm.workloads"
    group = queue_manager_group(f"-{uuid.uuid4().hex[:8]}")
    await append(kafka_bootstrap, topic, 30, partitions=2)
    lag = GroupLag(kafka_bootstrap, group, topic)
    await lag.start()
    try:
        assert await lag.records_behind() is None  # nothing committed yet: not known
        await commit(kafka_bootstrap, group, {TopicPartition(topic, 0): 10, TopicPartition(topic, 1): 15})
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
        await append(kafka_bootstrap, topic, 5)
        await commit(kafka_bootstrap, queue_manager_group(suffix), {TopicPartition(topic, 0): 2})

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
