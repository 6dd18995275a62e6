"""Budgets per cost center, folded from the service's own ledger rows (ADR 0007), pure.

Rows of ``qm.billing`` (keyed by workload uid) are re-keyed by cost center onto an internal
topic; this fold keeps, per cost center, the month-to-date GPU nano-hours and contracted cost
per currency, and the thresholds already alerted. Row-id dedupe is the runtime's
(``apply_once``: the row's event id *is* its row id). Outputs are the core's
:class:`BudgetStatus` / :class:`BudgetAlert`, turned into bus messages by ``outputs_for``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from services.core.cost import Budget, BudgetAlert, BudgetStatus, BudgetUnit
from services.core.cost.units import EXACT, nano_to_decimal
from services.cost_accounting.row_facts import RowFacts

__all__ = ["budget_step"]

_PCT = Decimal("0.01")


def _month(iso: str) -> str:
    return iso[:7]


def budget_step(
    state: dict[str, Any] | None, row: RowFacts, budgets: Iterable[Budget], at_ms: int
) -> tuple[dict[str, Any], list[BudgetAlert | BudgetStatus]]:
    """One ledger row's facts (any revision: corrections are deltas) into its cost center's budgets.

    ``state``: ``{"usage": {month: [gpu nano-hours, {currency: cost text}]}, "alerts": [[budget, month, pct]]}``."""
    state = state or {"usage": {}, "alerts": []}
    usage = {month: [value[0], dict(value[1])] for month, value in state["usage"].items()}
    alerts = [list(a) for a in state["alerts"]]
    month = _month(row.ChargePeriodStart)
    entry = usage.setdefault(month, [0, {}])
    entry[0] += int(Decimal(row.x_GpuHours).scaleb(9))
    costs = entry[1]
    costs[row.BillingCurrency] = str(EXACT.add(Decimal(costs.get(row.BillingCurrency, "0")), Decimal(row.ContractedCost)))
    outputs: list[BudgetAlert | BudgetStatus] = []
    for budget in budgets:
        if budget.cost_center != row.x_CostCenter:
            continue
        if budget.unit is BudgetUnit.GPU_HOURS:
            used = nano_to_decimal(entry[0])
        else:
            used = Decimal(costs.get(budget.currency, "0"))
        for threshold in budget.thresholds_pct:
            key = [budget.name, month, threshold]
            if key in alerts or used * 100 < budget.limit * threshold:
                continue
            alerts.append(key)
            digest = hashlib.sha256(f"{budget.name}\x1f{month}\x1f{threshold}".encode()).hexdigest()[:32]
            outputs.append(
                BudgetAlert(digest, budget.name, budget.cost_center, month, threshold, budget.unit, used, budget.limit, at_ms)
            )
        pct = (EXACT.multiply(used, Decimal(100)) / budget.limit).quantize(_PCT, rounding=ROUND_HALF_EVEN)
        outputs.append(
            BudgetStatus(
                budget.name, budget.cost_center, month, budget.unit, budget.limit, used,
                EXACT.subtract(budget.limit, used), pct, at_ms,
            )
        )
    return {"usage": usage, "alerts": alerts}, outputs
