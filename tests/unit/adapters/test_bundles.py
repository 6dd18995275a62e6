"""Bundle records (ADR 0034): several envelopes of one topic and key as one JSON array."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest

from services.adapters import runtime as runtime_module
from services.adapters.bus import TypeSieve
from services.adapters.runtime import (
    BATCH_IDS_MAX,
    BUNDLE_HEADER,
    Output,
    ServiceRuntime,
    _Batch,
    _current_batch,
    record_position,
    within_batch_ids,
)
from services.adapters.settings import Settings
from services.contracts.codec import (
    BUNDLE_MAX,
    ContractError,
    decode,
    decode_all,
    encode_bundle,
    make_envelope,
)
from services.contracts.events import ClockTick, PodRunning, WorkloadFinished, WorkloadRunning

AT = "2026-11-29T10:00:00Z"


def finished(uid: str):
    return make_envelope(WorkloadFinished(uid=uid, namespace="ns", name=uid, succeeded=True, finished_at=AT),
                         producer="test", occurred_at=AT, identity=(uid, "finished"))


def running(uid: str):
    return make_envelope(WorkloadRunning(uid=uid, namespace="ns", name=uid, started_at=AT), producer="test",
                         occurred_at=AT, identity=(uid, "running"))


def tick():
    return make_envelope(ClockTick(at=AT, source="test"), producer="test", occurred_at=AT, identity=("tick",))


def test_one_envelope_stays_a_plain_record_and_several_travel_as_one_array_in_order():
    [(single, n)] = encode_bundle([finished("a")])
    assert n == 1 and decode(single).payload.uid == "a"
    [(bundle, n)] = encode_bundle([running("a"), finished("a"), finished("b")])
    assert n == 3 and bundle.startswith(b"[")
    assert [(e.event_type, e.payload.uid) for e in decode_all(bundle)] == [
        ("workload.running.v1", "a"), ("workload.finished.v1", "a"), ("workload.finished.v1", "b")]


def test_a_long_run_is_cut_into_records_of_at_most_bundle_max_envelopes():
    envelopes = [finished(f"w{i}") for i in range(2 * BUNDLE_MAX + 5)]
    records = encode_bundle(envelopes)
    assert [n for _, n in records] == [BUNDLE_MAX, BUNDLE_MAX, 5]
    assert [e.payload.uid for value, _ in records for e in decode_all(value)] == [f"w{i}" for i in range(len(envelopes))]


def test_a_bad_envelope_in_a_bundle_is_named_by_its_place():
    good = orjson.loads(encode_bundle([finished("a")])[0][0])
    bad = {**good, "payload": {k: v for k, v in good["payload"].items() if k != "uid"}}
    with pytest.raises(ContractError, match=r"envelope 2 of 3 in the record: .*uid"):
        decode_all(orjson.dumps([good, bad, good]))
    with pytest.raises(ContractError, match="empty bundle"):
        decode_all(b"[]")
    with pytest.raises(ContractError, match="not valid JSON"):
        decode_all(b"[{")


def test_the_sieve_drops_a_bundle_only_when_the_reader_reads_none_of_its_envelopes():
    reads_finishes = TypeSieve(frozenset({WorkloadFinished.EVENT_TYPE}))
    [(ticks, _)] = encode_bundle([tick(), running("a")])
    [(mixed, _)] = encode_bundle([running("a"), finished("a")])
    assert reads_finishes.unread(ticks)
    assert not reads_finishes.unread(mixed)
    assert not TypeSieve(frozenset({PodRunning.EVENT_TYPE})).unread(b'[{"event_type": "workload.teleported.v1"}]')


class Message:
    def __init__(self, offset: int, headers) -> None:
        self.partition, self.offset, self.headers = 3, offset, headers


class Event:
    def __init__(self, offset: int, value: bytes, headers=None) -> None:
        self.value, self.message = value, Message(offset, headers)


def test_a_batch_is_cut_before_it_carries_more_envelopes_than_batch_ids_max():
    single = Event(0, b"{}")
    bundle_of = lambda offset, n: Event(offset, b"[{}]", [(BUNDLE_HEADER, str(n).encode())])  # noqa: E731
    events = [single, bundle_of(1, 600), bundle_of(2, 424), bundle_of(3, 10), single]
    chunks = within_batch_ids(events)
    assert [[e.message.offset for e in chunk] for chunk in chunks] == [[0, 1], [2, 3, 0]]
    assert all(sum(int(dict(e.message.headers or [(BUNDLE_HEADER, b"1")])[BUNDLE_HEADER]) for e in chunk) <= BATCH_IDS_MAX
               for chunk in chunks)
    # a bundle whose header is missing counts as the largest bundle there can be
    unlabelled = [Event(i, b"[{}]") for i in range(BATCH_IDS_MAX // BUNDLE_MAX + 1)]
    assert [len(chunk) for chunk in within_batch_ids(unlabelled)] == [BATCH_IDS_MAX // BUNDLE_MAX, 1]
    assert within_batch_ids([]) == []


def test_a_position_outside_a_bundle_is_its_records_with_index_zero():
    assert record_position(Event(7, b"{}")) == (3, 7, 0)


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes, object]] = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append((topic, key, value, headers))
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


async def test_a_batch_sends_its_held_outputs_bundled_per_key_before_the_records_they_caused():
    runtime = ServiceRuntime(Settings(service="bundle-test", app_id_suffix=f"-{uuid.uuid4().hex[:6]}"))
    runtime.bundled_topics = frozenset({"qm.workloads"})
    producer = runtime.app.producer = FakeProducer()
    batch = _Batch()
    batch.bundling = True  # as for a batch of BUNDLE_FROM_EVENTS events or more
    token = _current_batch.set(batch)
    try:
        await runtime.publish([Output("qm.workloads", "cohort-a", running("a")),
                               Output("qm.actions", "a", tick()),
                               Output("qm.workloads", "cohort-b", finished("b")),
                               Output("qm.workloads", "cohort-a", finished("a"))])
        assert producer.sent == []  # held to the commit
        acks = await runtime._send_held(batch.held)
    finally:
        _current_batch.reset(token)
    assert len(acks) == 3
    sent = [(topic.split(".", 1)[-1] if "." in topic else topic, key, [e.event_type for e in decode_all(value)], headers)
            for topic, key, value, headers in producer.sent]
    assert [(key, types, headers) for _, key, types, headers in sent] == [
        (b"cohort-a", ["workload.running.v1", "workload.finished.v1"], [(BUNDLE_HEADER, b"2")]),
        (b"cohort-b", ["workload.finished.v1"], None),  # one envelope: a plain record
        (b"a", ["clock.tick.v1"], None),  # after the bundles it follows
    ]


async def publish_two_in_a_batch(*, bundling: bool) -> tuple[_Batch, FakeProducer]:
    """Two outputs of one cohort published by a runtime that bundles qm.workloads, in a batch."""
    runtime = ServiceRuntime(Settings(service="bundle-test", app_id_suffix=f"-{uuid.uuid4().hex[:6]}"))
    runtime.bundled_topics = frozenset({"qm.workloads"})
    producer = runtime.app.producer = FakeProducer()
    batch = _Batch()
    batch.bundling = bundling  # as process() sets it for a batch of BUNDLE_FROM_EVENTS events or more
    token = _current_batch.set(batch)
    try:
        await runtime.publish([Output("qm.workloads", "cohort-a", running("a")),
                               Output("qm.workloads", "cohort-a", finished("a"))])
    finally:
        _current_batch.reset(token)
    return batch, producer


async def test_a_long_batch_sends_what_it_held_once_it_has_held_it_hold_max_s(monkeypatch):
    monkeypatch.setattr(runtime_module, "HOLD_MAX_S", 0.0)
    batch, producer = await publish_two_in_a_batch(bundling=True)
    assert [len(decode_all(value)) for _, _, value, _ in producer.sent] == [2]  # one bundle, sent at once
    assert batch.held == [] and len(batch.acks) == 1  # its acknowledgement still awaited at the commit


async def test_a_small_batch_sends_its_outputs_one_by_one_at_once():
    batch, producer = await publish_two_in_a_batch(bundling=False)
    assert [len(decode_all(value)) for _, _, value, _ in producer.sent] == [1, 1]
    assert batch.held == []
