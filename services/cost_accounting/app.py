"""The cost-accounting service: a thin faust shell over ``services.core.cost`` (ADR 0007).

    QM_CONFIG_DIR=examples/seed python -m services.cost_accounting worker

One ordered input: ``qm.workloads`` (keyed by cohort key) carries, per key and in one order,
everything cost needs: reservations, running / finished pods and workloads, expiries,
evictions, and the queue-manager's per-cohort clock ticks. Plus two side inputs that are not
ordered with it: namespace labels (cost centers) from a :class:`LiveReplica` of ``qm.cluster``,
and the price list from ``QM_CONFIG_DIR`` (read at start).

Agents:

1. ``qm.workloads`` (batched: the ``ledger`` table's only writer): each cohort key is folded by
   :class:`CohortLedger` (records per workload uid + one per cohort key, co-partitioned with the
   source). Outputs: ``qm.billing`` (key workload uid, event id = row id), acknowledged before
   the batch's records are written (workload records before the cohort record). The rows'
   facts (``row_facts.RowFacts``: what the view and the budgets read, 14 of ~45 fields) go
   re-keyed by cost center onto ``<prefix><app id>-by-cost-center``: a batch's facts of one
   cost center as one record (ADR 0033, 0044); whole rows, as the service wrote them before,
   are read too. They are acknowledged before the batch's records are written as well.
2. ``<app id>-by-cost-center`` (batched) is folded into the ``allocation`` table
   (``GET /allocation``, one record per by-cost-center record) and, when budgets are
   configured, per cost center into ``qm.budgets`` / ``qm.alerts`` (dedupe by row id:
   ``apply_once``). The service does not read ``qm.billing`` back: at 71,000 rows that read
   was the replay's tail (ADR 0036).
"""

from __future__ import annotations

import os
import weakref
from types import SimpleNamespace
from typing import Any

import orjson

from services.adapters.live_replica import LiveReplica
from services.adapters.runtime import (
    BATCH_IDS_MAX,
    DUPLICATES_SKIPPED,
    Output,
    ServiceRuntime,
    TemporaryError,
    _current_batch,
    record_position,
)
from services.adapters.settings import Settings, milliseconds_env, whole_number_env
from services.adapters.take_batches import take_batches
from services.contracts.codec import ContractError, Envelope
from services.contracts.events import RECORD_TYPES
from services.contracts.schemas import topic_specs
from services.cost_accounting.allocation import AllocationError, aggregate, compact_row, rows_of
from services.cost_accounting.budgets import budget_step
from services.cost_accounting.cohort import FOLDED_TYPES, CohortLedger, stored, stored_records
from services.cost_accounting.config import load_config
from services.cost_accounting.ledger import outputs_for
from services.cost_accounting.row_facts import (
    BUNDLE_ROWS_MAX,
    LEDGER_ROW,
    RowFacts,
    bundles,
    facts_of,
    row_facts,
    rows_in,
)
from services.cost_accounting.translate import at_ms

SERVICE = "cost-accounting"
PARTITIONS = topic_specs()["qm.workloads"].partitions

settings = Settings.from_env(SERVICE)
runtime = ServiceRuntime(settings)
config = load_config(os.environ.get("QM_CONFIG_DIR"))
# Labels only name a row's cost center and are not ordered with qm.workloads anyway: a quarter
# of a second behind costs nothing, and spares a fetch per handful of pod facts.
# QM_LABELS_BEHIND_BY_MS=0: fetch as soon as anything is there (ADR 0028).
LABELS_BEHIND_BY_MS = milliseconds_env("QM_LABELS_BEHIND_BY_MS", 250, "cost-accounting",
                                      "fetch labels as soon as anything is there")
replica = LiveReplica(settings.kafka_bootstrap, {"qm.cluster": settings.topic("qm.cluster")},
                      behind_by_ms=LABELS_BEHIND_BY_MS or None)


def by_cost_center_topic_name(s: Settings = settings) -> str:
    return s.topic(f"{s.app_id}-by-cost-center")


by_cost_center = runtime.app.topic(
    by_cost_center_topic_name(), partitions=PARTITIONS, key_serializer="raw", value_serializer="raw", internal=True
)
ledger_table = runtime.table("ledger", partitions=PARTITIONS, help="cost books per workload uid, one record per cohort key")
budget_table = runtime.table("budgets", partitions=PARTITIONS, help="month-to-date budget usage per cost center")
allocation_table = runtime.table(
    "allocation", partitions=topic_specs()["qm.billing"].partitions, help="published ledger rows, one per row id"
)


def namespace_labels(namespace: str) -> dict[str, str] | None:
    found = replica.namespace(namespace)
    return None if found is None else dict(found["metadata"]["labels"])


ledger = CohortLedger(config, labels=namespace_labels, make_output=Output)


@runtime.app.task
async def follow_namespaces() -> None:
    await replica.run()


# -- 1. the ordered fold ---------------------------------------------------------------------


class _BatchStore:
    """The ledger table as the current batch sees it: staged writes first."""

    def __init__(self, batch) -> None:
        self.batch = batch

    def get(self, key: str) -> Any:
        staged = self.batch.staged(ledger_table, key) if self.batch is not None else None
        return staged if staged is not None else ledger_table.get(key)

    def items(self):
        merged = dict(ledger_table.items())
        if self.batch is not None:
            for (table_id, key), (_, _, value, _) in self.batch.writes.items():
                if table_id == id(ledger_table):
                    merged[key] = value
        return merged.items()


def _stage(batch, writes: dict[str, Any], event) -> None:
    """Stage in the batch in this order (workload records, then the cohort record): a key
    written again moves to the end, so the cohort record always follows its books."""
    if batch not in _joining:
        _joining.add(batch)
        staged = batch.writes  # not the batch itself: a flush holding its batch is a cycle
        batch.flushes.append(lambda: _join_books(staged))
    for key, value in writes.items():
        slot = (id(ledger_table), key)
        batch.writes.pop(slot, None)
        batch.writes[slot] = (ledger_table, key, value, event)


_joining: weakref.WeakSet[Any] = weakref.WeakSet()  # batches whose staged books are joined at commit


async def _join_books(staged: dict) -> list[Any]:
    """At the commit, before the staged values reach the table: each book the batch stores
    becomes its text, joined once (cohort.BookText), however many events touched it."""
    for slot, (table, key, value, event) in staged.items():
        if table is ledger_table:
            staged[slot] = (table, key, stored(value), event)
    return []


async def on_workload_event(envelope: Envelope, event) -> None:
    if envelope.event_type not in FOLDED_TYPES:
        return
    if not replica.caught_up.is_set():
        await replica.caught_up.wait()  # never price a row before the labels are known
    cohort = event.key.decode() if event.key else "~none"
    batch = _current_batch.get()
    try:
        result = ledger.step(cohort, _BatchStore(batch), envelope, record_position(event))
        if result is None:
            DUPLICATES_SKIPPED.labels(SERVICE, ledger_table.name).inc()
            return
        writes, outputs = result
        await runtime.publish(outputs)  # acknowledged before the batch's records are stored
        await _pass_rows_on(batch, outputs)
        if batch is None:
            for key, value in stored_records(writes).items():
                ledger_table[key] = value
        else:
            _stage(batch, writes, event)
    except BaseException:
        ledger.forget(cohort)  # the live state holds an event that will not be stored
        raise


# The ledger is read by billing, minutes or hours later; no decision waits on it. Answered as
# soon as anything was there, the fold fetched a handful of events at a time and woke the
# broker and itself ~10 times as often as it had to, on the cores the deciding services need:
# the broker gathers 256 KiB or waits 500 ms first (ADR 0061).
runtime.agent_fetch_min_bytes = whole_number_env(
    "QM_COST_FETCH_MIN_BYTES", 262144, "cost-accounting",
    "as QM_FETCH_MIN_BYTES says, by default answered as soon as anything is there", unit="a number of bytes") or None
runtime.agent_fetch_max_wait_ms = milliseconds_env(
    "QM_COST_FETCH_MAX_WAIT_MS", 500, "cost-accounting", "as QM_FETCH_MAX_WAIT_MS says (100 ms by default)") or None
runtime.consume("qm.workloads", on_workload_event, agent_name="fold_ledger", batched=True,
                reads=[RECORD_TYPES[t] for t in FOLDED_TYPES])


# -- 2. allocation view and budgets ----------------------------------------------------------


#: Most records one budgets batch takes: its row ids per cost center stay within
#: BATCH_IDS_MAX, so a replay onto a stored budget is recognised (ADR 0033).
BUDGET_BATCH_RECORDS = max(1, BATCH_IDS_MAX // BUNDLE_ROWS_MAX)


_facts_by_cost_center: weakref.WeakKeyDictionary[Any, dict[str, list[RowFacts]]] = weakref.WeakKeyDictionary()


async def _pass_rows_on(batch, outputs: list[Output]) -> None:
    """The facts of the fold's ledger rows, re-keyed by cost center, for the allocation view
    and the budgets (ADR 0036, 0044). In a batch they are gathered per cost center and sent as
    bundles when it commits, acknowledged before its ledger records are stored; outside one,
    one by one."""
    for output in outputs:
        if output.envelope.event_type != LEDGER_ROW:
            continue
        facts = facts_of(output.envelope)
        if batch is None:
            await (await by_cost_center.send(key=facts.x_CostCenter.encode(), value=bundles([facts])[0]))
            continue
        gathered = _facts_by_cost_center.get(batch)
        if gathered is None:
            gathered = _facts_by_cost_center[batch] = {}
            batch.flushes.append(_sender_of(gathered))
        gathered.setdefault(facts.x_CostCenter, []).append(facts)


def _sender_of(gathered: dict[str, list[RowFacts]]):
    """The batch's flush: its gathered facts as bundles; their acks are awaited at the commit."""
    async def send_bundles() -> list[Any]:
        return [await by_cost_center.send(key=center.encode(), value=bundle)
                for center, facts in gathered.items() for bundle in bundles(facts)]
    return send_bundles


def _budget_fold(state, envelope: Envelope):
    new_state, produced = budget_step(state, envelope.payload, config.budgets, at_ms(envelope.occurred_at))
    messages = outputs_for(produced, envelope, config.settings.billing_account_id, lambda _: None)
    return new_state, [Output(m.topic, m.key, m.envelope) for m in messages]


def _cause(facts: RowFacts) -> Envelope:
    """The row as the envelope the budget outputs name as their cause (its id, correlation, time)."""
    return Envelope(event_id=facts.row_id, event_type=LEDGER_ROW, occurred_at=facts.occurred_at,
                    producer=SERVICE, payload=facts, correlation_id=facts.correlation_id)


def _index_rows(batch, rows: dict[str, list[Any]], event) -> None:
    """The allocation view: one record per by-cost-center record, keyed by its place in the
    topic, holding the compact rows it carried by row id (ADR 0044). A redelivered record
    rewrites the same value; a row sent again in another record after a restart is stored
    twice and read once (``rows_of`` skips a row id it has seen)."""
    message = event.message
    key = f"{message.partition}:{message.offset}"
    value = {"state": {"rows": rows}}
    if batch is not None:
        batch.writes[(id(allocation_table), key)] = (allocation_table, key, value, event)
    else:
        allocation_table[key] = value


async def _fold_budget(event) -> None:
    try:
        rows = rows_in(event.value)
    except ContractError as error:
        await runtime.dead_letter("qm.billing", event, f"decode: {error}", kind="decode")
        return
    indexed: dict[str, list[Any]] = {}
    for index, row in enumerate(rows):
        try:
            facts = row_facts(row)
            if config.budgets:
                await runtime.apply_once(budget_table, facts.x_CostCenter, _cause(facts), _budget_fold)
            indexed[facts.row_id] = compact_row(facts)
        except TemporaryError:
            raise
        except Exception as error:  # noqa: BLE001
            # Dead-letter the row alone, named by its place in the record (the others are folded).
            where = f"row {index + 1} of {len(rows)} in the record" if len(rows) > 1 else "the row"
            runtime.log.exception("budget fold failed; row dead-lettered", detail=where)
            message = event.message
            await runtime.dead_letter_record(
                "qm.billing",
                SimpleNamespace(key=message.key, value=orjson.dumps(row), topic=message.topic,
                                partition=message.partition, offset=message.offset),
                f"handler: {where}: {type(error).__name__}: {error}", kind="handler")
    if indexed:
        _index_rows(_current_batch.get(), indexed, event)


@runtime.app.agent(by_cost_center, name="fold_budgets")
async def fold_budgets(stream):
    # Batched: the budgets and allocation tables' only writer. One event at a time (a
    # changelog store and an acknowledgement per row) it folded ~600 rows/s, the replay's
    # slowest stage. A record is a bundle of up to BUNDLE_ROWS_MAX rows, so a batch takes
    # few records (ADR 0033).
    async for events in take_batches(stream, min(runtime.batch_size, BUDGET_BATCH_RECORDS), runtime.batch_within_s):
        await runtime.process(events, _fold_budget, "by-cost-center", defer=True)


runtime.guard(by_cost_center, "fold_budgets")


@runtime.app.page("/allocation")
async def allocation(web, request):
    query = request.query
    try:
        body = aggregate(
            rows_of(allocation_table.values()),
            window=query.get("window", "24h"),
            aggregate_by=query.get("aggregate", "namespace"),
            cost_center_label=config.settings.cost_center_label,
            price_list=config.price_list,
        )
    except AllocationError as error:
        return web.json({"code": 400, "message": str(error)}, status=400)
    return web.json(body)
