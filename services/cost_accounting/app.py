"""The cost-accounting service: a thin faust shell over ``services.core.cost`` (ADR 0007).

    QM_CONFIG_DIR=examples/seed python -m services.cost_accounting worker

Agents:

1. ``qm.workloads`` (keyed by cohort), ``qm.cluster`` (keyed by uid) and ``qm.clock``: the
   events cost needs are forwarded, unchanged, onto one **single-partition internal topic**
   ``<prefix><app id>-ledger-input`` (key ``ledger``). Its order is the one order every
   replay of this service sees.
2. That topic is folded with ``runtime.apply_once`` into the ``ledger`` table (1 partition,
   one key ``ledger``: the core's state is global — hours close on one watermark for every
   workload, budgets sum across workloads). Outputs: ``qm.billing`` (key workload uid, event
   id = row id), ``qm.budgets`` (key cost center), ``qm.alerts``.
3. ``qm.billing`` (our own rows) is folded into the ``allocation`` table (keyed by workload
   uid, partitioned like ``qm.billing``), which serves ``GET /allocation``.
"""

from __future__ import annotations

import os

from services.adapters.runtime import Output, ServiceRuntime, TemporaryError
from services.adapters.settings import Settings
from services.contracts.codec import ContractError, Envelope, decode
from services.contracts.schemas import topic_specs
from services.cost_accounting.allocation import AllocationError, aggregate, compact_row, rows_of
from services.cost_accounting.config import load_config
from services.cost_accounting.ledger import LEDGER_KEY, LedgerFold
from services.cost_accounting.translate import RELEVANT_EVENT_TYPES

SERVICE = "cost-accounting"
SOURCE_HEADER = "qm-cost-source"
SOURCES = ("qm.workloads", "qm.cluster", "qm.clock")

settings = Settings.from_env(SERVICE)
runtime = ServiceRuntime(settings)
config = load_config(os.environ.get("QM_CONFIG_DIR"))


def input_topic_name(s: Settings = settings) -> str:
    """The internal single-partition topic (tests read it to know the fold's input order)."""
    return s.topic(f"{s.app_id}-ledger-input")


ledger_input = runtime.app.topic(
    input_topic_name(), partitions=1, key_serializer="raw", value_serializer="raw", internal=True
)
ledger_table = runtime.table("ledger", partitions=1, help="the cost core's state (one key: ledger)")
allocation_table = runtime.table(
    "allocation", partitions=topic_specs()["qm.billing"].partitions, help="published ledger rows per workload uid"
)
ledger_fold = LedgerFold(config, make_output=Output)


# -- 1. forward --------------------------------------------------------------------------


def _forwarder(source: str):
    async def forward(envelope: Envelope, event) -> None:
        if envelope.event_type not in RELEVANT_EVENT_TYPES:
            return
        future = await ledger_input.send(
            key=LEDGER_KEY.encode(), value=event.value, headers=[(SOURCE_HEADER, source.encode())]
        )
        await future  # acknowledged before the source offset can be committed

    return forward


for _source in SOURCES:
    runtime.consume(_source, _forwarder(_source), agent_name=f"forward_{_source.replace('.', '_')}")


# -- 2. fold -----------------------------------------------------------------------------


def _source_of(event) -> str:
    headers = event.message.headers or ()
    items = headers.items() if hasattr(headers, "items") else headers
    for key, value in items:
        if key == SOURCE_HEADER:
            return value.decode() if isinstance(value, bytes) else str(value)
    return "qm.workloads"


@runtime.app.agent(ledger_input, name="fold_ledger")
async def fold_ledger(stream):
    async for event in stream.events():
        source = _source_of(event)
        try:
            envelope = decode(event.value)
        except ContractError as error:
            await runtime.dead_letter(source, event, f"contract: {error}", kind="contract")
            continue
        try:
            await runtime.apply_once(ledger_table, LEDGER_KEY, envelope, ledger_fold)
        except TemporaryError:
            raise
        except Exception as error:  # noqa: BLE001 - one bad event must not stop billing
            runtime.log.exception("cost fold failed; message dead-lettered", event_id=envelope.event_id)
            await runtime.dead_letter(source, event, f"handler: {type(error).__name__}: {error}", kind="handler")


# -- 3. allocation view --------------------------------------------------------------------


def _allocation_fold(state, envelope: Envelope):
    rows = dict((state or {}).get("rows", {}))
    rows[envelope.payload.row_id] = compact_row(envelope.payload)
    return {"rows": rows}, []


async def on_ledger_row(envelope: Envelope, event) -> None:
    if envelope.event_type == "billing.ledger_row.v1":
        await runtime.apply_once(allocation_table, envelope.payload.ResourceId, envelope, _allocation_fold)


runtime.consume("qm.billing", on_ledger_row, agent_name="index_ledger_rows")


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
