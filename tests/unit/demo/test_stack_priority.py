"""The local stack runs the cost service at a lower CPU priority (ADR 0022)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from services.demo.stack import cost_nice, lowered_priority

NICENESS = [sys.executable, "-c", "import os; print(os.nice(0))"]


def test_the_cost_service_gives_way_by_ten_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("QM_COST_NICE", raising=False)
    assert cost_nice() == 10
    monkeypatch.setenv("QM_COST_NICE", "0")
    assert cost_nice() == 0


@pytest.mark.parametrize("raw", ["ten", "-5", "20"])
def test_a_bad_niceness_stops_the_stack_and_says_what_is_expected(monkeypatch, raw):
    monkeypatch.setenv("QM_COST_NICE", raw)
    with pytest.raises(SystemExit, match=r"QM_COST_NICE=.*expected a niceness from 0 to 19"):
        cost_nice()


def test_a_process_started_with_a_lowered_priority_runs_that_much_nicer():
    base = os.nice(0)
    lowered = subprocess.run(NICENESS, preexec_fn=lowered_priority(5), capture_output=True, text=True, check=True)
    same = subprocess.run(NICENESS, preexec_fn=lowered_priority(0), capture_output=True, text=True, check=True)
    assert int(lowered.stdout) == min(base + 5, 19)
    assert int(same.stdout) == base
