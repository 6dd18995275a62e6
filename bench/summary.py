"""`make bench`'s last step: one markdown table from the JSON in bench/results/.

Rows come from each benchmark's own ``summary_rows`` (kueue-baseline, kueue-large-scale,
alibaba-replay, recovery); the webhook's are built here from bench-webhook.json. A missing
file is a row saying so, never a number. The machine, commit and load of each run are listed
under the table: figures from a loaded or dirty run, or one on a broker still compiling (broker
JIT, ADR 0043), are read with that in mind.

Other result files with summary rows (a run kept with ``--out``, e.g.
alibaba-replay-scale0.2.json, or the smalls-phase diagnostic) are not what ``make bench`` ran:
they follow in a table of their own, "Other runs kept in bench/results/", with their commits,
so an older run's figures are never read as this one's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, print_rows, row  # noqa: E402

ORDER = ("kueue-baseline", "kueue-large-scale", "alibaba-replay", "bench-webhook", "recovery")


def webhook_rows(report: dict) -> list[dict]:
    rows = []
    for r in report.get("results", []):
        rate = r["target_rps"]
        target = "p99 < 5 ms" if rate == 500 else "—"
        met = (r["p99_ms"] < 5 and not r["errors"]) if rate == 500 else None
        rows.append(row(f"webhook: /validate at {rate:.0f}/s (achieved {r['achieved_rps']}/s)",
                        f"p50 {r['p50_ms']} ms / p99 {r['p99_ms']} ms", "—", target, met,
                        f"{r['errors']} errors" if r["errors"] else ""))  # fmt: skip
    return rows


def run_line(name: str, report: dict) -> str:
    m = report.get("machine", {})
    commit = (m.get("git_commit") or "?")[:10] + (" dirty" if m.get("git_dirty") else "")
    return (f"- {name}: {m.get('cpus')} cores, {m.get('memory_gib')} GiB, Python {m.get('python')}, "
            f"faust {m.get('faust')}, aiokafka {m.get('aiokafka')}, Kafka {m.get('kafka')}, commit {commit}, "
            f"load {report.get('load_before')} → {report.get('load_after')}, "
            f"calibration {m.get('calibration_s', '?')} s"
            + ("" if report.get("broker_jit_cpu_s") is None
               else f", broker JIT {report['broker_jit_cpu_s']} CPU-s"))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--results", default=str(RESULTS), help="directory of the benchmark JSON files")
    args = p.parse_args(argv)
    rows, runs = [], []
    for name in ORDER:
        path = Path(args.results) / f"{name}.json"
        if not path.exists():
            rows.append(row(f"{name}", "not run (no JSON)", "—", "—", None))
            continue
        report = json.loads(path.read_text())
        rows.extend(webhook_rows(report) if name == "bench-webhook" else report.get("summary_rows", []))
        runs.append(run_line(name, report))
    print("## Quartermaster benchmarks (make bench)\n")
    print_rows(rows)
    print("\nRuns:\n" + "\n".join(runs))
    # runs kept under other names: not this `make bench`'s, perhaps of another commit
    extra = {}
    for path in sorted(Path(args.results).glob("*.json")):
        if path.stem not in ORDER:
            report = json.loads(path.read_text())
            if "summary_rows" in report:
                extra[path.stem] = report
    if extra:
        print("\n## Other runs kept in bench/results/ (not run by `make bench`)\n")
        print_rows([r for report in extra.values() for r in report["summary_rows"]])
        print("\nRuns:\n" + "\n".join(run_line(name, report) for name, report in extra.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
