"""The README's first command, minus the set-up: `qm demo` runs the services on a simulated cluster.
(The seed scenario, `qm demo --scenario seed`, is tested in test_seed_scenario.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.browser import pixels_near, screenshot

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_qm_demo_runs_the_services_on_a_simulated_cluster_and_writes_a_report(kafka_bootstrap, tmp_path):
    report = tmp_path / "report.html"
    result = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "demo", "--no-live", "--duration", "1", "--pods", "120",
         "--speed", "600", "--bootstrap", kafka_bootstrap, "--report", str(report)],
        cwd=REPO, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 2:
            summary[cells[0]] = cells[1]
    assert int(summary["submitted"]) == 120
    assert int(summary["admitted"]) > 0 and int(summary["ledger rows"]) > 0
    page = report.read_text()
    assert page.count("<svg") == 4  # utilization/queue, wait, usage by team, cost by cost center
    assert "GPU-hours by team" in page and "Cost by cost center" in page

    # Opened in a browser, the report draws its charts: the series and bars are blue (#2563eb),
    # the second series red (#dc2626); a blank or broken SVG draws none of them.
    png = screenshot(report, tmp_path / "report.png")
    assert pixels_near(png, (0x25, 0x63, 0xEB)) > 2000, "no chart lines or bars drawn"
    assert pixels_near(png, (0xDC, 0x26, 0x26)) > 200, "the second series of the utilization chart is missing"
