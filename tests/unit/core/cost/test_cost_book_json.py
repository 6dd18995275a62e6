"""book_to_json: the text json.dumps(book_to_dict(book)) gives, whatever happened to the book
(closed hours, late corrections of old hours, hours dropped past the horizon, a restore), with
usage sums beyond 64 bits kept exact."""

from __future__ import annotations

import json

from cost_builders import HOUR, MINUTE, T0, Stream, at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.core.cost import (
    ClockTick,
    CostSettings,
    PodsRunning,
    PodsStopped,
    Released,
    ReservationStarted,
    ResourceAmounts,
    apply_tracked,
    book_from_dict,
    book_to_dict,
    book_to_json,
    initial_state,
    state_from_dict,
    state_to_dict,
)
from services.core.cost.hour_texts import HourTexts

GIB = 2**30 * 1000  # milli-bytes


def dumps(book) -> str:
    return json.dumps(book_to_dict(book), separators=(",", ":"))


def test_a_sum_beyond_64_bits_round_trips_exactly():
    events = (
        Stream()
        .reserve("wl", at_="10:00", gpus=8, cpu_milli=4000)
        .run("wl", at_="10:00", gpus=8, cpu_milli=4000, memory_gib=512)
        .tick("13:00")
        .events
    )
    state = initial_state()
    for event in events:
        state, _, _ = apply_tracked(state, event)
    book = state.books["wl"]
    text = book_to_json(book)
    assert text == dumps(book)
    memory = json.loads(text)["series"]["a100-flavor\trunning"][2]
    assert memory == 512 * GIB * 3 * HOUR > 2**64
    restored = book_from_dict(json.loads(text))
    assert restored.series == book.series and restored.emitted == book.emitted
    assert book_to_json(restored) == text


def test_a_late_event_re_encodes_the_hour_it_corrects():
    state = initial_state()
    events = Stream().run("wl", at_="10:00", gpus=1, memory_gib=64).tick("12:00").events
    for event in events:
        state, _, _ = apply_tracked(state, event)
    before = book_to_json(state.books["wl"])
    state, outputs, changed = apply_tracked(state, PodsStopped("late", "wl", at("10:30")))
    assert changed == ("wl",) and outputs  # correction rows for 10:00 and 11:00
    after = book_to_json(state.books["wl"])
    assert after != before and after == dumps(state.books["wl"])


def test_a_book_built_by_hand_is_encoded_whole():
    state = initial_state()
    for event in Stream().run("wl", at_="10:00", gpus=1).tick("12:00").events:
        state, _, _ = apply_tracked(state, event)
    book = state.books["wl"]
    book.hour_texts = HourTexts()  # as a _Book(...) given an emitted dict directly would have it
    assert book_to_json(book) == dumps(book)


op = st.one_of(
    st.tuples(st.just("reserve"), st.sampled_from([1000, 16000]), st.sampled_from([0, 700])),
    st.tuples(st.just("run"), st.sampled_from(["", "p0", "p1"]), st.sampled_from([500, 2000])),
    st.tuples(st.just("stop"), st.sampled_from(["", "p0", "p1"])),
    st.tuples(st.just("release")),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 300), st.integers(0, 360), op), min_size=1, max_size=14),
    restore_at=st.integers(0, 20),
    horizon_hours=st.sampled_from([2, 6, 168]),
)
def test_book_to_json_equals_json_dumps_of_book_to_dict_after_every_event(plan, restore_at, horizon_hours):
    """Events of three workloads delivered with delays up to 6 hours (corrections of closed hours,
    some too late for a 2-hour horizon), hourly ticks on the arrival clock, memory sums beyond
    64 bits; halfway, the state is restored from JSON (books re-encoded from scratch)."""
    timed = []
    clock = T0
    for index, (workload, gap, delay, action) in enumerate(plan):
        clock += gap * MINUTE
        uid, event_id, kind = f"wl-{workload}", f"e{index}", action[0]
        if kind == "reserve":
            amounts = ResourceAmounts(action[1], 2000, action[2] * GIB)
            event = ReservationStarted(event_id, uid, "ns", "a100", amounts, clock)
        elif kind == "run":
            amounts = ResourceAmounts(action[2], 1000, 300 * GIB)
            event = PodsRunning(event_id, uid, "ns", "a100", amounts, clock, pod_name=action[1])
        elif kind == "stop":
            event = PodsStopped(event_id, uid, clock, action[1])
        else:
            event = Released(event_id, uid, clock)
        timed.append((clock + delay * MINUTE, index, event))
    delivered, tick = [], T0
    for arrives, _, event in sorted(timed, key=lambda item: (item[0], item[1])):
        while tick + HOUR <= arrives:
            tick += HOUR
            delivered.append(ClockTick(f"tick-{tick}", tick))
        delivered.append(event)
    delivered += [ClockTick(f"tick-{tick + n * HOUR}", tick + n * HOUR) for n in range(1, 10)]

    state = initial_state(CostSettings(correction_horizon_ms=horizon_hours * HOUR))
    for number, event in enumerate(delivered):
        if number == restore_at:
            state = state_from_dict(json.loads(json.dumps(state_to_dict(state))))
        state, _, changed = apply_tracked(state, event)
        for uid in changed:
            book = state.books.get(uid)
            if book is not None:
                assert book_to_json(book) == dumps(book)
    for book in state.books.values():
        assert book_to_json(book) == dumps(book)
        assert list(book.hour_texts.texts) == list(book.emitted) and not book.hour_texts.stale
