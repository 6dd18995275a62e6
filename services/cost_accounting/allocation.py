"""The read-only allocation view in OpenCost's shape (``/allocation?window=&aggregate=``), pure.

The service keeps a compact copy of each ledger row it published (:func:`compact_row`), in
one record per by-cost-center record (ADR 0044); :func:`rows_of` reads each row id once. This
module turns those into OpenCost-like allocation sets:

``GET /allocation?window=2026-11-29T00:00:00Z,2026-11-30T00:00:00Z&aggregate=namespace``
``GET /allocation?window=24h&aggregate=label:quartermaster.dev/cost-center``

Relative windows (``24h``, ``7d``) end at the latest charge period end in the ledger (event
time, never the wall clock). ``label:<key>`` groups by the namespace label the row's cost
center came from (``x_CostCenter``) when the key is the cost-center label, else by the
workload's tag; rows without it go to ``__unallocated__`` as OpenCost does.

Per group: ``gpuHours`` (running + reserved-idle), ``idle`` (reserved-idle GPU-hours),
``gpuCost`` (GPU-hours x the GPU contracted price of the row's flavor, when priced),
``cpuCoreHours``, ``totalCost`` (BilledCost: GPU, CPU and memory).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from services.core.cost import PriceList
from services.core.cost.units import iso_utc, parse_iso_utc_ms

if TYPE_CHECKING:
    from services.cost_accounting.row_facts import RowFacts

__all__ = ["AllocationError", "aggregate", "compact_row", "parse_window"]

UNALLOCATED = "__unallocated__"
_RELATIVE = re.compile(r"^(\d+)([hd])$")


class AllocationError(ValueError):
    pass


def compact_row(facts: RowFacts) -> list[Any]:
    """[start_ms, namespace, cost center, usage kind, flavor, gpu h, core h, billed cost, tags]."""
    return [
        parse_iso_utc_ms(facts.ChargePeriodStart),
        facts.SubAccountId,
        facts.x_CostCenter,
        facts.x_UsageKind,
        facts.SkuId,
        facts.x_GpuHours,
        facts.x_CoreHours,
        facts.BilledCost,
        dict(facts.Tags),
    ]


def parse_window(window: str, latest_end_ms: int | None) -> tuple[int, int]:
    text = (window or "").strip()
    match = _RELATIVE.match(text)
    if match:
        if latest_end_ms is None:
            return 0, 0
        span = int(match.group(1)) * (3_600_000 if match.group(2) == "h" else 86_400_000)
        return latest_end_ms - span, latest_end_ms
    if "," in text:
        start, end = (part.strip() for part in text.split(",", 1))
        try:
            lo, hi = parse_iso_utc_ms(start), parse_iso_utc_ms(end)
        except ValueError as error:
            raise AllocationError(f"window {window!r}: {error}") from None
        if lo >= hi:
            raise AllocationError(f"window {window!r}: start must be before end")
        return lo, hi
    raise AllocationError(f"window {window!r}: use Nh, Nd or <start>,<end> (UTC ISO-8601)")


def _group(row: list[Any], aggregate: str, cost_center_label: str) -> str:
    if aggregate == "namespace":
        return row[1]
    if aggregate == "costcenter":
        return row[2]
    if aggregate.startswith("label:"):
        key = aggregate[len("label:") :]
        if key == cost_center_label:
            return row[2]
        return row[8].get(key, UNALLOCATED)
    raise AllocationError(f"aggregate {aggregate!r}: use namespace or label:<key>")


def aggregate(
    rows: Iterable[list[Any]],
    *,
    window: str,
    aggregate_by: str,
    cost_center_label: str,
    price_list: PriceList | None,
) -> dict[str, Any]:
    materialized = list(rows)
    latest = max((r[0] + 3_600_000 for r in materialized), default=None)
    lo, hi = parse_window(window, latest)
    groups: dict[str, dict[str, Decimal]] = {}
    for row in materialized:
        if not lo <= row[0] < hi:
            continue
        name = _group(row, aggregate_by, cost_center_label)
        acc = groups.setdefault(
            name, {k: Decimal(0) for k in ("gpuHours", "idle", "gpuCost", "cpuCoreHours", "totalCost")}
        )
        gpu = Decimal(row[5])
        acc["gpuHours"] += gpu
        if row[3] == "reserved-idle":
            acc["idle"] += gpu
        acc["cpuCoreHours"] += Decimal(row[6])
        acc["totalCost"] += Decimal(row[7])
        prices = price_list.prices_for(row[4]) if price_list is not None else None
        if prices is not None:
            acc["gpuCost"] += gpu * prices.gpu.contracted_price
    window_doc = {"start": iso_utc(lo), "end": iso_utc(hi)}
    data = {
        name: {"name": name, "window": window_doc, **{k: float(v) for k, v in sorted(acc.items())}}
        for name, acc in sorted(groups.items())
    }
    return {"code": 200, "data": [data]}


def rows_of(values: Iterable[Mapping[str, Any] | None]) -> Iterator[list[Any]]:
    """Compact rows out of the allocation table's values, each row id once: a value holds the
    rows of one by-cost-center record (ADR 0044), and a row sent again after a restart may be
    in two. Values stored one per row id, as before, read the same way."""
    seen: set[str] = set()
    for entry in values:
        state = (entry or {}).get("state") or {}
        for row_id, row in state.get("rows", {}).items():
            if row_id not in seen:
                seen.add(row_id)
                yield row
