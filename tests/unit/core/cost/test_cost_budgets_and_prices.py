"""Budgets per cost center (alerts at thresholds, status with remaining) and PriceList/Budget parsing."""

from __future__ import annotations

from decimal import Decimal

import pytest
from cost_builders import PRICE_LIST_DOC, Stream, at

from services.core.cost import (
    BudgetAlert,
    BudgetsConfigured,
    BudgetStatus,
    BudgetUnit,
    CostConfigError,
    budget_from_dict,
    fold,
    price_list_from_dict,
)
from services.core.cost.pricing import budget_to_dict, price_list_to_dict


def budget_doc(name="ml-gpu", cost_center="cc-ml", limit=None, thresholds=(50, 80, 100)):
    return {
        "apiVersion": "quartermaster.dev/v1alpha1",
        "kind": "Budget",
        "metadata": {"name": name},
        "spec": {
            "costCenter": cost_center,
            "period": "Monthly",
            "limit": limit or {"gpuHours": "10"},
            "thresholdsPercent": list(thresholds),
        },
    }


def with_budgets(stream: Stream, *docs) -> Stream:
    stream.events.append(BudgetsConfigured("budgets", tuple(budget_from_dict(d) for d in docs), at("00:00")))
    return stream


def test_gpu_hour_budget_alerts_once_per_threshold_and_reports_remaining():
    stream = with_budgets(Stream().namespace("ml-team", "cc-ml"), budget_doc())
    stream.run("wl", gpus=8, at_="10:00").tick("11:00").tick("12:00").tick("13:00")
    _, outputs = fold(stream.events)
    alerts = [o for o in outputs if isinstance(o, BudgetAlert)]
    assert [(a.threshold_pct, a.used, a.at_ms) for a in alerts] == [
        (50, Decimal(8), at("11:00")),
        (80, Decimal(8), at("11:00")),
        (100, Decimal(16), at("12:00")),
    ]
    statuses = [o for o in outputs if isinstance(o, BudgetStatus)]
    assert [(s.used, s.remaining, s.used_pct) for s in statuses] == [
        (Decimal(8), Decimal(2), Decimal("80.00")),
        (Decimal(16), Decimal(-6), Decimal("160.00")),
        (Decimal(24), Decimal(-14), Decimal("240.00")),
    ]
    assert statuses[0].month == "2023-07" and statuses[0].unit is BudgetUnit.GPU_HOURS
    assert len({a.alert_id for a in alerts}) == 3


def test_currency_budget_uses_effective_cost_and_ignores_other_cost_centers():
    doc = budget_doc(limit={"amount": "20", "currency": "USD"}, thresholds=(50,))
    stream = with_budgets(
        Stream().prices().namespace("ml-team", "cc-ml").namespace("vision", "cc-vision"), doc
    )
    stream.run("wl", gpus=8, at_="10:00").run("other", gpus=8, ns="vision", at_="10:00").tick("11:00")
    _, outputs = fold(stream.events)
    (status,) = [o for o in outputs if isinstance(o, BudgetStatus)]
    assert status.used == Decimal("19.20")  # 8 GPU-hours x 2.40 contracted
    assert [a.threshold_pct for a in outputs if isinstance(a, BudgetAlert)] == [50]


def test_namespace_without_cost_center_label_is_unallocated():
    (row,) = [o for o in fold(Stream().run("wl", gpus=1, at_="10:00").tick("11:00").events)[1]]
    assert row.cost_center == "unallocated"


def test_price_list_parses_and_round_trips():
    price_list = price_list_from_dict(PRICE_LIST_DOC)
    prices = price_list.prices_for("a100-flavor")
    assert prices.gpu.list_price == Decimal("3.20") and prices.gpu.contracted_price == Decimal("2.40")
    assert prices.memory.contracted_price == Decimal("0.005")  # defaults to list price
    assert price_list.prices_for("unknown").gpu.list_price == Decimal("1.00")
    assert price_list_from_dict(price_list_to_dict(price_list)) == price_list


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["spec"].update(currency="usd"), "spec.currency"),
        (
            lambda d: d["spec"]["flavors"][0]["resources"][0].update(listPrice="-1"),
            "spec.flavors[0].resources[0].listPrice",
        ),
        (
            lambda d: d["spec"]["flavors"][0]["resources"][1].update(name="tpu"),
            "spec.flavors[0].resources[1].name",
        ),
        (lambda d: d.update(kind="Budget"), "kind"),
    ],
)
def test_invalid_price_list_names_the_field(mutate, field):
    import copy

    doc = copy.deepcopy(PRICE_LIST_DOC)
    mutate(doc)
    with pytest.raises(CostConfigError) as error:
        price_list_from_dict(doc)
    assert error.value.field == field and "PriceList/default" in str(error.value)


def test_budget_parsing_and_errors():
    budget = budget_from_dict(budget_doc(thresholds=(100, 50, 80)))
    assert budget.thresholds_pct == (50, 80, 100) and budget.limit == Decimal(10)
    assert budget_from_dict(budget_to_dict(budget)) == budget
    with pytest.raises(CostConfigError, match="spec.limit"):
        budget_from_dict(budget_doc(limit={"gpuHours": "1", "amount": "2"}))
    with pytest.raises(CostConfigError, match="spec.limit.currency"):
        budget_from_dict(budget_doc(limit={"amount": "2"}))
