"""A batch sends only its last `latest_only` output per topic and key (ServiceRuntime._hold_latest),
at the batch's end and before its states are stored; every other output is sent at once."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from services.adapters.runtime import COMPACTED_TOPICS, Output
from services.contracts.codec import make_envelope
from services.contracts.events import UsageSnapshot, WorkloadFinished
from tests.unit.adapters.test_runtime_cursors import FakeTable, events, runtime  # noqa: F401 (runtime: a fixture)

AT = "2026-11-29T10:00:00Z"


class FakeProducer:
    """Stands in for faust's producer: the records sent, in order, each acknowledged at once."""

    def __init__(self, log: list) -> None:
        self.log = log

    async def send(self, topic, key, value, partition, timestamp, headers):
        document = orjson.loads(value)
        self.log.append(("sent", topic.rsplit(".", 2)[-2] + "." + topic.rsplit(".", 1)[-1], key.decode(),
                         document["payload"].get("total") or document["payload"].get("uid")))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def usage(namespace: str, gpus: int, tag: int, latest_only: bool = True) -> Output:
    return Output("qm.usage", namespace, make_envelope(
        UsageSnapshot(namespace=namespace, reserved={}, running={}, total={"nvidia.com/gpu": gpus}, as_of=AT),
        producer="test", occurred_at=AT, identity=(tag,)), latest_only)


def finished(uid: str) -> Output:
    return Output("qm.workloads", "cohort", make_envelope(
        WorkloadFinished(uid=uid, namespace="ns", name=uid, succeeded=True, finished_at=AT),
        producer="test", occurred_at=AT, identity=(uid,)))


def test_only_an_output_to_a_topic_that_keeps_the_latest_value_may_be_latest_only():
    assert {"qm.usage", "qm.budgets", "qm.config"} == COMPACTED_TOPICS  # topics.yaml: compact
    with pytest.raises(ValueError, match="latest_only output to qm.workloads, which keeps every record"):
        Output("qm.workloads", "cohort", finished("w0").envelope, latest_only=True)


async def test_a_batch_sends_its_last_usage_per_namespace_at_its_end_and_every_other_output_at_once(runtime):  # noqa: F811
    log: list = []
    runtime.app.producer = FakeProducer(log)
    cohort = FakeTable("cohort")
    runtime._cursor_tables[runtime.tp.topic] = FakeTable("cursors")
    runtime.store_interval_s = 0.0  # every state is stored when its batch ends
    said = {0: [usage("ns-a", 1, 0), finished("w0"), usage("ns-c", 7, 0, latest_only=False)],
            1: [usage("ns-b", 5, 1), usage("ns-a", 2, 1), finished("w1"), usage("ns-c", 8, 1, latest_only=False)],
            2: [usage("ns-a", 3, 2)]}

    async def handle(event):
        offset = event.message.offset
        await runtime.apply_once(cohort, "cohort", make_envelope(
            WorkloadFinished(uid=f"u{offset}", namespace="ns", name="w", succeeded=True, finished_at=AT),
            producer="test", occurred_at=AT, identity=(offset,)), lambda s, e: ((s or 0) + 1, said[offset]))
        log.append(("handled", offset))

    original = cohort.send_changelog

    def stored(partition, key, value):
        log.append(("stored", key))
        return original(partition, key, value)

    cohort.send_changelog = stored
    await runtime.process(events(runtime, 0, 1, 2), handle, "qm.workloads", defer=True)

    assert log == [
        ("sent", "qm.workloads", "cohort", "w0"), ("sent", "qm.usage", "ns-c", {"nvidia.com/gpu": 7}), ("handled", 0),
        ("sent", "qm.workloads", "cohort", "w1"), ("sent", "qm.usage", "ns-c", {"nvidia.com/gpu": 8}), ("handled", 1),
        ("handled", 2),
        ("sent", "qm.usage", "ns-b", {"nvidia.com/gpu": 5}),  # ns-a's last value goes last
        ("sent", "qm.usage", "ns-a", {"nvidia.com/gpu": 3}),
        ("stored", "cohort"),
    ]


async def test_outside_a_batch_every_output_is_sent(runtime):  # noqa: F811
    log: list = []
    runtime.app.producer = FakeProducer(log)
    await runtime.publish([usage("ns-a", 1, 0), usage("ns-a", 2, 1)])
    assert [entry[3] for entry in log] == [{"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 2}]
