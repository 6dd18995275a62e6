"""Ledger rows as FOCUS 1.2 records (the ``qm.billing`` payload and the export format).

A record is a dict of column → JSON-able value: decimals as plain strings (``"1.333333333"``,
never exponent notation, so nothing is lost through JSON), date-times as UTC ISO-8601 with
``Z`` (``ChargePeriodStart`` inclusive, ``ChargePeriodEnd`` exclusive), ``Tags`` as a
string→string object, nulls as ``None``. Columns that FOCUS does not define start with
``x_``.

Mapping choices (ADR 0004): one row per (workload, flavor, usage kind, hour); the cost columns
cover every resource of the row (GPU, CPU, memory), ``PricingQuantity``/``ConsumedQuantity``
is the primary quantity (GPU-hours when the row has GPU usage, else core-hours) and the
per-resource quantities are in ``x_GpuHours``, ``x_CoreHours``, ``x_MemoryGiBHours``. This is
internal chargeback, so ``BilledCost = EffectiveCost = ContractedCost`` (contracted price)
and ``ListCost`` uses the list price. Late-event deltas have ``ChargeClass=Correction``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any, Final

from services.core.cost.model import ChargeClass, LedgerRow
from services.core.cost.units import iso_utc, month_bounds_ms, parse_iso_utc_ms

__all__ = [
    "CUSTOM_COLUMNS",
    "DATETIME_COLUMNS",
    "DECIMAL_COLUMNS",
    "FOCUS_COLUMNS",
    "REQUIRED_COLUMNS",
    "focus_record",
    "round_costs",
    "validate_focus_record",
]

PROVIDER: Final = "Quartermaster"

#: FOCUS-defined columns we emit, alphabetical as the specification lists them.
FOCUS_COLUMNS: Final = (
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingAccountType",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "SubAccountType",
    "Tags",
)
CUSTOM_COLUMNS: Final = (
    "x_CostCenter",
    "x_UsageKind",
    "x_RowId",
    "x_Revision",
    "x_GpuHours",
    "x_CoreHours",
    "x_MemoryGiBHours",
    "x_Priced",
)
ALL_COLUMNS: Final = FOCUS_COLUMNS + CUSTOM_COLUMNS

#: Columns that must be present and non-null in every record.
REQUIRED_COLUMNS: Final = (
    "BilledCost",
    "BillingAccountId",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingQuantity",
    "PricingUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ProviderName",
    "PublisherName",
    "ResourceId",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SubAccountId",
    "Tags",
    "x_CostCenter",
    "x_UsageKind",
    "x_RowId",
)
DECIMAL_COLUMNS: Final = (
    "BilledCost",
    "ContractedCost",
    "EffectiveCost",
    "ListCost",
    "PricingQuantity",
    "ConsumedQuantity",
    "x_GpuHours",
    "x_CoreHours",
    "x_MemoryGiBHours",
)
COST_COLUMNS: Final = ("BilledCost", "ContractedCost", "EffectiveCost", "ListCost")
DATETIME_COLUMNS: Final = ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd")
CHARGE_CATEGORIES: Final = frozenset({"Usage", "Purchase", "Tax", "Credit", "Adjustment"})
_CURRENCY_RE: Final = re.compile(r"^[A-Z]{3}$")
_DATETIME_RE: Final = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


def _plain(value: Decimal) -> str:
    """Fixed-point text, never exponent notation (quantities keep their 9 places)."""
    text = format(value, "f")
    return "0" if text == "-0" else text


def _amount(value: Decimal) -> str:
    """A cost without trailing zeros: ``3.3333333325``, ``0``, ``-2.66``."""
    return _plain(value.normalize()) if value else "0"


def focus_record(row: LedgerRow, billing_account_id: str = "quartermaster") -> dict[str, Any]:
    """The FOCUS record of a ledger row (every column of :data:`ALL_COLUMNS`, in that order)."""
    has_gpu = row.gpu_hours != 0
    # each quantity's text once: a row names each twice (format() was ~8% of the cost fold)
    gpu_hours, core_hours, memory_gib_hours = _plain(row.gpu_hours), _plain(row.core_hours), _plain(row.memory_gib_hours)
    quantity, unit = (gpu_hours, "GPU-Hours") if has_gpu else (core_hours, "Core-Hours")
    contracted = _amount(row.contracted_cost)
    billed = contracted if row.billed_cost == row.contracted_cost else _amount(row.billed_cost)
    effective = contracted if row.effective_cost == row.contracted_cost else _amount(row.effective_cost)
    period_start, period_end = month_bounds_ms(row.charge_period_start_ms)
    who = f"{row.namespace}/{row.workload_name or row.workload_uid}"
    description = (
        f"{row.usage_kind} {row.flavor} for {who}: {gpu_hours} GPU-hours, "
        f"{core_hours} core-hours, {memory_gib_hours} GiB-hours"
    )
    if row.charge_class is ChargeClass.CORRECTION:
        description = f"correction (revision {row.revision}) of {description}"
    if not row.priced:
        description += f"; no price for flavor {row.flavor}"
    return {
        "BilledCost": billed,
        "BillingAccountId": billing_account_id,
        "BillingAccountName": billing_account_id,
        "BillingAccountType": "Cluster",
        "BillingCurrency": row.currency,
        "BillingPeriodEnd": iso_utc(period_end),
        "BillingPeriodStart": iso_utc(period_start),
        "ChargeCategory": "Usage",
        "ChargeClass": row.charge_class.value or None,
        "ChargeDescription": description,
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodEnd": iso_utc(row.charge_period_end_ms),
        "ChargePeriodStart": iso_utc(row.charge_period_start_ms),
        "ConsumedQuantity": quantity,
        "ConsumedUnit": unit,
        "ContractedCost": contracted,
        "EffectiveCost": effective,
        "InvoiceIssuerName": PROVIDER,
        "ListCost": _amount(row.list_cost),
        "PricingCategory": "Standard",
        "PricingQuantity": quantity,
        "PricingUnit": unit,
        "ProviderName": PROVIDER,
        "PublisherName": PROVIDER,
        "ResourceId": row.workload_uid,
        "ResourceName": row.workload_name or row.workload_uid,
        "ResourceType": "Workload",
        "ServiceCategory": "AI and Machine Learning" if has_gpu else "Compute",
        "ServiceName": "Quartermaster GPU Workloads",
        "ServiceSubcategory": "Machine Learning" if has_gpu else "Containers",
        "SkuId": row.flavor,
        "SkuPriceId": f"{row.flavor}/{row.usage_kind}",
        "SubAccountId": row.namespace,
        "SubAccountName": row.namespace,
        "SubAccountType": "Namespace",
        "Tags": dict(row.tags),
        "x_CostCenter": row.cost_center,
        "x_UsageKind": str(row.usage_kind),
        "x_RowId": row.row_id,
        "x_Revision": row.revision,
        "x_GpuHours": gpu_hours,
        "x_CoreHours": core_hours,
        "x_MemoryGiBHours": memory_gib_hours,
        "x_Priced": row.priced,
    }


def round_costs(record: Mapping[str, Any], places: int) -> dict[str, Any]:
    """A copy with the cost columns rounded ROUND_HALF_EVEN to ``places`` decimals (export only)."""
    exponent = Decimal(1).scaleb(-places)
    rounded = dict(record)
    for column in COST_COLUMNS:
        value = record.get(column)
        if value not in (None, ""):
            rounded[column] = _plain(Decimal(str(value)).quantize(exponent, rounding=ROUND_HALF_EVEN))
    return rounded


def _is_null(value: Any) -> bool:
    return value is None or value == ""


def validate_focus_record(record: Mapping[str, Any]) -> list[str]:
    """Problems with a FOCUS record (JSON form or a CSV row of strings); empty when valid."""
    problems: list[str] = []
    for column in REQUIRED_COLUMNS:
        if column not in record:
            problems.append(f"{column}: missing")
        elif _is_null(record[column]) and column != "Tags":
            problems.append(f"{column}: null")
    for column in record:
        if column not in FOCUS_COLUMNS and not column.startswith("x_"):
            problems.append(f"{column}: not a FOCUS column and not x_-prefixed")
    for column in DECIMAL_COLUMNS:
        value = record.get(column)
        if _is_null(value):
            continue
        if isinstance(value, float) or isinstance(value, bool):
            problems.append(f"{column}: {value!r} must be a decimal string, not a float")
            continue
        try:
            if not Decimal(str(value)).is_finite():
                problems.append(f"{column}: {value!r} is not finite")
        except InvalidOperation:
            problems.append(f"{column}: {value!r} is not a decimal")
    moments: dict[str, int] = {}
    for column in DATETIME_COLUMNS:
        value = record.get(column)
        if _is_null(value):
            continue
        if not isinstance(value, str) or not _DATETIME_RE.match(value):
            problems.append(f"{column}: {value!r} is not UTC ISO-8601 (YYYY-MM-DDTHH:MM:SSZ)")
            continue
        moments[column] = parse_iso_utc_ms(value)
    for start, end in (("ChargePeriodStart", "ChargePeriodEnd"), ("BillingPeriodStart", "BillingPeriodEnd")):
        if start in moments and end in moments and not moments[start] < moments[end]:
            problems.append(f"{start} must be before {end}")
    if "ChargePeriodStart" in moments and "BillingPeriodStart" in moments and "BillingPeriodEnd" in moments:
        if not moments["BillingPeriodStart"] <= moments["ChargePeriodStart"] < moments["BillingPeriodEnd"]:
            problems.append("ChargePeriodStart is outside the billing period")
    currency = record.get("BillingCurrency")
    if not _is_null(currency) and not (isinstance(currency, str) and _CURRENCY_RE.match(currency)):
        problems.append(f"BillingCurrency: {currency!r} is not an ISO 4217 code")
    category = record.get("ChargeCategory")
    if not _is_null(category) and category not in CHARGE_CATEGORIES:
        problems.append(f"ChargeCategory: {category!r} is not one of {sorted(CHARGE_CATEGORIES)}")
    charge_class = record.get("ChargeClass")
    if not _is_null(charge_class) and charge_class != "Correction":
        problems.append(f"ChargeClass: {charge_class!r} must be null or Correction")
    tags = record.get("Tags")
    if isinstance(tags, str) and tags:
        try:
            tags = json.loads(tags)
        except ValueError:
            problems.append("Tags: not a JSON object")
            tags = {}
    if not _is_null(tags) and not (
        isinstance(tags, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items())
    ):
        problems.append("Tags: must be an object of string keys and string values")
    return problems
