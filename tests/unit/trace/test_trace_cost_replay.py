"""Replay tier: the trace folded through the cost core equals a ground truth computed from the CSV.

The ground truth is a separate, simple computation over the raw CSV rows (``csv`` module,
``Fraction``): per pod ``num_gpu * gpu_milli/1000 * (deletion - scheduled) / 3600`` GPU-hours
(and core-hours, GiB-hours) with the driver's conventions (Pending/unset scheduled time: no
run; missing deletion: trace end), each pod's total rounded half-even to 9 places — the
ledger's rounding rule for one series — then summed per namespace. Equality is exact.
"""

from __future__ import annotations

import csv
import json
import time
import zlib
from collections import defaultdict
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from services.core.cost import (
    ChargeClass,
    LedgerRow,
    PriceListConfigured,
    UsageKind,
    fold,
    initial_state,
    price_list_from_dict,
    state_from_dict,
    state_to_dict,
)
from services.trace import TEAM_NAMESPACES, lifecycle_events, read_pods, synthetic_pods, write_pod_csv
from services.trace.cost_events import cost_events

TRACE_CSV = (
    Path(__file__).resolve().parents[3]
    / ".."
    / "shared"
    / "traces"
    / "alibaba-gpu-v2023"
    / "openb_pod_list_default.csv"
)
PRICES = {  # flavor -> (gpu, cpu, memory) contracted price per unit-hour
    "gpu-flavor": ("2.50", "0.04", "0.005"),
    "t4-flavor": ("0.90", "0.04", "0.005"),
    "v100m16-flavor": ("1.80", "0.04", "0.005"),
    "cpu-flavor": ("0", "0.05", "0.006"),
}
DEFAULT_PRICE = ("1.00", "0.04", "0.005")


def price_list_event():
    def resources(gpu, cpu, memory):
        return {
            "resources": [
                {"name": "nvidia.com/gpu", "listPrice": gpu},
                {"name": "cpu", "listPrice": cpu},
                {"name": "memory", "listPrice": memory},
            ]
        }

    doc = {
        "apiVersion": "quartermaster.dev/v1alpha1",
        "kind": "PriceList",
        "metadata": {"name": "trace"},
        "spec": {
            "currency": "USD",
            "default": resources(*DEFAULT_PRICE),
            "flavors": [{"name": name, **resources(*p)} for name, p in PRICES.items()],
        },
    }
    return PriceListConfigured("prices", price_list_from_dict(doc), 0)


def round_9(exact: Fraction) -> Decimal:
    return Decimal(round(exact * 10**9)).scaleb(-9)


def ground_truth(csv_path: Path) -> dict[str, dict[str, Decimal]]:
    with open(csv_path, newline="") as handle:
        raw = list(csv.DictReader(handle))
    end_s = max(int(r[c]) for r in raw for c in ("creation_time", "deletion_time", "scheduled_time") if r[c])
    totals: dict[str, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    for r in raw:
        creation = int(r["creation_time"])
        if r["scheduled_time"] == "" or (int(r["scheduled_time"]) == 0 and creation > 0):
            continue
        start = max(int(r["scheduled_time"]), creation)
        end = max(int(r["deletion_time"]) if r["deletion_time"] else end_s, start)
        seconds = end - start
        gpu_milli = int(r["num_gpu"]) * int(r["gpu_milli"])
        gpu = round_9(Fraction(gpu_milli * seconds, 1000 * 3600))
        cores = round_9(Fraction(int(r["cpu_milli"]) * seconds, 1000 * 3600))
        gib = round_9(Fraction(int(r["memory_mib"]) * seconds, 1024 * 3600))
        spec = [m for m in (r.get("gpu_spec") or "").split("|") if m]
        flavor = (
            "cpu-flavor" if int(r["num_gpu"]) == 0 else f"{spec[0].lower()}-flavor" if spec else "gpu-flavor"
        )
        gpu_price, cpu_price, memory_price = (Decimal(p) for p in PRICES.get(flavor, DEFAULT_PRICE))
        namespace = TEAM_NAMESPACES[zlib.crc32(r["name"].encode()) % len(TEAM_NAMESPACES)]
        bucket = totals[namespace]
        bucket["gpu_hours"] += gpu
        bucket["core_hours"] += cores
        bucket["memory_gib_hours"] += gib
        bucket["cost"] += gpu * gpu_price + cores * cpu_price + gib * memory_price
        bucket["exact_gpu_hours_x1e9"] += Decimal(gpu_milli * seconds) * 10**9 / Decimal(1000 * 3600)
    return totals


def replay(csv_path: Path, split_at: int | None = None) -> tuple[list[LedgerRow], float]:
    events = [price_list_event(), *cost_events(lifecycle_events(read_pods(csv_path)), reserve=True)]
    started = time.perf_counter()
    if split_at is None:
        _, outputs = fold(events, initial_state())
    else:
        state, head = fold(events[:split_at], initial_state())
        restored = state_from_dict(json.loads(json.dumps(state_to_dict(state))))
        _, tail = fold(events[split_at:], restored)
        outputs = head + tail
    elapsed = time.perf_counter() - started
    return [o for o in outputs if isinstance(o, LedgerRow)], elapsed


def assert_ledger_matches(ledger: list[LedgerRow], truth: dict[str, dict[str, Decimal]]) -> None:
    totals: dict[str, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    for row in ledger:
        assert row.charge_class is ChargeClass.REGULAR  # an in-order replay needs no corrections
        bucket = totals[row.namespace]
        if row.usage_kind is UsageKind.RESERVED_IDLE:
            bucket["idle_gpu_hours"] += row.gpu_hours
            continue
        bucket["gpu_hours"] += row.gpu_hours
        bucket["core_hours"] += row.core_hours
        bucket["memory_gib_hours"] += row.memory_gib_hours
        bucket["cost"] += row.contracted_cost
    assert set(totals) == set(truth)
    for namespace, expected in truth.items():
        got = totals[namespace]
        assert got["idle_gpu_hours"] == 0, namespace  # trace pods run as soon as they are placed
        for column in ("gpu_hours", "core_hours", "memory_gib_hours", "cost"):
            assert got[column] == expected[column], (namespace, column, got[column], expected[column])
        # and the rounding stays within half a nano-GPU-hour per pod of the exact value
        assert abs(got["gpu_hours"] * 10**9 - expected["exact_gpu_hours_x1e9"]) <= 10_000


def test_synthetic_trace_replay_matches_the_csv_ground_truth(tmp_path):
    csv_path = write_pod_csv(synthetic_pods(1500, seed=5), tmp_path / "synthetic.csv")
    ledger, _ = replay(csv_path)
    assert len(ledger) > 1500
    assert_ledger_matches(ledger, ground_truth(csv_path))


def test_synthetic_replay_survives_a_state_round_trip_mid_stream(tmp_path):
    csv_path = write_pod_csv(synthetic_pods(400, seed=9), tmp_path / "synthetic.csv")
    straight, _ = replay(csv_path)
    resumed, _ = replay(csv_path, split_at=700)
    assert resumed == straight


@pytest.mark.skipif(
    not TRACE_CSV.is_file(),
    reason=f"Alibaba GPU trace not found at {TRACE_CSV}; the synthetic replay covers the same path",
)
def test_alibaba_trace_replay_matches_the_csv_ground_truth():
    ledger, elapsed = replay(TRACE_CSV)
    assert len(ledger) > 60_000
    assert_ledger_matches(ledger, ground_truth(TRACE_CSV))
    assert elapsed < 15, f"folding the full trace took {elapsed:.1f}s"
