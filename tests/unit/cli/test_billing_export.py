"""``qm billing export``: FOCUS CSV / JSONL from a JSONL ledger, validated against the FOCUS columns."""

from __future__ import annotations

import csv
import io
import json
import re
from decimal import Decimal

import pytest
import typer
from typer.testing import CliRunner

from services.cli import billing_cmd
from services.core.cost import (
    ClockTick,
    LedgerRow,
    NamespaceLabeled,
    PodsRunning,
    PreFreezeExpired,
    PriceListConfigured,
    Released,
    ReservationStarted,
    ResourceAmounts,
    focus_record,
    fold,
    price_list_from_dict,
    validate_focus_record,
)
from services.core.cost.focus import ALL_COLUMNS, DATETIME_COLUMNS, DECIMAL_COLUMNS, REQUIRED_COLUMNS
from services.core.cost.units import parse_iso_utc_ms

H = 3_600_000
T0 = parse_iso_utc_ms("2023-07-01T10:00:00Z")
PRICES = {
    "apiVersion": "quartermaster.dev/v1alpha1",
    "kind": "PriceList",
    "metadata": {"name": "p"},
    "spec": {
        "currency": "EUR",
        "default": {
            "resources": [
                {"name": "nvidia.com/gpu", "listPrice": "3", "contractedPrice": "2.5"},
                {"name": "cpu", "listPrice": "0.04"},
            ]
        },
    },
}


@pytest.fixture
def ledger_file(tmp_path):
    label = "quartermaster.dev/cost-center"
    events = [
        PriceListConfigured("p", price_list_from_dict(PRICES), 0),
        NamespaceLabeled("n1", "ml-team", ((label, "cc-ml"),), 0),
        NamespaceLabeled("n2", "vision", ((label, "cc-vision"),), 0),
        ReservationStarted("e1", "train-1", "ml-team", "a100-flavor", ResourceAmounts(16000), T0, "train-1"),
        PreFreezeExpired("e2", "train-1", T0 + 5 * 60_000),
        PodsRunning(
            "e3",
            "serve-1",
            "vision",
            "t4-flavor",
            ResourceAmounts(1000, 4000),
            T0 - 20 * 60_000,
            labels=(("app", "serve"),),
        ),
        ClockTick("t1", T0 + 2 * H),
        Released("e4", "serve-1", T0 + 30 * 60_000),  # late: correction rows
        ClockTick("t2", T0 + 3 * H),
    ]
    _, outputs = fold(events)
    rows = [o for o in outputs if isinstance(o, LedgerRow)]
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(focus_record(row)) + "\n" for row in rows))
    return path, rows


def run(*args):
    app = typer.Typer()
    billing_cmd.register(app)
    return CliRunner().invoke(app, ["billing", "export", *args])


def check_focus(record: dict) -> None:
    assert validate_focus_record(record) == []
    for column in REQUIRED_COLUMNS:
        assert column in record
    for column in DECIMAL_COLUMNS:
        Decimal(record[column])  # parses exactly
        assert "E" not in record[column]
    for column in DATETIME_COLUMNS:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record[column])
    assert parse_iso_utc_ms(record["ChargePeriodStart"]) < parse_iso_utc_ms(record["ChargePeriodEnd"])
    assert re.fullmatch(r"[A-Z]{3}", record["BillingCurrency"])
    assert record["ChargeCategory"] == "Usage"


def test_focus_csv_export_is_valid_focus(ledger_file):
    path, rows = ledger_file
    result = run("--input", str(path), "--format", "focus-csv")
    assert result.exit_code == 0, result.output
    records = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(records) == len(rows) and list(records[0]) == list(ALL_COLUMNS)
    for record in records:
        check_focus(record)
    idle = next(r for r in records if r["x_UsageKind"] == "reserved-idle")
    assert (idle["PricingQuantity"], idle["PricingUnit"], idle["x_CostCenter"]) == (
        "1.333333333",
        "GPU-Hours",
        "cc-ml",
    )
    assert (idle["ResourceId"], idle["SubAccountId"], idle["SkuId"]) == ("train-1", "ml-team", "a100-flavor")
    assert idle["BilledCost"] == "3.3333333325" == str(Decimal("1.333333333") * Decimal("2.5"))
    assert idle["BillingCurrency"] == "EUR"
    corrections = [r for r in records if r["ChargeClass"] == "Correction"]
    assert corrections and all(Decimal(r["BilledCost"]) < 0 for r in corrections)
    assert json.loads(next(r for r in records if r["ResourceId"] == "serve-1")["Tags"]) == {"app": "serve"}


def test_jsonl_export_and_filters(ledger_file):
    path, rows = ledger_file
    result = run(
        "--input",
        str(path),
        "--format",
        "jsonl",
        "--cost-center",
        "cc-vision",
        "--from",
        "2023-07-01T10:00:00Z",
        "--to",
        "2023-07-01T12:00:00Z",
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records and all(r["x_CostCenter"] == "cc-vision" for r in records)
    assert {r["ChargePeriodStart"] for r in records} == {"2023-07-01T10:00:00Z", "2023-07-01T11:00:00Z"}
    for record in records:
        check_focus(record)
    assert sum(Decimal(r["x_GpuHours"]) for r in records) == Decimal("0.5")  # 10:00-10:30 after correction


def test_cost_decimals_rounds_half_even_at_export_only(ledger_file):
    path, _ = ledger_file
    result = run("--input", str(path), "--format", "jsonl", "--cost-decimals", "2", "--cost-center", "cc-ml")
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert record["BilledCost"] == "3.33" and record["ListCost"] == "4.00"


def test_invalid_records_are_reported_and_fail_the_command(tmp_path, ledger_file):
    path, rows = ledger_file
    broken = json.loads(path.read_text().splitlines()[0])
    broken["ChargePeriodEnd"] = broken["ChargePeriodStart"]
    del broken["BillingCurrency"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text() + json.dumps(broken) + "\nnot json\n")
    result = run("--input", str(bad), "--format", "jsonl")
    assert result.exit_code == 1
    assert len(result.stdout.splitlines()) == len(rows)
    assert "BillingCurrency: missing" in result.stderr and "ChargePeriodStart must be before" in result.stderr
    assert "not JSON" in result.stderr


def test_bad_arguments_are_rejected(ledger_file):
    path, _ = ledger_file
    assert run("--input", str(path), "--format", "xml").exit_code != 0
    assert run("--input", str(path), "--from", "yesterday").exit_code != 0
    assert run("--input", str(path), "--from", "2023-07-02", "--to", "2023-07-01").exit_code != 0
    assert run("--input", "/nonexistent.jsonl").exit_code != 0


def test_export_rows_takes_any_iterable_source(ledger_file):
    _, rows = ledger_file
    out = io.StringIO()
    summary = billing_cmd.export_rows(
        (focus_record(r) for r in rows), out, fmt=billing_cmd.ExportFormat.JSONL
    )
    assert summary.written == len(rows) and not summary.invalid
