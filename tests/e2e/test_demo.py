"""The README's first command, minus the set-up: `qm demo` plays the seed scenario."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_qm_demo_plays_the_seed_scenario(kafka_bootstrap):
    result = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "demo", "--bootstrap", kafka_bootstrap],
        cwd=REPO, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "insufficient unused quota for nvidia.com/gpu in flavor a100-flavor, 8 more needed" in out
    assert "idle 300 s holding 4 GPU" in out
    assert "backoff 60 s" in out
