"""bench/bench_replay.py's summary says where the wall went: the trace played, then the tail
until the last ledger row, with every cost-accounting process's CPU. A trace that is not there
is named, with what to do."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_replay import _decided, _none_lost, _where_the_wall_went, run  # noqa: E402


def test_the_tail_is_the_gap_between_the_simulator_and_the_last_ledger_row():
    report = {"simulator_s": 27.8, "drain": {"ledger_rows_out_after_s": 69.8},
              "cpu_seconds": {"cost-accounting": 30.0, "cost-accounting-2": 12.0, "queue-manager": 24.1}}
    assert _where_the_wall_went(report) == ("simulator done after 27.8 s, the last ledger row out after 69.8 s "
                                            "(a tail of 42.0 s; cost-accounting used 42.0 CPU-s)")


def test_a_run_whose_last_row_was_not_seen_says_so():
    report = {"simulator_s": 31.0, "drain": {"ledger_rows_out_after_s": None}, "cpu_seconds": {}}
    assert _where_the_wall_went(report) == "simulator done after 31.0 s; the last ledger row not seen"


def test_a_missing_trace_is_named_with_what_to_do(tmp_path):
    args = argparse.Namespace(trace=str(tmp_path / "pods.csv"), nodes=str(tmp_path / "nodes.csv"))
    with pytest.raises(SystemExit, match=r"no file at .*pods\.csv \(--trace\)\..*give --trace and --nodes"):
        asyncio.run(run(args))


def test_every_workload_is_decided_or_was_deleted_first_and_any_other_is_named_lost():
    clean = {"decided": 7287, "of": 8152, "deleted_before_a_decision": 865, "neither_decided_nor_deleted": 0}
    assert _decided(clean) == "7287/8152; 865 deleted before a decision"
    assert _none_lost(clean) is True
    lost = {**clean, "decided": 7286, "neither_decided_nor_deleted": 1, "lost_uids": ["u1"]}
    assert _decided(lost) == "7286/8152; 865 deleted before a decision; 1 neither decided nor deleted (lost_uids)"
    assert _none_lost(lost) is False
    before_counted = {"decided": 8152, "of": 8152}  # a result from before they were counted
    assert (_decided(before_counted), _none_lost(before_counted)) == ("8152/8152", None)
