"""`make bench`'s last step: one markdown table from the JSON in bench/results/.

Rows come from each benchmark's own ``summary_rows`` (kueue-baseline, kueue-large-scale,
alibaba-replay, recovery); the webhook's are built here from bench-webhook.json. A missing
file is a row saying so, never a number. Other result files with summary rows (a run kept
with ``--out``, e.g. alibaba-replay-scale0.2.json) follow the five. The machine, commit and load of each run are listed
under the table: figures from a loaded or dirty run, or one on a broker still compiling (broker
JIT, ADR 0043), are read with that in mind.
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--results", default=str(RESULTS), help="directory of the benchmark JSON files")
    args = p.parse_args()
    rows, runs = [], []
    # the five of record first, then any extra run kept under another name (e.g. a smaller scale)
    extra = sorted(p.stem for p in Path(args.results).glob("*.json")
                   if p.stem not in ORDER and "summary_rows" in json.loads(p.read_text()))  # fmt: skip
    for name in (*ORDER, *extra):
        path = Path(args.results) / f"{name}.json"
        if not path.exists():
            rows.append(row(f"{name}", "not run (no JSON)", "—", "—", None))
            continue
        report = json.loads(path.read_text())
        rows.extend(webhook_rows(report) if name == "bench-webhook" else report.get("summary_rows", []))
        m = report.get("machine", {})
        commit = (m.get("git_commit") or "?")[:10] + (" dirty" if m.get("git_dirty") else "")
        runs.append(f"- {name}: {m.get('cpus')} cores, {m.get('memory_gib')} GiB, Python {m.get('python')}, "
                    f"faust {m.get('faust')}, aiokafka {m.get('aiokafka')}, Kafka {m.get('kafka')}, commit {commit}, "
                    f"load {report.get('load_before')} → {report.get('load_after')}, "
                    f"calibration {m.get('calibration_s', '?')} s"
                    + ("" if report.get("broker_jit_cpu_s") is None
                       else f", broker JIT {report['broker_jit_cpu_s']} CPU-s"))  # fmt: skip
    print("## Quartermaster benchmarks (make bench)\n")
    print_rows(rows)
    print("\nRuns:\n" + "\n".join(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
