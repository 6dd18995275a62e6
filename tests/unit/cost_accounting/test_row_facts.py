"""row_facts: what the cost fold hands on by cost center (ADR 0044). The facts of the fold's own
rows survive the trip (bundle bytes and back), feed the allocation view and the budgets as the
whole rows did, and a wrong one is refused with an error naming the field."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import orjson
import pytest

from services.contracts.codec import ContractError, encode
from services.core.cost import Budget, BudgetUnit
from services.cost_accounting.allocation import aggregate, compact_row, rows_of
from services.cost_accounting.budgets import budget_step
from services.cost_accounting.cohort import fold_cohorts
from services.cost_accounting.config import CostConfig
from services.cost_accounting.row_facts import (
    BUNDLE_ROWS_MAX,
    RowFacts,
    bundles,
    facts_from_list,
    facts_of,
    row_facts,
    rows_in,
)
from tests.unit.cost_accounting.test_cohort_records import LABELS, stream, tick


def ledger_rows() -> list:
    _, outputs = fold_cohorts(CostConfig(), [("ml", e) for e in stream()], LABELS)
    return [o.envelope for o in outputs if o.topic == "qm.billing"]


def test_a_bundle_carries_each_rows_facts_and_reads_back_equal():
    envelopes = ledger_rows()
    facts = [facts_of(e) for e in envelopes]
    assert len(facts) > 5 and any(f.x_UsageKind == "reserved-idle" for f in facts)
    records = bundles(facts)
    assert len(records) == 1
    assert [row_facts(item) for item in rows_in(records[0])] == facts
    for envelope, fact in zip(envelopes, facts, strict=True):
        row = envelope.payload
        assert (fact.row_id, fact.correlation_id, fact.occurred_at) == (
            envelope.event_id, envelope.correlation_id, envelope.occurred_at)
        assert (fact.x_GpuHours, fact.BilledCost, fact.x_CostCenter) == (row.x_GpuHours, row.BilledCost, "cc-ml")
    # a fifth of the bytes the whole rows took
    assert len(records[0]) * 4 < sum(len(encode(e)) for e in envelopes)


def test_whole_rows_as_the_service_wrote_them_before_read_as_the_same_facts():
    envelopes = ledger_rows()
    facts = [facts_of(e) for e in envelopes]
    array = b"[" + b",".join(encode(e) for e in envelopes) + b"]"
    assert [row_facts(item) for item in rows_in(array)] == facts
    assert [row_facts(item) for item in rows_in(encode(envelopes[0]))] == facts[:1]


def test_bundles_hold_at_most_their_maximum_in_order():
    fact = facts_of(ledger_rows()[0])
    many = [fact._replace(row_id=f"r{i}") for i in range(BUNDLE_ROWS_MAX * 2 + 1)]
    records = bundles(many)
    assert [len(rows_in(r)) for r in records] == [BUNDLE_ROWS_MAX, BUNDLE_ROWS_MAX, 1]
    assert [row_facts(item).row_id for r in records for item in rows_in(r)] == [f.row_id for f in many]


def test_the_allocation_view_and_the_budgets_see_from_facts_what_they_saw_from_rows():
    envelopes = ledger_rows()
    from_facts = [compact_row(facts_of(e)) for e in envelopes]
    row = envelopes[0].payload
    assert from_facts[0][1:] == [row.SubAccountId, row.x_CostCenter, row.x_UsageKind, row.SkuId,
                                 row.x_GpuHours, row.x_CoreHours, row.BilledCost, dict(row.Tags)]
    view = aggregate(from_facts, window="2026-11-29T00:00:00Z,2026-11-30T00:00:00Z", aggregate_by="namespace",
                     cost_center_label="quartermaster.dev/cost-center", price_list=None)
    assert Decimal(str(view["data"][0]["ml-team"]["gpuHours"])) == sum(Decimal(e.payload.x_GpuHours) for e in envelopes)
    budget = Budget("ml", "cc-ml", BudgetUnit.GPU_HOURS, Decimal(1000), (50,))
    state = None
    for envelope in envelopes:
        state, outputs = budget_step(state, facts_of(envelope), [budget], 0)
    assert Decimal(outputs[-1].used) == sum(Decimal(e.payload.x_GpuHours) for e in envelopes)


def test_a_row_without_x_gpu_hours_counts_its_gpu_pricing_quantity():
    envelope = ledger_rows()[0]
    bare = dataclasses.replace(envelope, payload=dataclasses.replace(envelope.payload, x_GpuHours=None, x_CoreHours=None))
    facts = facts_of(bare)
    assert envelope.payload.PricingUnit == "GPU-Hours"
    assert (facts.x_GpuHours, facts.x_CoreHours) == (envelope.payload.PricingQuantity, "0")
    per_core = dataclasses.replace(bare, payload=dataclasses.replace(bare.payload, PricingUnit="Core-Hours"))
    assert facts_of(per_core).x_GpuHours == "0"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda item: item[:-1], "facts: expected an array of 14 items"),
        (lambda item: {**dict(zip(RowFacts._fields, item, strict=True))}, "facts: expected an array of 14 items"),
        (lambda item: item[:5] + [7] + item[6:], "facts[5] x_CostCenter: expected a string, got int"),
        (lambda item: item[:13] + [["team", "ml"]], "facts[13] Tags: expected an object, got list"),
        (lambda item: [None] + item[1:], "facts[0] row_id: expected a string, got NoneType"),
    ],
)
def test_a_wrong_fact_is_refused_naming_it(change, message):
    item = orjson.loads(bundles([facts_of(ledger_rows()[0])])[0])["facts"][0]
    with pytest.raises(ContractError) as caught:
        facts_from_list(change(item))
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_missing_correlation_id_is_allowed_and_a_record_that_is_not_facts_is_named():
    item = orjson.loads(bundles([facts_of(ledger_rows()[0])])[0])["facts"][0]
    item[1] = None
    assert facts_from_list(item).correlation_id is None
    with pytest.raises(ContractError, match="facts: expected an array of row facts, got str"):
        rows_in(b'{"facts": "none"}')
    with pytest.raises(ContractError, match="expected billing.ledger_row.v1"):
        row_facts(orjson.loads(encode(tick("10:00"))))


def test_the_allocation_view_reads_each_row_once_across_records():
    """A value per by-cost-center record; after a restart a row may be in two records, and
    values stored one per row id, as before ADR 0044, read the same way."""
    compact = {f.row_id: compact_row(f) for f in map(facts_of, ledger_rows()[:3])}
    first, second, third = compact
    values = [
        {"state": {"rows": {first: compact[first], second: compact[second]}}},
        {"state": {"rows": {second: compact[second], third: compact[third]}}},  # sent again with the next
        {"state": {"rows": {first: compact[first]}}},  # as stored before: one row per value
        None,
    ]
    assert list(rows_of(values)) == [compact[first], compact[second], compact[third]]
