"""`python -m services.sim`: the simulated cluster on its own, against services started elsewhere.

`qm demo` starts the services and the simulator together; docker-compose.yml runs each service
in its own container, so it needs the two halves of what `services.demo.run` does, separately:

    python -m services.sim config DIR   write the simulated fleet's Kueue objects and the seed
                                        price list into DIR (the services' QM_CONFIG_DIR)
    python -m services.sim run          replay the trace against the running services; the same
                                        options and defaults as `qm demo` (--speed, --duration, …)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

from services.sim.config import write_kueue_config
from services.sim.runner import SimStats, run_simulation
from services.trace.synthetic import synthetic_pods

PRICE_LIST = Path(__file__).resolve().parents[2] / "examples" / "seed" / "pricelist.yaml"


def write_config(directory: str | Path) -> Path:
    """The config `qm demo` gives its services: queues for the simulated fleet, the seed prices."""
    target = Path(directory)
    write_kueue_config(target)
    shutil.copyfile(PRICE_LIST, target / "pricelist.yaml")
    return target


def _print_progress(stats: SimStats) -> None:
    # One JSON line per progress report: `docker compose logs simulator` is the live view.
    print(json.dumps(stats.as_dict()), flush=True)


def simulate(args: argparse.Namespace) -> SimStats:
    duration_s = args.duration * 3600
    trace = args.trace or synthetic_pods(args.pods, span_s=int(duration_s))  # as services.demo.run does
    return asyncio.run(run_simulation(
        args.bootstrap, args.prefix, trace=trace, speed=args.speed, duration_s=duration_s,
        on_progress=_print_progress, progress_every_s=args.progress_every, config_dir=args.config_dir or None,
    ))


def parser() -> argparse.ArgumentParser:
    # No abbreviated options: a command line in docker-compose.yml means exactly what it says.
    p = argparse.ArgumentParser(prog="python -m services.sim", description=__doc__.splitlines()[0], allow_abbrev=False)
    commands = p.add_subparsers(dest="command", required=True)
    config = commands.add_parser("config", help="write the simulated cluster's config into a directory",
                                 allow_abbrev=False)
    config.add_argument("directory")
    run = commands.add_parser("run", help="replay a trace against running services", allow_abbrev=False)
    run.add_argument("--bootstrap", default=os.environ.get("QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    run.add_argument("--prefix", default=os.environ.get("QM_TOPIC_PREFIX", ""))
    run.add_argument("--speed", type=float, default=600.0, help="simulated seconds per wall second")
    run.add_argument("--duration", type=float, default=4.0, help="simulated hours to run")
    run.add_argument("--pods", type=int, default=400, help="pods in the generated trace (ignored with --trace)")
    run.add_argument("--trace", default=os.environ.get("TRACE", ""), help="an Alibaba GPU pod-list CSV to replay")
    run.add_argument("--progress-every", type=float, default=5.0, help="wall seconds between progress lines")
    run.add_argument("--config-dir", default=os.environ.get("QM_CONFIG_DIR", ""),
                     help="the services' Kueue config (default: $QM_CONFIG_DIR): with it, pod and workload facts go "
                          "straight onto their cohort's stream as the watcher sends them (ADR 0075); without it, "
                          "onto qm.cluster for admission to forward")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "config":
        print(f"wrote {write_config(args.directory)}")
        return 0
    simulate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
