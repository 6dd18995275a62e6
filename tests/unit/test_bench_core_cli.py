"""bench/bench_core.py's command line: `--help` teaches, an unknown scenario is named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_core.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_help_describes_the_benchmark_and_its_scenarios():
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    assert "one drain pass of the quota core" in done.stdout
    assert "within-cq, reclaim-any" in done.stdout
    assert "--repeats" in done.stdout


def test_an_unknown_scenario_is_refused_by_name_before_any_work():
    done = _run("within-cq", "nope")
    assert done.returncode == 2
    assert "no scenario 'nope': choose from within-cq, reclaim-any" in done.stderr
