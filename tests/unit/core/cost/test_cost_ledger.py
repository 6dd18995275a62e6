"""The cost fold: usage kinds, hour cuts, exact quantities, corrections, idempotency, round trips."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction

import pytest
from cost_builders import Stream, at, gpu_hours, round_9, rows

from services.core.cost import (
    ChargeClass,
    ClockTick,
    CostSettings,
    EventIgnored,
    IgnoreReason,
    LedgerRow,
    UsageKind,
    apply,
    apply_tracked,
    focus_record,
    fold,
    initial_state,
    row_id,
    state_from_dict,
    state_to_dict,
)

HOUR = 3_600_000


def by_period(ledger: list[LedgerRow]) -> list[tuple[str, str, UsageKind, Decimal]]:
    return [
        (
            focus_record(row)["ChargePeriodStart"],
            focus_record(row)["ChargePeriodEnd"],
            row.usage_kind,
            row.gpu_hours,
        )
        for row in ledger
    ]


# --------------------------------------------------------------------------- the field report case


@pytest.mark.parametrize("ending", ["expire", "release"])
def test_field_report_16_gpus_reserved_five_minutes_is_1_333_gpu_hours_reserved_idle(ending):
    stream = Stream().namespace("ml-team", "cc-ml").reserve("train-1", gpus=16, at_="10:00:00")
    getattr(stream, ending)("train-1", at_="10:05:00")
    _, outputs = fold(stream.tick("11:00").events)

    (row,) = rows(outputs)
    assert row.usage_kind is UsageKind.RESERVED_IDLE
    assert row.gpu_hours == Decimal("1.333333333")
    assert row.gpu_hours == round_9(
        Fraction(16 * 5, 60)
    )  # 16 GPU x 5 min / 60, rounded half-even at 9 places
    assert row.gpu_hours.as_tuple().exponent == -9  # an exact Decimal, 9 places, no float in between
    assert (row.namespace, row.cost_center, row.flavor) == ("ml-team", "cc-ml", "a100-flavor")
    assert (row.charge_period_start_ms, row.charge_period_end_ms) == (at("10:00"), at("11:00"))
    assert row.charge_class is ChargeClass.REGULAR


def test_field_report_case_priced_cost_is_exact_product():
    stream = Stream().prices().namespace("ml-team", "cc-ml").reserve("train-1", gpus=16, at_="10:00")
    _, outputs = fold(stream.expire("train-1", at_="10:05").tick("11:00").events)
    (row,) = rows(outputs)
    assert row.list_cost == Decimal("1.333333333") * Decimal("3.20")
    assert row.contracted_cost == Decimal("1.333333333") * Decimal("2.40")
    assert row.billed_cost == row.effective_cost == row.contracted_cost
    assert row.currency == "USD" and row.priced


# --------------------------------------------------------------------------- hour cuts


def test_running_0940_to_1110_is_three_rows_summing_to_exactly_1_5_hours_times_gpus():
    stream = Stream().run("wl", gpus=8, at_="09:40").finish("wl", at_="11:10").tick("12:00")
    _, outputs = fold(stream.events)
    ledger = rows(outputs)
    assert by_period(ledger) == [
        ("2023-07-01T09:00:00Z", "2023-07-01T10:00:00Z", UsageKind.RUNNING, gpu_hours(8000, 20 * 60)),
        ("2023-07-01T10:00:00Z", "2023-07-01T11:00:00Z", UsageKind.RUNNING, Decimal("8.000000000")),
        ("2023-07-01T11:00:00Z", "2023-07-01T12:00:00Z", UsageKind.RUNNING, gpu_hours(8000, 10 * 60)),
    ]
    assert sum(row.gpu_hours for row in ledger) == Decimal("1.5") * 8


def test_hour_rows_sum_exactly_even_when_each_cut_rounds_the_same_way():
    # 1/3 GPU for 20 min twice in a row: naive per-row rounding would drift; cumulative does not.
    stream = Stream().run("wl", gpus=0.001, at_="09:40").finish("wl", at_="12:20").tick("13:00")
    ledger = rows(fold(stream.events)[1])
    assert len(ledger) == 4
    assert sum(row.gpu_hours for row in ledger) == gpu_hours(1, 160 * 60)


def test_rows_wait_for_the_hour_to_close_and_close_delay_is_respected():
    state = initial_state(CostSettings(close_delay_ms=5 * 60_000))
    events = Stream().run("wl", gpus=1, at_="10:00").tick("10:59").tick("11:04").tick("11:05").events
    emitted = []
    for event in events:
        state, outputs = apply(state, event)
        emitted.append(len(rows(outputs)))
    assert emitted == [0, 0, 0, 1]


def test_a_tick_leaves_alone_the_books_none_of_whose_hours_close_yet():
    """With a close delay every workload seen within it is active at every tick; a tick that
    closes none of its hours must not name its book as changed (the shell stores those)."""
    state = initial_state(CostSettings(close_delay_ms=3 * HOUR))
    events = Stream().run("early", gpus=1, at_="07:30").run("late", gpus=1, at_="10:30").events
    for event in events:
        state, _ = apply(state, event)
    state, outputs, changed = apply_tracked(state, ClockTick("t-11", at("11:00")))  # closes through 08:00
    assert [row.workload_uid for row in rows(outputs)] == ["early"]
    assert changed == ("early",)
    _, outputs, _ = apply_tracked(state, ClockTick("t-14", at("14:00")))  # through 11:00: both
    assert sorted({row.workload_uid for row in rows(outputs)}) == ["early", "late"]


def test_per_pod_running_and_idle_for_a_gang_whose_pods_start_at_different_times():
    stream = Stream().reserve("gang", gpus=8, at_="10:00")
    for index, start in enumerate(["10:00", "10:10", "10:20", "10:30"]):
        stream.run("gang", pod=f"worker-{index}", gpus=2, at_=start)
    stream.finish("gang", at_="11:00").tick("11:00")
    ledger = rows(fold(stream.events)[1])
    kinds = {row.usage_kind: row.gpu_hours for row in ledger}
    assert kinds[UsageKind.RUNNING] == Decimal(2 * (60 + 50 + 40 + 30)) / 60
    assert kinds[UsageKind.RESERVED_IDLE] == Decimal(2)  # 8 reserved GPU-hours minus 6 running
    assert sum(kinds.values()) == Decimal(8)


def test_a_pod_that_stops_early_stops_its_own_interval_only():
    stream = (
        Stream()
        .run("wl", pod="a", gpus=1, at_="10:00")
        .run("wl", pod="b", gpus=1, at_="10:00")
        .stop("wl", pod="a", at_="10:30")
        .finish("wl", at_="11:00")
        .tick("11:00")
    )
    (row,) = rows(fold(stream.events)[1])
    assert row.gpu_hours == Decimal("1.5")


def test_requeue_after_pre_freeze_expiry_bills_both_reservations_and_the_run():
    stream = (
        Stream()
        .reserve("wl", gpus=4, at_="10:00")
        .expire("wl", at_="10:15")
        .reserve("wl", gpus=4, at_="10:30")
        .run("wl", gpus=4, at_="10:45")
        .finish("wl", at_="11:00")
        .tick("11:00")
    )
    kinds = {row.usage_kind: row.gpu_hours for row in rows(fold(stream.events)[1])}
    assert kinds == {UsageKind.RESERVED_IDLE: Decimal(2), UsageKind.RUNNING: Decimal(1)}


def test_cpu_and_memory_are_billed_in_core_hours_and_gib_hours():
    stream = Stream().prices().run("wl", cpu_milli=4000, memory_gib=16, at_="10:00").finish("wl", at_="10:30")
    (row,) = rows(fold(stream.tick("11:00").events)[1])
    assert (row.gpu_hours, row.core_hours, row.memory_gib_hours) == (0, Decimal(2), Decimal(8))
    assert row.list_cost == Decimal(2) * Decimal("0.04") + Decimal(8) * Decimal("0.005")
    assert focus_record(row)["PricingUnit"] == "Core-Hours"


def test_unknown_flavor_uses_default_price_and_unpriced_without_price_list():
    stream = Stream().prices().run("wl", gpus=1, flavor="t4-flavor", at_="10:00").finish("wl", at_="11:00")
    (row,) = rows(fold(stream.tick("11:00").events)[1])
    assert row.list_cost == Decimal("1.00") and row.contracted_cost == Decimal("1.00")
    (unpriced,) = rows(fold(Stream().run("wl", gpus=1, at_="10:00").tick("11:00").events)[1])
    assert not unpriced.priced and unpriced.list_cost == 0


# --------------------------------------------------------------------------- late events


def test_late_release_produces_correction_rows_with_deltas_never_edits():
    stream = Stream().run("wl", gpus=2, at_="10:00").tick("12:00").release("wl", at_="10:30").tick("13:00")
    ledger = rows(fold(stream.events)[1])
    regular = [row for row in ledger if row.charge_class is ChargeClass.REGULAR]
    corrections = [row for row in ledger if row.charge_class is ChargeClass.CORRECTION]
    assert [row.gpu_hours for row in regular] == [Decimal(2), Decimal(2)]
    assert [(row.charge_period_start_ms, row.gpu_hours, row.revision) for row in corrections] == [
        (at("10:00"), Decimal(-1), 1),
        (at("11:00"), Decimal(-2), 1),
    ]
    assert sum(row.gpu_hours for row in ledger) == Decimal(1)  # 2 GPUs x 30 min
    assert len({row.row_id for row in ledger}) == len(ledger)
    assert all(focus_record(row)["ChargeClass"] == "Correction" for row in corrections)


def test_late_start_corrects_idle_into_running():
    stream = Stream().reserve("wl", gpus=4, at_="10:00").tick("11:00").run("wl", gpus=4, at_="10:30")
    stream.finish("wl", at_="11:00").tick("12:00")
    ledger = rows(fold(stream.events)[1])
    totals: dict[UsageKind, Decimal] = {}
    for row in ledger:
        totals[row.usage_kind] = totals.get(row.usage_kind, Decimal(0)) + row.gpu_hours
    assert totals == {UsageKind.RESERVED_IDLE: Decimal(2), UsageKind.RUNNING: Decimal(2)}
    assert {row.charge_class for row in ledger if row.usage_kind is UsageKind.RUNNING} == {
        ChargeClass.CORRECTION
    }


def test_events_older_than_the_correction_horizon_are_reported_not_applied():
    state = initial_state(CostSettings(correction_horizon_ms=2 * HOUR))
    stream = Stream().run("wl", gpus=1, at_="10:00").tick("15:00").release("wl", at_="10:30")
    state, outputs = fold(stream.events, state)
    ignored = [output for output in outputs if isinstance(output, EventIgnored)]
    assert [output.reason for output in ignored] == [IgnoreReason.TOO_LATE]
    assert all(row.charge_class is ChargeClass.REGULAR for row in rows(outputs))


def test_start_after_finish_is_ignored_with_a_reason():
    stream = Stream().run("wl", gpus=1, at_="10:00").finish("wl", at_="10:30").run("wl", gpus=1, at_="10:40")
    outputs = fold(stream.tick("11:00").events)[1]
    assert [o.reason for o in outputs if isinstance(o, EventIgnored)] == [IgnoreReason.AFTER_FINISH]
    assert sum(row.gpu_hours for row in rows(outputs)) == Decimal("0.5")


def test_out_of_order_end_before_start_within_the_open_hour_is_not_a_correction():
    stream = Stream().finish("wl", at_="10:30").run("wl", gpus=1, at_="10:00").tick("11:00")
    (row,) = rows(fold(stream.events)[1])
    assert row.gpu_hours == Decimal("0.5") and row.charge_class is ChargeClass.REGULAR


# --------------------------------------------------------------------------- idempotency and ids


def scenario() -> list:
    stream = (
        Stream()
        .prices()
        .namespace("ml-team", "cc-ml")
        .namespace("vision", "cc-vision")
        .reserve("a", gpus=16, at_="09:10")
        .expire("a", at_="09:15")
        .reserve("a", gpus=16, at_="09:20")
        .run("a", gpus=16, cpu_milli=32000, at_="09:50")
        .reserve("b", gpus=4, ns="vision", at_="09:55")
        .run("b", pod="p0", gpus=2, ns="vision", at_="10:05")
        .tick("10:00")
        .tick("11:00")
        .run("b", pod="p1", gpus=2, ns="vision", at_="10:20")  # late: correction of hour 10
        .evict("a", at_="11:30")
        .reserve("a", gpus=16, at_="11:40")
        .tick("12:00")
        .finish("b", at_="12:10")
        .run("a", gpus=16, at_="12:15")
        .finish("a", at_="13:45")
        .tick("14:00")
    )
    return stream.events


def test_reapplying_a_seen_event_changes_nothing():
    state, _ = fold(scenario()[:8])
    before = json.dumps(state_to_dict(state), sort_keys=True)
    for event in scenario()[:8]:
        if isinstance(event, ClockTick):
            continue
        state, outputs = apply(state, event)
        assert outputs == []
    assert json.dumps(state_to_dict(state), sort_keys=True) == before


def test_duplicated_delivery_of_the_whole_stream_gives_the_same_ledger():
    events = scenario()
    doubled = [event for event in events for _ in (0, 1)]
    assert rows(fold(doubled)[1]) == rows(fold(events)[1])


def test_row_ids_are_deterministic_and_unique():
    first, second = rows(fold(scenario())[1]), rows(fold(scenario())[1])
    assert [row.row_id for row in first] == [row.row_id for row in second]
    assert len({row.row_id for row in first}) == len(first)
    row = first[0]
    assert row.row_id == row_id(
        row.workload_uid, row.flavor, row.usage_kind, row.charge_period_start_ms, row.revision
    )


def test_state_round_trips_through_json_mid_stream_with_an_identical_ledger():
    events = scenario()
    _, straight = fold(events)
    for split in range(len(events) + 1):
        state, head = fold(events[:split])
        restored = state_from_dict(json.loads(json.dumps(state_to_dict(state))))
        assert state_to_dict(restored) == state_to_dict(state)
        _, tail = fold(events[split:], restored)
        assert head + tail == straight, f"split at {split}"


def test_finished_workloads_are_forgotten_after_the_horizon():
    state = initial_state(CostSettings(correction_horizon_ms=HOUR))
    stream = Stream().run("wl", gpus=1, at_="10:00").finish("wl", at_="10:30").tick("11:00").tick("13:00")
    state, _ = fold(stream.events, state)
    assert "wl" not in state.books and "wl" in state.forgotten
    state, outputs = apply(state, Stream().stop("wl", at_="13:00").events[0])
    assert [o.reason for o in outputs if isinstance(o, EventIgnored)] == [IgnoreReason.FORGOTTEN_WORKLOAD]
