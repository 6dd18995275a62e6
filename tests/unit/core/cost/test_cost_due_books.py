"""A tick visits only the active books it closes hours of (``CostState.resume_at``), and that
index, kept up to date event by event, gives what a state rebuilt from its dict gives: the
same rows in the same order. The rebuilt state indexes each active book once, fresh."""

from __future__ import annotations

import json

from cost_builders import HOUR, MINUTE, T0, at
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
    apply,
    initial_state,
    state_from_dict,
    state_to_dict,
)
from services.core.cost.ledger import _due

op = st.one_of(
    st.tuples(st.just("reserve"), st.sampled_from([1000, 4000])),
    st.tuples(st.just("run"), st.sampled_from(["p0", "p1"])),
    st.tuples(st.just("stop"), st.sampled_from(["p0", "p1"])),
    st.tuples(st.just("release"), st.just("")),
    st.tuples(st.just("tick"), st.integers(0, 5)),  # hours of quiet before the tick
)


def _events(plan):
    clock, events = T0, []
    for index, (workload, gap, delay, (kind, value)) in enumerate(plan):
        clock += gap * MINUTE
        uid, event_id, when = f"wl-{workload}", f"e{index}", clock - delay * MINUTE  # late by delay
        if kind == "reserve":
            events.append(ReservationStarted(event_id, uid, "ns", "a100", ResourceAmounts(value, 1000, 0), when))
        elif kind == "run":
            events.append(PodsRunning(event_id, uid, "ns", "a100", ResourceAmounts(1000, 500, 0), when, pod_name=value))
        elif kind == "stop":
            events.append(PodsStopped(event_id, uid, when, value))
        elif kind == "release":
            events.append(Released(event_id, uid, when))
        else:
            clock += value * HOUR
            events.append(ClockTick(f"tick-{index}", clock))
    return events + [ClockTick(f"end-{n}", clock + n * HOUR) for n in range(1, 12)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 200), st.integers(0, 240), op), min_size=1, max_size=30),
    close_delay_hours=st.sampled_from([0, 1, 3]),
    horizon_hours=st.sampled_from([2, 168]),
)
def test_the_live_index_closes_the_same_books_in_the_same_order_as_a_rebuilt_one(
    plan, close_delay_hours, horizon_hours
):
    """Five workloads, events up to 4 hours late, ticks that jump hours, a close delay of up to
    3 hours (books wait active for it), a horizon that prunes."""
    live = initial_state(CostSettings(close_delay_ms=close_delay_hours * HOUR, correction_horizon_ms=horizon_hours * HOUR))
    rebuilt = state_from_dict(json.loads(json.dumps(state_to_dict(live))))
    for event in _events(plan):
        live, live_out = apply(live, event)
        rebuilt = state_from_dict(json.loads(json.dumps(state_to_dict(rebuilt))))
        rebuilt, rebuilt_out = apply(rebuilt, event)
        assert live_out == rebuilt_out
        assert list(live.active) == list(rebuilt.active)
        # every active book not yet closed through the closed hour is indexed: none is missed
        closed = live.closed_through_ms
        if closed is not None:
            assert _due(rebuilt, closed) == [
                uid for uid in live.active if live.books[uid].billed_through_ms < closed
            ]


def test_a_tick_closes_the_books_whose_billed_hour_it_passes_in_the_order_they_became_active():
    state = initial_state(CostSettings(close_delay_ms=2 * HOUR))
    for uid, start in (("b", "09:10"), ("a", "08:10"), ("c", "10:10")):
        state, _ = apply(state, PodsRunning(f"run-{uid}", uid, "ns", "a100", ResourceAmounts(1000, 0, 0), at(start)))
    state, outputs = apply(state, ClockTick("t", at("12:00")))  # closes through 10:00: b and a, not c
    assert [row.workload_uid for row in outputs] == ["b", "a", "a"]  # b's 09:00; a's 08:00 and 09:00
    assert list(state.active) == ["b", "a", "c"]
