"""``PriceList`` and ``Budget`` (``quartermaster.dev/v1alpha1``) from YAML-shaped dicts, and back.

The caller loads YAML (or JSON) into plain dicts; this module validates and builds the
frozen values. Errors name the object and the field: ``PriceList/default:
spec.flavors[0].resources[1].listPrice: '-1' is negative``.

PriceList::

    apiVersion: quartermaster.dev/v1alpha1
    kind: PriceList
    metadata:
      name: default
    spec:
      currency: USD                  # ISO 4217, applies to every price in the list
      flavors:
        - name: a100-flavor          # a Kueue ResourceFlavor name (the ledger's SkuId)
          resources:                 # price per unit-hour; quote prices as strings
            - name: nvidia.com/gpu   # per GPU-hour
              listPrice: "3.20"
              contractedPrice: "2.40"   # optional, defaults to listPrice
            - name: cpu              # per core-hour
              listPrice: "0.04"
            - name: memory           # per GiB-hour
              listPrice: "0.005"
      default:                       # optional: flavors not listed; without it they cost 0
        resources: [...]

Budget::

    apiVersion: quartermaster.dev/v1alpha1
    kind: Budget
    metadata:
      name: ml-monthly-gpu
    spec:
      costCenter: cc-ml
      period: Monthly                # UTC calendar month (the only period for now)
      limit:
        gpuHours: "5000"             # or: amount: "12000.00" + currency: USD
      thresholdsPercent: [50, 80, 100]
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from services.core.cost.model import Budget, BudgetUnit, FlavorPrices, PriceList, UnitPrice

__all__ = [
    "API_VERSION",
    "CostConfigError",
    "budget_from_dict",
    "budget_to_dict",
    "price_list_from_dict",
    "price_list_to_dict",
]

API_VERSION: Final = "quartermaster.dev/v1alpha1"
_CURRENCY_RE: Final = re.compile(r"^[A-Z]{3}$")
_RESOURCE_FIELDS: Final = {"nvidia.com/gpu": "gpu", "cpu": "cpu", "memory": "memory"}


class CostConfigError(ValueError):
    """A PriceList or Budget object is invalid; ``field`` is the path inside the object."""

    def __init__(self, obj: str, field: str, message: str) -> None:
        super().__init__(f"{obj}: {field}: {message}")
        self.obj = obj
        self.field = field
        self.message = message


def _decimal(value: Any, obj: str, path: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Decimal)):
        raise CostConfigError(obj, path, f"{value!r} is not a number")
    try:
        number = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    except InvalidOperation:
        raise CostConfigError(obj, path, f"{value!r} is not a number") from None
    if not number.is_finite():
        raise CostConfigError(obj, path, f"{value!r} is not a finite number")
    if number < 0:
        raise CostConfigError(obj, path, f"{value!r} is negative")
    return number


def _header(doc: Mapping[str, Any], kind: str) -> tuple[str, Mapping[str, Any]]:
    if not isinstance(doc, Mapping):
        raise CostConfigError(kind, "", "not a mapping")
    name = str((doc.get("metadata") or {}).get("name") or "")
    obj = f"{kind}/{name or '?'}"
    if doc.get("apiVersion") != API_VERSION:
        raise CostConfigError(obj, "apiVersion", f"must be {API_VERSION}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != kind:
        raise CostConfigError(obj, "kind", f"must be {kind}, got {doc.get('kind')!r}")
    if not name:
        raise CostConfigError(obj, "metadata.name", "is required")
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise CostConfigError(obj, "spec", "is required and must be a mapping")
    return obj, spec


def _currency(value: Any, obj: str, path: str) -> str:
    if not isinstance(value, str) or not _CURRENCY_RE.match(value):
        raise CostConfigError(obj, path, f"{value!r} is not an ISO 4217 currency code (e.g. USD)")
    return value


def _flavor_prices(spec: Any, obj: str, path: str) -> FlavorPrices:
    if not isinstance(spec, Mapping) or not isinstance(spec.get("resources"), list):
        raise CostConfigError(obj, f"{path}.resources", "is required and must be a list")
    prices: dict[str, UnitPrice] = {}
    for index, item in enumerate(spec["resources"]):
        item_path = f"{path}.resources[{index}]"
        if not isinstance(item, Mapping):
            raise CostConfigError(obj, item_path, "must be a mapping")
        resource = item.get("name")
        if resource not in _RESOURCE_FIELDS:
            raise CostConfigError(
                obj, f"{item_path}.name", f"{resource!r} is not one of {sorted(_RESOURCE_FIELDS)}"
            )
        if resource in prices:
            raise CostConfigError(obj, f"{item_path}.name", f"{resource} is listed twice")
        if "listPrice" not in item:
            raise CostConfigError(obj, f"{item_path}.listPrice", "is required")
        list_price = _decimal(item["listPrice"], obj, f"{item_path}.listPrice")
        contracted = item.get("contractedPrice", item["listPrice"])
        prices[resource] = UnitPrice(list_price, _decimal(contracted, obj, f"{item_path}.contractedPrice"))
    return FlavorPrices(**{_RESOURCE_FIELDS[name]: price for name, price in prices.items()})


def price_list_from_dict(doc: Mapping[str, Any]) -> PriceList:
    obj, spec = _header(doc, "PriceList")
    currency = _currency(spec.get("currency"), obj, "spec.currency")
    flavors: list[tuple[str, FlavorPrices]] = []
    seen: set[str] = set()
    for index, item in enumerate(spec.get("flavors") or []):
        path = f"spec.flavors[{index}]"
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not name:
            raise CostConfigError(obj, f"{path}.name", "is required")
        if name in seen:
            raise CostConfigError(obj, f"{path}.name", f"flavor {name} is listed twice")
        seen.add(name)
        flavors.append((name, _flavor_prices(item, obj, path)))
    default = spec.get("default")
    return PriceList(
        name=str(doc["metadata"]["name"]),
        currency=currency,
        flavors=tuple(flavors),
        default=None if default is None else _flavor_prices(default, obj, "spec.default"),
    )


def _prices_to_dict(prices: FlavorPrices) -> dict[str, Any]:
    resources = []
    for resource, attr in _RESOURCE_FIELDS.items():
        price: UnitPrice = getattr(prices, attr)
        resources.append(
            {
                "name": resource,
                "listPrice": str(price.list_price),
                "contractedPrice": str(price.contracted_price),
            }
        )
    return {"resources": resources}


def price_list_to_dict(price_list: PriceList) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "currency": price_list.currency,
        "flavors": [{"name": name, **_prices_to_dict(prices)} for name, prices in price_list.flavors],
    }
    if price_list.default is not None:
        spec["default"] = _prices_to_dict(price_list.default)
    return {
        "apiVersion": API_VERSION,
        "kind": "PriceList",
        "metadata": {"name": price_list.name},
        "spec": spec,
    }


def budget_from_dict(doc: Mapping[str, Any]) -> Budget:
    obj, spec = _header(doc, "Budget")
    cost_center = spec.get("costCenter")
    if not isinstance(cost_center, str) or not cost_center:
        raise CostConfigError(obj, "spec.costCenter", "is required")
    period = spec.get("period", "Monthly")
    if period != "Monthly":
        raise CostConfigError(obj, "spec.period", f"{period!r} is not supported (only Monthly)")
    limit = spec.get("limit")
    if not isinstance(limit, Mapping):
        raise CostConfigError(obj, "spec.limit", "is required (gpuHours, or amount + currency)")
    if ("gpuHours" in limit) == ("amount" in limit):
        raise CostConfigError(obj, "spec.limit", "set exactly one of gpuHours or amount")
    if "gpuHours" in limit:
        unit, amount, currency = (
            BudgetUnit.GPU_HOURS,
            _decimal(limit["gpuHours"], obj, "spec.limit.gpuHours"),
            "",
        )
    else:
        unit, amount = BudgetUnit.CURRENCY, _decimal(limit["amount"], obj, "spec.limit.amount")
        currency = _currency(limit.get("currency"), obj, "spec.limit.currency")
    if amount == 0:
        raise CostConfigError(obj, "spec.limit", "must be greater than zero")
    raw_thresholds = spec.get("thresholdsPercent", [50, 80, 100])
    if not isinstance(raw_thresholds, list) or not raw_thresholds:
        raise CostConfigError(obj, "spec.thresholdsPercent", "must be a non-empty list of integers")
    thresholds: list[int] = []
    for index, value in enumerate(raw_thresholds):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CostConfigError(
                obj, f"spec.thresholdsPercent[{index}]", f"{value!r} is not a positive integer"
            )
        thresholds.append(value)
    return Budget(
        name=str(doc["metadata"]["name"]),
        cost_center=cost_center,
        unit=unit,
        limit=amount,
        thresholds_pct=tuple(sorted(set(thresholds))),
        currency=currency,
    )


def budget_to_dict(budget: Budget) -> dict[str, Any]:
    limit: dict[str, Any] = (
        {"gpuHours": str(budget.limit)}
        if budget.unit is BudgetUnit.GPU_HOURS
        else {"amount": str(budget.limit), "currency": budget.currency}
    )
    return {
        "apiVersion": API_VERSION,
        "kind": "Budget",
        "metadata": {"name": budget.name},
        "spec": {
            "costCenter": budget.cost_center,
            "period": "Monthly",
            "limit": limit,
            "thresholdsPercent": list(budget.thresholds_pct),
        },
    }
