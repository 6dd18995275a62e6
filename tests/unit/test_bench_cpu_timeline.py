"""bench/common.py's CPU timeline: each process's share of a core, second by second."""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from common import BenchStack  # noqa: E402


async def test_the_timeline_samples_every_process_each_interval_in_percent_of_a_core():
    stack = BenchStack(name="cpu-timeline-test")
    try:
        sampler = asyncio.create_task(stack._sample_cpu(time.monotonic(), every_s=0.1))
        busy_until = time.monotonic() + 0.45
        while time.monotonic() < busy_until:  # this process, labelled "bench", keeps a core busy
            sum(range(20_000))
            await asyncio.sleep(0)
        sampler.cancel()
        samples = stack.cpu_timeline
        assert len(samples) >= 3, samples
        assert [s["at_s"] for s in samples] == sorted(s["at_s"] for s in samples)
        assert all(0 <= s["bench"] <= 100 * 2 for s in samples)  # at most every core, never negative
        assert max(s["bench"] for s in samples) >= 30, samples  # a busy loop shows as busy
    finally:
        shutil.rmtree(stack.run_dir, ignore_errors=True)
