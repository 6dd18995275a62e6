"""Property: however late (within the horizon) and in whatever order events arrive, the ledger's
totals per (workload, flavor, usage kind) equal those of the in-order stream; ids stay unique."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

from cost_builders import HOUR, MINUTE, T0, rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.core.cost import (
    ClockTick,
    CostSettings,
    Evicted,
    Finished,
    PodsRunning,
    PodsStopped,
    PreFreezeExpired,
    Released,
    ReservationStarted,
    ResourceAmounts,
    fold,
    initial_state,
)

op = st.one_of(
    st.tuples(st.just("reserve"), st.sampled_from([1000, 4000, 16000]), st.sampled_from(["a100", "t4"])),
    st.tuples(st.just("run"), st.sampled_from(["", "p0", "p1"]), st.sampled_from([500, 1000, 2000])),
    st.tuples(st.just("stop"), st.sampled_from(["", "p0", "p1"])),
    st.tuples(st.sampled_from(["expire", "release", "evict", "finish"])),
)
workload = st.lists(st.tuples(st.integers(1, 95), op), min_size=1, max_size=8)


def build(plans):
    events = []
    for index, plan in enumerate(plans):
        uid = f"wl-{index}"
        clock = T0
        for number, (gap, action) in enumerate(plan):
            clock += gap * MINUTE  # strictly increasing per workload: no same-instant ties
            event_id = f"{uid}-{number}"
            kind = action[0]
            if kind == "reserve":
                events.append(
                    ReservationStarted(
                        event_id, uid, "ns", action[2], ResourceAmounts(action[1], 2000), clock
                    )
                )
            elif kind == "run":
                amounts = ResourceAmounts(action[2], 1000)
                events.append(PodsRunning(event_id, uid, "ns", "a100", amounts, clock, pod_name=action[1]))
            elif kind == "stop":
                events.append(PodsStopped(event_id, uid, clock, action[1]))
            else:
                cls = {"expire": PreFreezeExpired, "release": Released, "evict": Evicted, "finish": Finished}[
                    kind
                ]
                events.append(cls(event_id, uid, clock))
    return events


def totals(outputs):
    sums = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for row in rows(outputs):
        key = (row.workload_uid, row.flavor, row.usage_kind)
        sums[key][0] += row.gpu_hours
        sums[key][1] += row.core_hours
    return {key: value for key, value in sums.items() if value != [0, 0]}


def with_ticks(events, end_ms):
    tick, merged = T0, []
    for event in events:
        while tick <= event.at_ms:
            merged.append(ClockTick(f"tick-{tick}", tick))
            tick += HOUR
        merged.append(event)
    merged.append(ClockTick("final", end_ms))
    return merged


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans=st.lists(workload, min_size=1, max_size=3), data=st.data())
def test_late_and_reordered_arrival_gives_the_in_order_totals(plans, data):
    events = build(plans)
    end_ms = T0 + 48 * HOUR
    in_order = sorted(events, key=lambda e: e.at_ms)
    expected = totals(fold(with_ticks(in_order, end_ms), initial_state())[1])

    delays = data.draw(st.lists(st.integers(0, 240), min_size=len(events), max_size=len(events)))
    arrival = sorted(range(len(events)), key=lambda i: (events[i].at_ms + delays[i] * MINUTE, i))
    # Ticks follow the arrival clock: an event delivered late finds its hours already closed.
    delivered, clock = [], T0
    for i in arrival:
        arrives = events[i].at_ms + delays[i] * MINUTE
        while clock + HOUR <= arrives:
            clock += HOUR
            delivered.append(ClockTick(f"tick-{clock}", clock))
        delivered.append(events[i])
    close_delay_ms = data.draw(st.sampled_from([0, 5 * MINUTE, 3 * HOUR]))
    delivered.append(ClockTick("final", end_ms + close_delay_ms))
    state = initial_state(CostSettings(close_delay_ms=close_delay_ms))
    outputs = fold(delivered, state)[1]
    assert totals(outputs) == expected
    ids = [row.row_id for row in rows(outputs)]
    assert len(ids) == len(set(ids))
