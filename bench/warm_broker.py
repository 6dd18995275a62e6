"""Warm the local broker's JVM up before the benchmarks time anything (`make bench-warmup`).

A freshly started broker spends its first minutes of traffic compiling its hot paths (the JVM's
JIT compiler threads). On two cores that competes with every service. kueue-large-scale at
scale 0.3, run after run on a broker just started (ADR 0043):

    first run:  broker 23–26 CPU-s, ~14 of them compiling; wall 38–44 s
    second run: broker  8–9 CPU-s,  ~2 of them compiling;  wall 29–31 s

A production broker has long been warm, so `make bench` warms it first and every full-stack
result records how much the broker compiled during the run (`broker_jit_cpu_s`).

Synthetic traffic does not do it: 40–55 s of small produce requests, fetches and group commits
compiled 14–19 CPU-s and still left ~9 CPU-s for the next pipeline run. So the warm-up is the
pipeline itself: kueue-large-scale at a small scale, untimed and not written to
bench/results/, repeated until one run compiles less than ``QUIET_CPU_S`` (at most ``ROUNDS``).
It needs the broker's pid (deploy/kafka/kafka.sh's pid file) to see the compiler threads;
against another broker it runs once and says it could not tell.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kueue import SCENARIOS, run  # noqa: E402
from common import run_cli, stop_on_signals  # noqa: E402

SCALE = 0.2  # of kueue-large-scale: 10,000 workloads, ~25 s on a warm broker
ROUNDS = 4
QUIET_CPU_S = 4.0  # a run that compiled less than this: warm (the next compiles 1–2)


async def warm_broker(say=print) -> None:
    """Untimed pipeline runs until the broker's JIT is quiet, saying what each compiled."""
    args = argparse.Namespace(scale=SCALE, timeout=None, stall=60.0, keep_topics=False, profile=False)
    started = time.monotonic()
    for round_ in range(1, ROUNDS + 1):
        result = await run(SCENARIOS["kueue-large-scale"], args)
        jit = result["broker_jit_cpu_s"]
        if jit is None:
            say("warm-up: not the local broker of deploy/kafka/kafka.sh, so its JIT cannot be watched; one run done")
            return
        say(f"warm-up run {round_}: {result['workloads']} workloads in {result['wall_s']} s; "
            f"the broker compiled for {jit} CPU-s")  # fmt: skip
        if jit < QUIET_CPU_S:
            break
    took = round(time.monotonic() - started, 1)
    say(f"broker warm after {took} s" if jit < QUIET_CPU_S else
        f"the broker still compiled {jit} CPU-s in the last of {ROUNDS} warm-up runs; measuring anyway")  # fmt: skip


async def main_async(args: argparse.Namespace) -> int:
    stop_on_signals()
    await warm_broker()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    return run_cli(main_async, parser)


if __name__ == "__main__":
    sys.exit(main())
