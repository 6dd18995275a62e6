"""The service's fold: envelope → translate → core ``apply`` → bus outputs (no faust here).

The table holds one value under :data:`LEDGER_KEY` (ADR 0007)::

    {"v": <int, bumped per stored change>, "core": json text of state_to_dict(CostState), "memos": {uid: memo}}

``core`` is stored as text: its exact usage sums (milli-bytes x milliseconds) exceed 64 bits,
which orjson (faust's serializer) refuses; the standard ``json`` module keeps big integers.

:class:`LedgerFold` keeps the live :class:`CostState` between calls so an event does not
re-parse the whole state; it re-parses whenever the stored value is not the one it
produced last (restart, recovery, an aborted publish).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from services.contracts.codec import Envelope, make_envelope
from services.contracts.events import AlertRaised
from services.contracts.events import BudgetStatus as BudgetStatusRecord
from services.contracts.events import LedgerRow as LedgerRowRecord
from services.core.cost import (
    BudgetAlert,
    BudgetStatus,
    CostOutput,
    CostState,
    EventIgnored,
    LedgerRow,
    apply,
    focus_record,
    initial_state,
    state_from_dict,
    state_to_dict,
)
from services.cost_accounting.config import CostConfig
from services.cost_accounting.translate import WorkloadMemo, translate, workload_uid_of

__all__ = ["LEDGER_KEY", "PRODUCER", "LedgerFold", "OutputMessage", "outputs_for", "row_envelope"]

LEDGER_KEY = "ledger"
PRODUCER = "cost-accounting"
log = logging.getLogger("qm.cost-accounting")


@dataclass(frozen=True, slots=True)
class OutputMessage:
    """Topic, key, envelope (the runtime's ``Output`` has the same fields)."""

    topic: str
    key: str
    envelope: Envelope


def _plain(value: Decimal) -> str:
    text = format(value, "f")
    return "0" if text in ("-0", "") else text


def row_envelope(row: LedgerRow, cause: Envelope | None, billing_account_id: str) -> Envelope:
    """A ledger row as ``billing.ledger_row.v1``; its event id **is** the row id."""
    record = focus_record(row, billing_account_id)
    return Envelope(
        event_id=row.row_id,
        event_type=LedgerRowRecord.EVENT_TYPE,
        occurred_at=cause.occurred_at if cause else record["ChargePeriodEnd"],
        producer=PRODUCER,
        payload=LedgerRowRecord(row_id=row.row_id, **record),
        correlation_id=(cause.correlation_id or cause.event_id) if cause else None,
        causation_id=cause.event_id if cause else None,
    )


def _severity(threshold: int) -> str:
    return "critical" if threshold >= 100 else "warning" if threshold >= 80 else "info"


def outputs_for(
    produced: list[CostOutput], cause: Envelope, billing_account_id: str, on_ignored: Callable[[EventIgnored], None]
) -> list[OutputMessage]:
    out: list[OutputMessage] = []
    for item in produced:
        if isinstance(item, LedgerRow):
            out.append(OutputMessage("qm.billing", item.workload_uid, row_envelope(item, cause, billing_account_id)))
        elif isinstance(item, BudgetStatus):
            crossed = [t for t in (50, 80, 100) if item.used * 100 >= item.limit * t]
            record = BudgetStatusRecord(
                cost_center=item.cost_center,
                period=item.month,
                unit=str(item.unit),
                limit=_plain(item.limit),
                used=_plain(item.used),
                remaining=_plain(item.remaining),
                exhausted=item.used >= item.limit,
                thresholds_crossed=crossed,
            )
            envelope = make_envelope(
                record,
                producer=PRODUCER,
                occurred_at=cause.occurred_at,
                identity=(item.budget_name, item.month, _plain(item.used)),
                cause=cause,
            )
            out.append(OutputMessage("qm.budgets", item.cost_center, envelope))
        elif isinstance(item, BudgetAlert):
            record = AlertRaised(
                alert_id=item.alert_id,
                severity=_severity(item.threshold_pct),
                kind="BudgetThreshold",
                subject=item.cost_center,
                message=(
                    f"budget {item.budget_name} of cost center {item.cost_center} crossed {item.threshold_pct}% "
                    f"in {item.month}: {_plain(item.used)} of {_plain(item.limit)} {item.unit}"
                ),
            )
            envelope = make_envelope(record, producer=PRODUCER, occurred_at=cause.occurred_at, cause=cause)
            envelope = Envelope(**{**_fields(envelope), "event_id": item.alert_id})
            out.append(OutputMessage("qm.alerts", item.cost_center, envelope))
        elif isinstance(item, EventIgnored):
            on_ignored(item)
    return out


def _fields(envelope: Envelope) -> dict[str, Any]:
    return {name: getattr(envelope, name) for name in Envelope.__dataclass_fields__}


def _log_ignored(item: EventIgnored) -> None:
    log.warning("cost event ignored: %s (%s) %s", item.event_id, item.reason, item.message)


class LedgerFold:
    """``fold(stored, envelope) -> (stored, outputs)`` for ``ServiceRuntime.apply_once``."""

    def __init__(
        self,
        config: CostConfig,
        make_output: Callable[[str, str, Envelope], Any] = OutputMessage,
        on_ignored: Callable[[EventIgnored], None] = _log_ignored,
    ) -> None:
        self.config = config
        self.make_output = make_output
        self.on_ignored = on_ignored
        self._live: tuple[int, CostState, dict[str, dict[str, Any]]] | None = None

    def _load(self, stored: dict[str, Any] | None) -> tuple[int, CostState, dict[str, dict[str, Any]]]:
        if stored is None:
            cfg = self.config
            return 0, initial_state(cfg.settings, cfg.price_list, cfg.budgets), {}
        if self._live is not None and self._live[0] == stored["v"]:
            return self._live[0], self._live[1], dict(self._live[2])
        return stored["v"], state_from_dict(json.loads(stored["core"])), dict(stored["memos"])

    def _configure(self, state: CostState) -> None:
        """The configuration read at start wins over the stored one (it is the GitOps truth)."""
        cfg = self.config
        if state.settings != cfg.settings:
            state.settings = cfg.settings
        if state.price_list != cfg.price_list:
            state.price_list = cfg.price_list
        if state.budgets != cfg.budgets:
            state.budgets = cfg.budgets

    def __call__(self, stored: dict[str, Any] | None, envelope: Envelope) -> tuple[dict[str, Any], list[Any]]:
        version, state, memos = self._load(stored)
        self._live = None  # the live state is mutated below: trust it again only once stored
        self._configure(state)
        uid = workload_uid_of(envelope)
        memo_dict = memos.get(uid) if uid else None
        translation = translate(envelope, WorkloadMemo.from_dict(memo_dict) if memo_dict else None)
        produced: list[CostOutput] = []
        for event in translation.events:
            state, outputs = apply(state, event)
            produced.extend(outputs)
        if uid and translation.memo is not None:
            if uid in state.forgotten:
                memos.pop(uid, None)
            else:
                memos[uid] = translation.memo.to_dict()
        if state.forgotten:
            for gone in [u for u in memos if u in state.forgotten]:
                del memos[gone]
        messages = outputs_for(produced, envelope, state.settings.billing_account_id, self.on_ignored)
        new_version = version + 1
        self._live = (new_version, state, memos)
        stored_value = {"v": new_version, "core": json.dumps(state_to_dict(state), separators=(",", ":")), "memos": memos}
        return stored_value, [self.make_output(m.topic, m.key, m.envelope) for m in messages]
