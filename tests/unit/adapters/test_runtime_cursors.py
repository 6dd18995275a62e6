"""The runtime's applied-offset cursors (ADR 0011), with a fake consumer in place of faust's:
which events a batch applies, passes over, or sends back to be read again."""

from __future__ import annotations

import asyncio
import uuid
import weakref

import pytest
from faust.streams import _current_event
from faust.types import TP

from services.adapters.bus import TypeSieve
from services.adapters.runtime import REFETCHED_AFTER_REBALANCE, REWINDS, Output, ServiceRuntime
from services.adapters.settings import Settings
from services.contracts.codec import encode, make_envelope
from services.contracts.events import ClockTick, WorkloadFinished


class FakeConsumer:
    """Stands in for faust's consumer: records where the runtime asked to read from."""

    def __init__(self) -> None:
        self.seeks: list[tuple[TP, int]] = []

    async def seek_safely(self, tp: TP, offset: int) -> bool:
        self.seeks.append((tp, offset))
        return True


class Message:
    def __init__(self, tp: TP, offset: int, generation_id: int) -> None:
        self.tp, self.topic, self.partition = tp, tp.topic, tp.partition
        self.offset, self.generation_id = offset, generation_id


class Event:
    def __init__(self, message: Message) -> None:
        self.message = message


@pytest.fixture
def runtime():
    runtime = ServiceRuntime(Settings(service="cursor-test", app_id_suffix=f"-{uuid.uuid4().hex[:6]}"))
    source = runtime.topic("qm.workloads")
    runtime.guard(source, "fold")
    runtime.app.consumer = FakeConsumer()
    runtime.app.flow_control.resume()  # as after an assignment's recovery
    runtime.tp = TP(source.get_topic_name(), 0)
    assert runtime.is_current(Event(Message(runtime.tp, 0, runtime.app.consumer_generation_id)))
    return runtime


def events(runtime, *offsets, generation=0):
    return [Event(Message(runtime.tp, offset, generation)) for offset in offsets]


async def test_events_below_the_cursor_are_passed_over_and_acknowledged(runtime):
    runtime._next_offset[runtime.tp] = 10
    applied = []

    async def handle(event):
        applied.append(event.message.offset)

    batch = events(runtime, 8, 9)
    await runtime.process(batch, handle, "qm.workloads")
    assert applied == []
    assert all(e.message in runtime.app.qm_handled for e in batch)
    assert runtime.app.consumer.seeks == []


async def test_a_gap_reads_the_partition_again_from_the_cursor_once(runtime):
    runtime._next_offset[runtime.tp] = 10
    applied = []

    async def handle(event):
        applied.append(event.message.offset)

    batch = events(runtime, 12, 13, 14)
    await runtime.process(batch, handle, "qm.workloads")
    assert applied == []
    assert runtime.app.consumer.seeks == [(runtime.tp, 10)]  # once, not once per event
    assert not any(e.message in runtime.app.qm_handled for e in batch)  # never acknowledged


async def test_events_fetched_in_an_earlier_generation_are_left_alone(runtime):
    runtime.app.consumer_generation_id = 3
    applied = []

    async def handle(event):
        applied.append(event.message.offset)

    batch = events(runtime, 0, 1, generation=2)
    await runtime.process(batch, handle, "qm.workloads")
    assert applied == []
    assert not any(e.message in runtime.app.qm_handled for e in batch)


async def test_events_passed_over_while_a_rebalance_finishes_are_read_again_once_it_is_over(runtime):
    """faust can deliver records of the current generation after its seek to the cursors and
    before the rebalance ends. They are not applied then; if they were the partition's last,
    no later record would show the gap, so the partition is sought back once the rebalance is
    over (the CI failure: one topic of each co-partitioned pair never applied)."""
    runtime._cursor_tables[runtime.tp.topic] = cursors = FakeTable("cursors")
    runtime._next_offset[runtime.tp] = 10
    applied = []

    async def handle(event):
        applied.append(event.message.offset)

    runtime.app.rebalancing = True
    batch = events(runtime, 10, 11, 12)  # the partition's last records
    await runtime.process(batch, handle, "qm.workloads")
    assert applied == []
    assert not any(e.message in runtime.app.qm_handled for e in batch)
    await runtime._retry_rewinds()
    assert runtime.app.consumer.seeks == []  # not while the rebalance is under way

    runtime.app.rebalancing = False
    await runtime._retry_rewinds()
    assert runtime.app.consumer.seeks == [(runtime.tp, 10)]
    await runtime.process(events(runtime, 10, 11, 12), handle, "qm.workloads")
    assert applied == [10, 11, 12]
    assert cursors.data == {"0": 13}
    await runtime._retry_rewinds()
    assert runtime.app.consumer.seeks == [(runtime.tp, 10)]  # read again: nothing left to seek


async def test_a_gap_after_such_a_rebalance_seeks_at_once_and_is_no_skip_of_the_consumer(runtime):
    """A later record showing the gap need not wait for the retry timer; the runtime passed
    those events over itself, so they count as left for refetch, not as a rewind."""
    runtime._next_offset[runtime.tp] = 10
    rewinds = REWINDS.labels(runtime.settings.service, "qm.workloads")
    left = REFETCHED_AFTER_REBALANCE.labels(runtime.settings.service, "qm.workloads")
    rewinds_before, left_before = rewinds._value.get(), left._value.get()

    async def handle(event):
        pass

    runtime.app.rebalancing = True
    await runtime.process(events(runtime, 10, 11), handle, "qm.workloads")
    runtime.app.rebalancing = False
    await runtime.process(events(runtime, 12), handle, "qm.workloads")
    assert runtime.app.consumer.seeks == [(runtime.tp, 10)]
    assert (rewinds._value.get() - rewinds_before, left._value.get() - left_before) == (0, 2)


class Record:
    """What faust's consumer thread hands over per fetched record (aiokafka's ConsumerRecord)."""

    def __init__(self, offset: int, value: bytes) -> None:
        self.offset, self.value = offset, value


TICK = encode(make_envelope(ClockTick(at="2026-11-29T10:00:00Z", source="test"), producer="test",
                            occurred_at="2026-11-29T10:00:00Z"))
FINISH = encode(make_envelope(WorkloadFinished(uid="u", namespace="ns", name="w", succeeded=True,
                                               finished_at="2026-11-29T10:00:00Z"),
                              producer="test", occurred_at="2026-11-29T10:00:00Z"))


async def test_records_nobody_reads_are_dropped_and_their_gap_is_not_read_again(runtime):
    """ADR 0030: of a fetch, only records of a type the handler reads reach it (and the last
    one, whatever it is), and the offsets dropped before a delivered record are not taken for
    events the consumer skipped."""
    runtime._sieves[runtime.tp.topic] = TypeSieve(frozenset({WorkloadFinished.EVENT_TYPE}))
    runtime._cursor_tables[runtime.tp.topic] = cursors = FakeTable("cursors")
    runtime._next_offset[runtime.tp] = 10
    values = {10: FINISH, 11: TICK, 12: TICK, 13: FINISH, 14: FINISH, 15: TICK, 16: TICK}
    fetched = runtime.pass_over_unread({runtime.tp: [Record(o, v) for o, v in values.items()]})
    assert [r.offset for r in fetched[runtime.tp]] == [10, 13, 14, 16]  # 16: the last is always kept
    applied = []

    async def handle(event):
        applied.append(event.message.offset)

    await runtime.process(events(runtime, 10, 13, 14, 16), handle, "qm.workloads", defer=True)
    assert applied == [10, 13, 14, 16]
    assert runtime.app.consumer.seeks == []
    assert cursors.data == {"0": 17}
    assert runtime._passed_over[runtime.tp] == {}  # each note is used once
    # A gap no drop explains is still one: the partition is read again from its cursor.
    await runtime.process(events(runtime, 19), handle, "qm.workloads", defer=True)
    assert runtime.app.consumer.seeks == [(runtime.tp, 17)]


def test_after_an_assignment_the_stored_cursor_wins_over_kafkas_committed_offset(runtime):
    name = runtime.tp.topic
    runtime._cursor_tables[name].data["0"] = 7
    p0, p1, p2 = TP(name, 0), TP(name, 1), TP(name, 2)
    other = TP("not-consumed", 0)
    committed = {p0: 3, p1: 5, p2: None, other: 9}
    assert runtime.unstarted(committed) == [p2]
    positions = runtime.positions_after_assignment(committed, {p2: 0})
    assert positions == {p0: 7, p1: 5, p2: 0}  # cursor, else committed, else the first offset
    assert runtime._next_offset == positions


async def test_a_rewind_without_a_re_read_is_sought_again_after_a_second(runtime, monkeypatch):
    """At the end of a partition no later event would notice that the re-read was dropped."""
    clock = [100.0]
    monkeypatch.setattr("services.adapters.runtime.time.monotonic", lambda: clock[0])
    runtime._next_offset[runtime.tp] = 10

    async def handle(event):
        raise AssertionError("nothing above the cursor may be applied")

    await runtime.process(events(runtime, 12), handle, "qm.workloads")
    await runtime._retry_rewinds()
    assert runtime.app.consumer.seeks == [(runtime.tp, 10)]  # not yet: the re-read may be on its way
    clock[0] += 1.5
    await runtime._retry_rewinds()
    assert runtime.app.consumer.seeks == [(runtime.tp, 10), (runtime.tp, 10)]


class FakeTable:
    """Stands in for a faust Table: its data, and the changelog records sent."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.data: dict = {}
        self.sent: list[tuple[str, object]] = []

    def get(self, key):
        return self.data.get(key)

    def send_changelog(self, partition, key, value):
        self.sent.append((key, value))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def counting_fold(state, envelope):
    return (state or 0) + 1, []


async def apply_each(runtime, table, keys, batch):
    """Each event, as a batch of its own, folded into every key of `keys` (a key or a list, in order)."""
    keys = [keys] if isinstance(keys, str) else keys
    for event in batch:
        token = _current_event.set(weakref.ref(event))
        try:
            envelope = make_envelope(
                WorkloadFinished(uid=f"u{event.message.offset}", namespace="ns", name="w", succeeded=True,
                                 finished_at="2026-11-29T10:00:00Z"),
                producer="test", occurred_at="2026-11-29T10:00:00Z", identity=(event.message.offset,),
            )

            async def fold_into_each_key(_event, envelope=envelope):
                for key in keys:
                    await runtime.apply_once(table, key, envelope, counting_fold)

            await runtime.process([event], fold_into_each_key, "qm.workloads", defer=True)
        finally:
            _current_event.reset(token)


async def test_a_value_not_yet_stored_holds_its_partitions_cursor_back_until_it_is(runtime):
    """ADR 0014: values reach the changelog once a second; meanwhile the stored cursor stays at
    the first event whose effect is only in memory, so a crash replays from there."""
    cursors = FakeTable("cursors")
    runtime._cursor_tables[runtime.tp.topic] = cursors
    cohort = FakeTable("cohort")
    runtime.store_interval_s = 60.0

    await apply_each(runtime, cohort, "cohort-a", events(runtime, 0, 1, 2))
    assert cohort.data["cohort-a"]["state"] == 3  # applied in memory
    assert cohort.sent == []  # not written yet
    assert cursors.data == {"0": 0}  # the first cursor ever, held at the first unstored event

    runtime.store_interval_s = 0.0  # now due
    await apply_each(runtime, cohort, "cohort-a", events(runtime, 3))
    assert [(key, value["state"]) for key, value in cohort.sent] == [("cohort-a", 4)]
    assert cursors.data == {"0": 4}  # everything up to offset 3 is stored


async def test_a_quiet_stream_stores_what_is_due_on_the_timer(runtime):
    cursors = FakeTable("cursors")
    runtime._cursor_tables[runtime.tp.topic] = cursors
    cohort = FakeTable("cohort")
    runtime.store_interval_s = 60.0
    await apply_each(runtime, cohort, "cohort-a", events(runtime, 0, 1))
    assert cohort.sent == [] and cursors.data == {"0": 0}

    await runtime._store_idle()
    assert cohort.sent == []  # not due yet
    runtime.store_interval_s = 0.0
    await runtime._store_idle()
    assert [(key, value["state"]) for key, value in cohort.sent] == [("cohort-a", 2)]
    assert cursors.data == {"0": 2}


async def test_a_partitions_values_are_written_together_in_the_order_last_applied(runtime, monkeypatch):
    """When one value of a partition falls due, all of its unstored values are written with it,
    so the changelog holds the partition as of one batch boundary. The cost ledger tells
    applied events by its cohort record alone: written without a workload's book, a replay
    skipped the events only that book had seen (a SIGKILL replay lost rows)."""
    clock = [100.0]
    monkeypatch.setattr("services.adapters.runtime.time.monotonic", lambda: clock[0])
    cursors = FakeTable("cursors")
    runtime._cursor_tables[runtime.tp.topic] = cursors
    ledger = FakeTable("ledger")
    runtime.store_interval_s = 1.0

    await apply_each(runtime, ledger, ["cohort|ml"], events(runtime, 0))
    clock[0] = 100.5
    await apply_each(runtime, ledger, ["book-a", "cohort|ml"], events(runtime, 1))  # book first, cohort record last
    assert ledger.sent == []
    clock[0] = 101.2  # the cohort record is due, the book (first applied at 100.5) is not
    await apply_each(runtime, ledger, ["cohort|ml"], events(runtime, 2))
    assert [(key, value["state"]) for key, value in ledger.sent] == [("book-a", 1), ("cohort|ml", 3)]
    assert cursors.data == {"0": 3}


async def test_a_value_applied_again_while_its_partition_is_written_stays_unstored_and_holds_the_cursor(runtime):
    """ADR 0031: a partition's unstored values are kept together with their earliest hold. A
    value applied again while the partition's write awaits its acks stays unstored, and the
    cursor is held at that value's first event, no longer at the values just written."""
    acked = asyncio.get_running_loop().create_future()

    class SlowTable(FakeTable):
        def send_changelog(self, partition, key, value):
            self.sent.append((key, value))
            return acked

    ledger = SlowTable("ledger")
    runtime.store_interval_s = 0.0
    first, second, again = events(runtime, 0, 1, 2)
    tp = runtime.tp
    runtime._note_unstored(ledger, "book-a", 1, first, 1, {tp: 0}, 100.0)
    runtime._note_unstored(ledger, "book-b", 1, second, 1, {tp: 1}, 100.0)
    assert runtime._held_at([tp]) == {tp: 0}

    writing = asyncio.create_task(runtime._store_due(200.0))
    await asyncio.sleep(0)
    assert ledger.sent == [("book-a", 1), ("book-b", 1)]
    runtime._note_unstored(ledger, "book-b", 2, again, 1, {tp: 2}, 150.0)  # meanwhile, book-b moves on
    acked.set_result(None)
    assert await writing == {tp}

    assert runtime._held_at([tp]) == {tp: 1}  # book-b's first event not in a stored value
    assert await runtime._store_due(200.0) == {tp}
    assert ledger.sent[-1] == ("book-b", 2)
    assert runtime._held_at([tp]) == {} and runtime._unstored == {}


async def test_a_value_that_took_half_the_seen_window_of_ids_is_stored_before_its_interval(runtime):
    """ADR 0033: a replay onto a stored value is recognised only while the ids it took since the
    last store fit in its seen window. One batch of bundled rows can carry hundreds of ids per key,
    so the count of ids, not of batches, also makes a value due."""
    from services.adapters.runtime import STORE_IDS_MAX

    cursors = FakeTable("cursors")
    runtime._cursor_tables[runtime.tp.topic] = cursors
    budgets = FakeTable("budgets")
    runtime.store_interval_s = 60.0

    def envelope_of(event):
        return make_envelope(
            WorkloadFinished(uid=f"u{event.message.offset}", namespace="ns", name="w", succeeded=True,
                             finished_at="2026-11-29T10:00:00Z"),
            producer="test", occurred_at="2026-11-29T10:00:00Z", identity=(event.message.offset,))

    async def fold_into_cc(event):
        await runtime.apply_once(budgets, "cc-ml", envelope_of(event), counting_fold)

    await runtime.process(events(runtime, *range(0, 100)), fold_into_cc, "qm.workloads", defer=True)
    assert budgets.sent == []  # one batch, 100 ids: not due
    await runtime.process(events(runtime, *range(100, STORE_IDS_MAX)), fold_into_cc, "qm.workloads", defer=True)
    assert [(key, value["state"]) for key, value in budgets.sent] == [("cc-ml", STORE_IDS_MAX)]
    assert cursors.data == {"0": STORE_IDS_MAX}


@pytest.mark.parametrize("size", ["0", "5000", "many"])
def test_a_batch_size_whose_ids_would_not_fit_the_dedupe_window_is_refused_naming_the_range(size, monkeypatch):
    monkeypatch.setenv("QM_BATCH_SIZE", size)
    with pytest.raises(SystemExit, match=r"QM_BATCH_SIZE=.*expected 1 to 1024"):
        ServiceRuntime(Settings(service="cursor-test", app_id_suffix=f"-{uuid.uuid4().hex[:6]}"))


async def test_a_batch_sets_how_far_behind_its_stream_the_service_is(runtime):
    """qm_applied_record_age_seconds: wall clock minus the Kafka timestamp of the last record a
    batch applied (of each partition: the oldest counts), per topic."""
    import time

    from prometheus_client import REGISTRY

    def age() -> float | None:
        return REGISTRY.get_sample_value("qm_applied_record_age_seconds",
                                         {"service": "cursor-test", "topic": "qm.workloads"})

    async def handle(event):
        pass

    runtime._cursor_tables[runtime.tp.topic] = FakeTable("cursors")  # stored without a broker
    behind = events(runtime, 0, 1)
    behind[0].message.timestamp = time.time() - 9.0
    behind[1].message.timestamp = time.time() - 3.0  # the last one applied: 3 s behind
    await runtime.process(behind, handle, "qm.workloads", defer=True)
    assert age() == pytest.approx(3.0, abs=0.5)
    caught_up = events(runtime, 2)
    caught_up[0].message.timestamp = time.time() - 0.1
    await runtime.process(caught_up, handle, "qm.workloads", defer=True)
    assert age() < 0.6


class SlowBroker:
    """A producer whose broker acknowledges each record `delay_s` after it was sent."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def send(self, topic, key, value, partition, timestamp, headers):
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(self.delay_s, future.set_result, None)
        return future


async def test_a_batch_reports_where_its_loop_spent_the_time(runtime):
    """qm_batch_seconds: the handlers' time, the wait for the broker's acknowledgements, and
    the rest of the commit, one observation of each per batch."""
    from prometheus_client import REGISTRY

    def seconds(step: str, what: str = "sum") -> float:
        return REGISTRY.get_sample_value(f"qm_batch_seconds_{what}",
                                         {"service": "cursor-test", "topic": "qm.workloads", "step": step}) or 0.0

    runtime.app.producer = SlowBroker(0.05)
    runtime._cursor_tables[runtime.tp.topic] = FakeTable("cursors")

    async def handle(event):
        await asyncio.sleep(0.03)  # the fold
        await runtime.publish([Output("qm.workloads", "cohort-a", encode_tick())])

    before = {step: (seconds(step), seconds(step, "count")) for step in ("handle", "acks", "commit")}
    await runtime.process(events(runtime, 0), handle, "qm.workloads", defer=True)
    spent = {step: seconds(step) - before[step][0] for step in before}
    assert all(seconds(step, "count") - before[step][1] == 1 for step in before)
    assert 0.03 <= spent["handle"] < 0.045
    assert 0.035 <= spent["acks"] < 0.06  # sent at the end of the handler: ~50 ms minus nothing
    assert spent["commit"] < 0.02


def encode_tick():
    return make_envelope(ClockTick(at="2026-11-29T10:00:00Z", source="test"), producer="test",
                         occurred_at="2026-11-29T10:00:00Z")


def test_metrics_render_only_the_series_asked_for_by_name():
    from services.adapters.runtime import BATCH_SECONDS, metrics_text

    BATCH_SECONDS.labels("cursor-test", "qm.workloads", "handle").observe(0.01)
    everything = metrics_text().decode()
    assert "qm_messages_consumed_total" in everything or "# HELP qm_messages_consumed_total" in everything
    asked = metrics_text(["qm_batch_seconds_sum"]).decode()
    lines = [line for line in asked.splitlines() if not line.startswith("#")]
    assert lines and all(line.startswith("qm_batch_seconds_sum{") for line in lines)
