"""What the cost service hands on by cost center for each ledger row: its facts (ADR 0044).

The fold keys its ledger rows by workload (``qm.billing``), while budgets are kept per cost
center, so the rows are re-keyed onto the internal ``<app id>-by-cost-center`` topic (ADR
0033, 0036). The allocation view and the budgets read 14 of a row's ~45 fields there, so that
is what travels: a bundle record ``{"facts": [[...], ...]}``, each row an array in
:class:`RowFacts`' field order. Whole ledger row envelopes (an array of them, or one), as the
service wrote them before, are read too.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from services.contracts.codec import ContractError, from_document, parse
from services.contracts.events import LedgerRow

__all__ = ["BUNDLE_ROWS_MAX", "LEDGER_ROW", "RowFacts", "bundles", "facts_from_list", "facts_of", "row_facts", "rows_in"]

LEDGER_ROW = LedgerRow.EVENT_TYPE
#: Most rows one by-cost-center record carries.
BUNDLE_ROWS_MAX = 100


class RowFacts(NamedTuple):
    """What the allocation view and the budgets read of a ledger row: 14 of its ~45 fields.
    The fold hands these on by cost center, not the whole row (ADR 0044). ``x_GpuHours`` is
    resolved here (a row without it counts its pricing quantity when priced per GPU-hour)."""

    row_id: str
    correlation_id: str | None
    occurred_at: str
    ChargePeriodStart: str
    SubAccountId: str
    x_CostCenter: str
    x_UsageKind: str
    SkuId: str
    x_GpuHours: str
    x_CoreHours: str
    BilledCost: str
    ContractedCost: str
    BillingCurrency: str
    Tags: dict[str, str]


_OPTIONAL_FACTS = frozenset({"correlation_id"})


def facts_of(envelope: Any) -> RowFacts:
    """A ledger row envelope's facts."""
    row = envelope.payload
    return RowFacts(
        envelope.event_id,
        envelope.correlation_id,
        envelope.occurred_at,
        row.ChargePeriodStart,
        row.SubAccountId,
        row.x_CostCenter,
        row.x_UsageKind,
        row.SkuId,
        row.x_GpuHours or (row.PricingQuantity if row.PricingUnit == "GPU-Hours" else "0"),
        row.x_CoreHours or "0",
        row.BilledCost,
        row.ContractedCost,
        row.BillingCurrency,
        dict(row.Tags or {}),
    )


def facts_from_list(item: Any) -> RowFacts:
    """Facts as they travel (a JSON array in RowFacts' field order), checked field by field:
    a wrong one is named (``facts[5] x_CostCenter: expected a string, got int``)."""
    if not isinstance(item, list) or len(item) != len(RowFacts._fields):
        got = f"{len(item)} items" if isinstance(item, list) else type(item).__name__
        raise ContractError("facts", f"expected an array of {len(RowFacts._fields)} items {list(RowFacts._fields)}, got {got}")
    for index, (name, value) in enumerate(zip(RowFacts._fields, item, strict=True)):
        expected = dict if name == "Tags" else str
        if isinstance(value, expected) or (value is None and name in _OPTIONAL_FACTS):
            continue
        raise ContractError(f"facts[{index}] {name}", f"expected {'an object' if expected is dict else 'a string'}, "
                                                      f"got {type(value).__name__}")
    return RowFacts._make(item)


def bundles(facts: list[RowFacts]) -> list[bytes]:
    """One cost center's row facts of a batch as by-cost-center records, ``{"facts": [[...],
    ...]}`` with at most BUNDLE_ROWS_MAX rows each, in order (ADR 0044)."""
    return [orjson.dumps({"facts": [list(f) for f in facts[i:i + BUNDLE_ROWS_MAX]]})
            for i in range(0, len(facts), BUNDLE_ROWS_MAX)]


def rows_in(value: bytes) -> list[Any]:
    """The rows of a by-cost-center record, each still to be read (``row_facts``): a facts
    bundle (ADR 0044), or, as the service wrote them before, an array of ledger row envelopes
    or one row envelope."""
    document = parse(value)
    if isinstance(document, dict) and "facts" in document:
        if not isinstance(document["facts"], list):
            raise ContractError("facts", f"expected an array of row facts, got {type(document['facts']).__name__}")
        return document["facts"]
    return document if isinstance(document, list) else [document]


def row_facts(row: Any) -> RowFacts:
    """One row of a by-cost-center record: facts (an array) or a whole ledger row envelope."""
    if isinstance(row, list):
        return facts_from_list(row)
    envelope = from_document(row)
    if envelope.event_type != LEDGER_ROW:
        raise ContractError(f"event_type {envelope.event_type!r}", f"expected {LEDGER_ROW}")
    return facts_of(envelope)


