"""Interleaved A/B runs of a Kueue scenario or the Alibaba replay: two or more sides, rep by rep.

This machine's speed moves from day to day and within a run (stop 21's code took 98-99 s for
kueue-baseline one day and 88-89 s a day later), so a change is judged only against runs of the
other side made in the same session, alternating. A side is a checkout of the repository
(another commit: `git worktree add /tmp/before <commit>` and `ln -s $PWD/.venv /tmp/before/.venv`)
and environment variables (a knob), or both.

Examples:
  ab_kueue.py --scenario baseline --scale 0.2 --reps 2 --side before:/tmp/before --side after:.
  ab_kueue.py --scenario large-scale --side default:. --side min16k:.:QM_FETCH_MIN_BYTES=16384
  ab_kueue.py --scenario replay --reps 3 --side before:/tmp/before --side after:.

`--scenario replay` runs bench/bench_replay.py on the trace beside this checkout (a worktree
elsewhere has none of its own); its table adds when the simulator was done and the ledger's
reconciliation (the cost service's tail is the gap between that and the wall).

Before the first run the local broker is warmed up (bench/warm_broker.py, ADR 0043): a broker
just started compiles its hot paths through its first minutes of traffic, which would slow
whichever side ran first. `--no-warmup` skips it; the table shows each run's broker JIT CPU.

Each run's JSON is kept as bench/results/ab/<scenario>-<side>-<rep>.json (a side's own
bench/results/kueue-*.json and alibaba-replay.json stay those of its last `make bench`); the table of every
run (wall, CPU per process, evictions, minimum usage, mean time to admission) is printed at
the end, and a line per run as it ends. Under the table, one line per side: its walls' median
and range, and against the first side, rep by rep, the difference, how many reps it was faster
in and the median ratio (a pair runs back to back, so it shares the machine's moment).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, scale_arg  # noqa: E402
from hops import slowest_release  # noqa: E402

from services.demo.stack import SERVICES  # noqa: E402
from services.sim.kueue_scenarios import DIAGNOSTIC  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces" / "alibaba-gpu-v2023"  # read in place, for every side
REPLAY = "replay"


@dataclass(frozen=True)
class Side:
    label: str
    tree: Path
    env: dict[str, str] = field(default_factory=dict)


def side_arg(text: str) -> Side:
    """LABEL:TREE[:VAR=VALUE,VAR=VALUE]"""
    label, _, rest = text.partition(":")
    tree, _, env_text = rest.partition(":")
    if not label or not tree:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL:TREE[:VAR=VALUE,...], e.g. after:.")
    env = {}
    for pair in filter(None, env_text.split(",")):
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise argparse.ArgumentTypeError(f"{text!r}: {pair!r} is not VAR=VALUE")
        env[name] = value
    path = Path(tree).resolve()
    if not (path / "bench" / "bench_kueue.py").exists():
        raise argparse.ArgumentTypeError(f"{text!r}: {path} has no bench/bench_kueue.py (a checkout of this repository?)")
    if not (path / ".venv" / "bin" / "python").exists():
        raise argparse.ArgumentTypeError(f"{text!r}: {path}/.venv/bin/python is missing; link this checkout's: "
                                         f"ln -s {REPO / '.venv'} {path / '.venv'}")
    return Side(label, path, env)


def run_once(side: Side, scenario: str, scale: float, log: Path, out: Path) -> dict:
    """One bench_kueue.py (or bench_replay.py) run in the side's checkout; its result JSON,
    kept as `out`. The side's own bench/results/ is left as it was: its kueue-baseline.json
    (alibaba-replay.json) stays the last `make bench`'s, not this run's."""
    out.unlink(missing_ok=True)  # a failed run must not report the previous one's figures
    if scenario == REPLAY:
        result = out
        command = ["bench/bench_replay.py", "--scale", str(scale), "--trace", str(TRACES / "openb_pod_list_default.csv"),
                   "--nodes", str(TRACES / "openb_node_list_all_node.csv"), "--out", str(out)]
    else:
        # bench_kueue.py writes only its own path (older checkouts have no --out): the file there
        # before the run is set aside and put back afterwards
        result = side.tree / "bench" / "results" / f"{scenario if scenario in DIAGNOSTIC else 'kueue-' + scenario}.json"
        command = ["bench/bench_kueue.py", "--scenario", scenario, "--scale", str(scale)]
    kept = result.with_name(result.name + ".ab-kept")
    if result != out and result.exists():
        result.replace(kept)
    try:
        with log.open("wb") as output:
            subprocess.run([str(side.tree / ".venv" / "bin" / "python"), *command], cwd=side.tree,
                           env={**os.environ, **side.env}, stdout=output, stderr=subprocess.STDOUT, check=False)
        if result != out and result.exists():
            result.replace(out)
    finally:
        if kept.exists():
            kept.replace(result)
    if not out.exists():
        raise SystemExit(f"{side.label}: the run wrote no result; see {log}")
    return json.loads(out.read_text())


def figures(report: dict) -> dict:
    cpu = report.get("cpu_seconds", {})
    services = sum(cpu.get(name) or 0 for name in SERVICES)
    tta = {k: v.get("mean_s") for k, v in (report.get("time_to_admission") or {}).items()}
    return {
        "wall_s": report.get("wall_s"), "complete": report.get("complete"), "services_cpu_s": round(services, 1),
        "cpu_s": cpu, "evictions": report.get("evictions"), "usage_min_pct": report.get("usage_min_pct"),
        "time_to_admission_s": tta, "release_ms": _release_ms(report.get("finish_hops") or {}),
        "calibration_s": (report.get("machine") or {}).get("calibration_s"),  # the machine's speed then
        "broker_jit_cpu_s": report.get("broker_jit_cpu_s"),  # a cold broker's compiling (ADR 0043)
        "simulator_s": report.get("simulator_s"),  # the replay: the trace played; the rest is the tail
        "ledger": _ledger(report.get("ledger")),
        "last_phase_cpu": _last_phase_cpu(report.get("phase_cpu") or {}),
        "last_phase_qm_loop": _last_phase_qm_loop(report.get("phase_loops") or {}),
    }


def _last_phase_qm_loop(phases: dict) -> str:
    """How busy the queue-manager's busiest agent was in the class window that ends last, with
    the share it waited for the broker's acks (bench_kueue's phase_loops; a run from before
    they were measured has none)."""
    if not phases:
        return "—"
    _, p = max(phases.items(), key=lambda kv: kv[1]["to_s"])
    loop = p["loops"].get("queue-manager")
    return "—" if loop is None else f"{loop['busy_pct']:.0f}% ({loop.get('acks_pct', 0):.0f}%)"


def _last_phase_cpu(phases: dict) -> str:
    """The CPU per workload finished in the class window that ends last (kueue-baseline's small
    jobs, where the machine's CPU bounds the wall), in ms, with the cores busy then."""
    if not phases:
        return "—"
    name, p = max(phases.items(), key=lambda kv: kv[1]["to_s"])
    return f"{name} {p['cpu_ms_per_finish']['all']:.2f} ({p['cores_busy']})"


def _ledger(ledger: dict | None) -> str:
    """The replay's reconciliation: equal to the bus trail (rows), or the difference."""
    if not ledger:
        return "—"
    if ledger.get("reconciled"):
        return f"equal ({ledger.get('rows'):,} rows)"
    return f"differs by {ledger.get('difference_gpu_hours')} GPU-h"


def _release_ms(hops: dict) -> str:
    """The queue-manager's finish → release p50, overall / in its slowest phase (bench/hops.py);
    a side from before hops were measured has none."""
    if not hops:
        return "—"
    return f"{hops['released_by_queue_manager']['p50_ms']} / {slowest_release(hops)['released']['p50_ms']}"


def table(rows: list[tuple[str, int, dict]]) -> None:
    processes = sorted({k for _, _, f in rows for k in f["cpu_s"]})
    classes = sorted({k for _, _, f in rows for k in f["time_to_admission_s"]})
    replay = any(f.get("simulator_s") is not None for _, _, f in rows)
    header = ["side", "rep", "calibration s", "broker JIT s", "wall s", "services' CPU s", *(f"CPU {p}" for p in processes),
              "evictions", "min usage %", *(f"{c} → admitted s" for c in classes),
              "finish → release p50 ms (all / slowest phase)", "last phase: CPU ms per finish (cores busy)",
              "last phase: queue-manager loop busy (acks)",
              *(("simulator done s", "ledger") if replay else ())]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for label, rep, f in rows:
        wall = f"{f['wall_s']}" + ("" if f["complete"] else " (incomplete)")
        cells = [label, rep, f.get("calibration_s") or "—", _or_dash(f.get("broker_jit_cpu_s")), wall, f["services_cpu_s"],
                 *(f["cpu_s"].get(p, "—") for p in processes), _or_dash(f["evictions"]), _or_dash(f["usage_min_pct"]),
                 *(_round(f["time_to_admission_s"].get(c)) for c in classes), f["release_ms"], f["last_phase_cpu"],
                 f.get("last_phase_qm_loop", "—"),
                 *((_round(f.get("simulator_s")), f.get("ledger", "—")) if replay else ())]
        print("| " + " | ".join(map(str, cells)) + " |")


def paired_summary(rows: list[tuple[str, int, dict]]) -> list[str]:
    """One line per side: its walls' median and range, and against the first side, rep by rep
    (each pair ran back to back, on the machine of that moment), the difference, how many reps
    it was faster in, and the median of the ratios. This machine's speed moves more between
    reps than most changes move the wall, so the pairs, not the pooled means, are the test."""
    walls: dict[str, dict[int, float]] = {}
    for label, rep, f in rows:
        if f.get("wall_s") is not None and f.get("complete", True):
            walls.setdefault(label, {})[rep] = f["wall_s"]
    labels = list(dict.fromkeys(label for label, _, _ in rows))
    reference = labels[0] if labels else ""
    reference_walls = walls.get(reference, {})
    lines = []
    for label in labels:
        mine = walls.get(label, {})
        if not mine:
            lines.append(f"{label}: no complete run")
            continue
        line = (f"{label}: wall median {statistics.median(mine.values()):.2f} s "
                f"({min(mine.values()):.2f}–{max(mine.values()):.2f}, {len(mine)} run{'s' if len(mine) != 1 else ''})")
        pairs = [(rep, mine[rep], reference_walls[rep]) for rep in sorted(mine) if rep in reference_walls]
        if label != reference and pairs:
            deltas = ", ".join(f"{a - b:+.2f}" for _, a, b in pairs)
            faster = sum(1 for _, a, b in pairs if a < b)
            ratio = statistics.median(a / b for _, a, b in pairs)
            line += (f"; against {reference}, rep by rep: {deltas} s (faster in {faster} of {len(pairs)}), "
                     f"median ratio {ratio:.3f}")
        lines.append(line)
    return lines


def _or_dash(value: object) -> object:
    return "—" if value is None else value


def _round(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--scenario", choices=["baseline", "large-scale", *DIAGNOSTIC, REPLAY], default="baseline")
    p.add_argument("--scale", type=scale_arg, default=1.0, help="as bench_kueue.py's (bench_replay.py's) --scale (default 1)")
    p.add_argument("--reps", type=int, default=1, help="runs of each side (default 1)")
    p.add_argument("--side", type=side_arg, action="append", required=True,
                   help="LABEL:TREE[:VAR=VALUE,...]; give two or more, in the order they run each rep")
    p.add_argument("--no-warmup", action="store_true", help="do not warm the broker up before the first run")
    args = p.parse_args()
    if len(args.side) < 2:
        p.error("give at least two --side")
    if len({s.label for s in args.side}) != len(args.side):
        p.error("the sides' labels must differ")
    out_dir = RESULTS / "ab"
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.no_warmup:
        print("[ab] warming the broker up (bench/warm_broker.py)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, str(REPO / "bench" / "warm_broker.py")], cwd=REPO, check=True,
                       stdout=sys.stderr)  # fmt: skip
    rows = []
    for rep in range(1, args.reps + 1):
        for side in args.side:
            name = f"{args.scenario}-{side.label}-{rep}"
            knobs = " ".join(f"{k}={v}" for k, v in side.env.items())
            print(f"[ab] {name}: running in {side.tree}{' with ' + knobs if knobs else ''}", file=sys.stderr, flush=True)
            started = time.monotonic()
            report = run_once(side, args.scenario, args.scale, out_dir / f"{name}.log", out_dir / f"{name}.json")
            f = figures(report)
            rows.append((side.label, rep, f))
            print(f"[ab] {name}: wall {f['wall_s']} s, services' CPU {f['services_cpu_s']} s, evictions "
                  f"{f['evictions']}, ledger {f['ledger']} ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    table(rows)
    print()
    for line in paired_summary(rows):
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
