"""``qm billing export``: ledger rows (FOCUS 1.2 records) → FOCUS CSV or JSON Lines.

The exporter reads rows from a pluggable source — any iterable of FOCUS record dicts (the
``qm.billing`` payload, see :mod:`services.core.cost.focus`). Today the source is a JSONL
file (``--input``); a Kafka source for the ``qm.billing`` topic plugs in through
:data:`ROW_SOURCES` / :func:`export_rows` without touching the export itself.

Rows are selected by ``ChargePeriodStart`` in ``[--from, --to)`` (UTC) and optionally by
cost center (``x_CostCenter``). Every record is validated against the FOCUS columns; an
invalid record is reported on stderr with its position and skipped, and the command exits
with status 1 — nothing is dropped silently. Amounts are written exactly as in the ledger;
``--cost-decimals N`` rounds the cost columns ROUND_HALF_EVEN for an invoice.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from services.core.cost.focus import ALL_COLUMNS, round_costs, validate_focus_record
from services.core.cost.units import iso_utc, parse_iso_utc_ms

__all__ = ["ExportFormat", "ExportSummary", "ROW_SOURCES", "export_rows", "jsonl_source", "kafka_source", "register"]


class ExportFormat(StrEnum):
    FOCUS_CSV = "focus-csv"
    JSONL = "jsonl"


@dataclass(slots=True)
class ExportSummary:
    read: int = 0
    written: int = 0
    invalid: list[str] = field(default_factory=list)


RowSource = Callable[[str], Iterable[Mapping[str, Any]]]


def jsonl_source(location: str) -> Iterator[Mapping[str, Any]]:
    """FOCUS records from a JSON Lines file (``-`` is stdin); blank lines are skipped."""
    handle = sys.stdin if location == "-" else open(location, encoding="utf-8")  # noqa: SIM115
    try:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                yield {"__error__": f"line {number}: not JSON ({error})"}
                continue
            if not isinstance(record, dict):
                yield {"__error__": f"line {number}: not a JSON object"}
                continue
            yield record
    finally:
        if handle is not sys.stdin:
            handle.close()


def kafka_source(location: str) -> Iterator[Mapping[str, Any]]:
    """FOCUS records from the ``qm.billing`` topic, each row once (deduplicated by row id).

    ``location`` is ``<bootstrap>[/<topic prefix>]`` (``127.0.0.1:9092``, ``127.0.0.1:9092/t1.``).
    Rows repeat after a service restart with the same id and content (ADR 0001); the first
    copy is kept. An unreadable message is reported as an error record, never skipped."""
    import asyncio

    from services.adapters.bus import read_envelopes
    from services.contracts.codec import ContractError, payload_to_dict

    bootstrap, _, prefix = location.partition("/")

    async def collect() -> list[Mapping[str, Any]]:
        records: list[Mapping[str, Any]] = []
        seen: set[str] = set()
        async for raw, envelope in read_envelopes(bootstrap, f"{prefix}qm.billing"):
            if isinstance(envelope, ContractError):
                records.append({"__error__": f"partition {raw.partition} offset {raw.offset}: {envelope}"})
                continue
            record = payload_to_dict(envelope.payload)
            row = record.pop("row_id", None) or record.get("x_RowId") or envelope.event_id
            if row in seen:
                continue
            seen.add(row)
            record.setdefault("x_RowId", row)
            records.append(record)
        return records

    yield from asyncio.run(collect())


#: Row sources by scheme: ``file`` (JSON Lines) and ``kafka`` (topic ``qm.billing``).
ROW_SOURCES: dict[str, RowSource] = {"file": jsonl_source, "kafka": kafka_source}


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def export_rows(
    records: Iterable[Mapping[str, Any]],
    out: TextIO,
    *,
    fmt: ExportFormat,
    start_ms: int | None = None,
    end_ms: int | None = None,
    cost_center: str | None = None,
    cost_decimals: int | None = None,
) -> ExportSummary:
    """Filter, validate and write records; the summary lists the invalid ones."""
    summary = ExportSummary()
    writer = None
    if fmt is ExportFormat.FOCUS_CSV:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(ALL_COLUMNS)
    for position, record in enumerate(records, start=1):
        summary.read += 1
        if "__error__" in record:
            summary.invalid.append(str(record["__error__"]))
            continue
        problems = validate_focus_record(record)
        if problems:
            summary.invalid.append(f"record {position} ({record.get('x_RowId', '?')}): {'; '.join(problems)}")
            continue
        period_start = parse_iso_utc_ms(record["ChargePeriodStart"])
        if start_ms is not None and period_start < start_ms:
            continue
        if end_ms is not None and period_start >= end_ms:
            continue
        if cost_center is not None and record.get("x_CostCenter") != cost_center:
            continue
        if cost_decimals is not None:
            record = round_costs(record, cost_decimals)
        if writer is not None:
            writer.writerow([_csv_value(record.get(column)) for column in ALL_COLUMNS])
        else:
            out.write(
                json.dumps({column: record.get(column) for column in ALL_COLUMNS}, separators=(",", ":"))
            )
            out.write("\n")
        summary.written += 1
    return summary


def _moment(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    try:
        return parse_iso_utc_ms(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO-8601 date or time (e.g. 2023-07-01T00:00:00Z)", param_hint=option
        ) from None


def register(app: typer.Typer) -> None:
    billing = typer.Typer(help="GPU-hour ledger: export FOCUS 1.2 billing data.", no_args_is_help=True)

    @billing.command("export")
    def export(
        input_: Annotated[
            str, typer.Option(
                "--input",
                help="JSON Lines file of ledger rows (FOCUS records); - for stdin; "
                "kafka://<bootstrap>[/<topic prefix>] reads qm.billing.",
            )
        ],
        from_: Annotated[
            str | None,
            typer.Option("--from", help="Inclusive UTC start of ChargePeriodStart (2023-07-01 or ISO time)."),
        ] = None,
        to: Annotated[
            str | None, typer.Option("--to", help="Exclusive UTC end of ChargePeriodStart.")
        ] = None,
        fmt: Annotated[
            ExportFormat, typer.Option("--format", help="Output format.")
        ] = ExportFormat.FOCUS_CSV,
        cost_center: Annotated[
            str | None, typer.Option("--cost-center", help="Only rows of this cost center (x_CostCenter).")
        ] = None,
        output: Annotated[
            Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
        ] = None,
        cost_decimals: Annotated[
            int | None,
            typer.Option(
                "--cost-decimals", min=0, max=18, help="Round cost columns to N places (ROUND_HALF_EVEN)."
            ),
        ] = None,
    ) -> None:
        """Export ledger rows as FOCUS CSV or JSON Lines."""
        start_ms, end_ms = _moment(from_, "--from"), _moment(to, "--to")
        if start_ms is not None and end_ms is not None and start_ms >= end_ms:
            raise typer.BadParameter("--from must be before --to", param_hint="--from")
        if input_ != "-" and not input_.startswith("kafka://") and not Path(input_).is_file():
            raise typer.BadParameter(f"{input_} does not exist", param_hint="--input")
        scheme, _, rest = input_.partition("://")
        records = ROW_SOURCES["kafka"](rest) if scheme == "kafka" and rest else ROW_SOURCES["file"](input_)
        target = open(output, "w", newline="", encoding="utf-8") if output else sys.stdout  # noqa: SIM115
        try:
            summary = export_rows(
                records,
                target,
                fmt=fmt,
                start_ms=start_ms,
                end_ms=end_ms,
                cost_center=cost_center,
                cost_decimals=cost_decimals,
            )
        finally:
            if output:
                target.close()
        window = f"[{iso_utc(start_ms) if start_ms is not None else '-inf'}, {iso_utc(end_ms) if end_ms is not None else '+inf'})"
        typer.echo(f"exported {summary.written} of {summary.read} rows {window}", err=True)
        for problem in summary.invalid:
            typer.echo(f"invalid: {problem}", err=True)
        if summary.invalid:
            raise typer.Exit(code=1)

    app.add_typer(billing, name="billing")
