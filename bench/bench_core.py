"""bench-core: one drain pass of the quota core over 50,000 pending workloads in
1,000 ClusterQueues in 10 cohorts. Writes bench/results/bench-core.json.

Each cohort has 100 ClusterQueues with two GPU flavors (a100, h100; nominal 8 each,
borrowingLimit 4, lendingLimit 4) and a cpu resource group. Each queue has 50 pending
workloads of 1–4 GPUs, mixed priorities; 10% of the queues are StrictFIFO. About half of
the demand fits, so the pass exercises admission, borrowing, flavor fallback, in-queue
preemption (withinClusterQueue: LowerPriority) and the
inadmissible paths. Deterministic (fixed seed).

Two scenarios, both reported in the JSON:

* ``within-cq`` — preemption ``withinClusterQueue: LowerPriority`` only;
* ``reclaim-any`` — Kueue's baseline: also ``reclaimWithinCohort: Any``, so every nomination
  that does not fit searches victims among the borrowing queues of its 100-queue cohort.

Each drain is timed several times without tracemalloc (best and median reported, with the
1-minute load average: the machine is shared), alternating the collector thresholds the
services run with (ADR 0013) and CPython's defaults; then once more under tracemalloc for
peak memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.adapters.gc_tuning import SERVICE_THRESHOLDS, tune_gc  # noqa: E402
from services.core.quota import WorkloadStatus, build_snapshot, drain, load_objects  # noqa: E402

COHORTS = 10
CQS_PER_COHORT = 100
WORKLOADS_PER_CQ = 50
V1 = "kueue.x-k8s.io/v1beta1"


SCENARIOS = {
    "within-cq": {"withinClusterQueue": "LowerPriority"},
    "reclaim-any": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
}
REPEATS = {"within-cq": 5, "reclaim-any": 2}
NOW = 1_735_700_000.0
DEFAULT_GC = (700, 10, 10)  # CPython's


def documents(preemption: dict | None = None) -> list[dict]:
    preemption = dict(SCENARIOS["within-cq"] if preemption is None else preemption)
    rng = random.Random(42)
    docs: list[dict] = [
        {
            "apiVersion": V1,
            "kind": "ResourceFlavor",
            "metadata": {"name": f},
            "spec": {"nodeLabels": {"gpu": f}},
        }
        for f in ("a100", "h100", "cpu-pool")
    ]
    for c in range(COHORTS):
        docs.append({"apiVersion": V1, "kind": "Cohort", "metadata": {"name": f"cohort-{c}"}, "spec": {}})
        for q in range(CQS_PER_COHORT):
            name = f"cq-{c}-{q}"
            docs.append(
                {
                    "apiVersion": V1,
                    "kind": "ClusterQueue",
                    "metadata": {"name": name},
                    "spec": {
                        "cohort": f"cohort-{c}",
                        "namespaceSelector": {},
                        "queueingStrategy": "StrictFIFO" if q % 10 == 0 else "BestEffortFIFO",
                        "preemption": dict(preemption),
                        "resourceGroups": [
                            {
                                "coveredResources": ["nvidia.com/gpu"],
                                "flavors": [
                                    {
                                        "name": f,
                                        "resources": [
                                            {
                                                "name": "nvidia.com/gpu",
                                                "nominalQuota": 8,
                                                "borrowingLimit": 4,
                                                "lendingLimit": 4,
                                            }
                                        ],
                                    }
                                    for f in ("a100", "h100")
                                ],
                            },
                            {
                                "coveredResources": ["cpu"],
                                "flavors": [
                                    {"name": "cpu-pool", "resources": [{"name": "cpu", "nominalQuota": 64}]}
                                ],
                            },
                        ],
                    },
                }
            )
            docs.append(
                {
                    "apiVersion": V1,
                    "kind": "LocalQueue",
                    "metadata": {"name": "lq", "namespace": name},
                    "spec": {"clusterQueue": name},
                }
            )
            for w in range(WORKLOADS_PER_CQ):
                docs.append(
                    {
                        "apiVersion": V1,
                        "kind": "Workload",
                        "metadata": {
                            "name": f"wl-{w}",
                            "namespace": name,
                            "creationTimestamp": f"2025-01-01T00:{w // 60:02d}:{w % 60:02d}Z",
                        },
                        "spec": {
                            "queueName": "lq",
                            "priority": rng.choice((0, 0, 0, 10, 100)),
                            "podSets": [
                                {
                                    "name": "main",
                                    "count": 1,
                                    "template": {
                                        "spec": {
                                            "containers": [
                                                {
                                                    "name": "c",
                                                    "resources": {
                                                        "requests": {
                                                            "nvidia.com/gpu": rng.randint(1, 4),
                                                            "cpu": f"{rng.randint(1, 8) * 500}m",
                                                        }
                                                    },
                                                }
                                            ]
                                        }
                                    },
                                }
                            ],
                        },
                    }
                )
    return docs


def run_scenario(name: str, repeats: int | None = None) -> dict:
    docs = documents(SCENARIOS[name])
    t0 = time.perf_counter()
    objects = load_objects(("bench", d) for d in docs)
    snapshot = build_snapshot(objects)
    pending = [w for w in objects.workloads if w.admission is None]
    t_load = time.perf_counter() - t0

    # Timed under the collector settings the services run with (services.adapters.gc_tuning),
    # then under CPython's default ones, alternating, so both see the same machine load.
    runs: dict[str, list[dict[str, float]]] = {"service_gc": [], "default_gc": []}
    result = None
    for _ in range(repeats or int(os.environ.get("BENCH_REPEATS", REPEATS[name]))):
        for setting, thresholds in (("service_gc", tune_gc({})), ("default_gc", DEFAULT_GC)):
            gc.set_threshold(*thresholds)
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            result = drain(snapshot, pending, now=NOW)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            runs[setting].append(
                {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "load_average_1m": os.getloadavg()[0]}
            )
    assert result is not None
    tune_gc({})
    tracemalloc.start()
    t1 = time.perf_counter()
    drain(snapshot, pending, now=NOW)
    t_traced = time.perf_counter() - t1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    counts: dict[str, int] = {}
    for d in result.decisions:
        counts[str(d.status)] = counts.get(str(d.status), 0) + 1
    assert counts.get(str(WorkloadStatus.ADMITTED), 0) > 0
    decisions = len(result.decisions)
    walls = sorted(r["wall_s"] for r in runs["service_gc"])
    best, median = walls[0], statistics.median(walls)
    default_median = statistics.median(r["wall_s"] for r in runs["default_gc"])
    return {
        "preemption": SCENARIOS[name],
        "workloads": decisions,
        "cycles": result.cycles,
        "status_counts": counts,
        "load_and_snapshot_s": round(t_load, 3),
        "drain_runs": runs,
        "gc_thresholds": list(SERVICE_THRESHOLDS),
        "drain_best_s": best,
        "drain_median_s": median,
        "drain_median_s_default_gc": default_median,
        "decisions_per_s_best": round(decisions / best),
        "decisions_per_s_median": round(decisions / median),
        "drain_with_tracemalloc_s": round(t_traced, 3),
        "peak_memory_mib_during_drain": round(peak / 2**20, 1),
        "target_s": 2.0,
        "within_target_median": median < 2.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help=f"which to run: {', '.join(SCENARIOS)} (default: both)")
    parser.add_argument("--repeats", type=int, metavar="N",
                        help="timed drains per collector setting (default: BENCH_REPEATS, else "
                             + ", ".join(f"{k} {v}" for k, v in REPEATS.items()) + ")")
    args = parser.parse_args()
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"no scenario {', '.join(map(repr, unknown))}: choose from {', '.join(SCENARIOS)}")
    only = args.scenarios or list(SCENARIOS)
    report: dict[str, object] = {
        "benchmark": "bench-core: one drain pass",
        "cluster_queues": COHORTS * CQS_PER_COHORT,
        "cohorts": COHORTS,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "scenarios": {},
    }
    for name in only:
        r = run_scenario(name, args.repeats)
        report["scenarios"][name] = r  # type: ignore[index]
        print(
            f"bench-core [{name}]: {r['workloads']} workloads, {COHORTS * CQS_PER_COHORT} ClusterQueues, "
            f"{COHORTS} cohorts, {r['cycles']} cycles"
        )
        print(
            f"  drain pass best {r['drain_best_s']:.3f} s, median {r['drain_median_s']:.3f} s "
            f"({r['decisions_per_s_median']} decisions/s median), target < 2 s: "
            f"{'OK' if r['within_target_median'] else 'MISSED'} (service GC thresholds "
            f"{tuple(r['gc_thresholds'])}; with CPython's default GC: median {r['drain_median_s_default_gc']:.3f} s)"
        )
        print(f"  runs {r['drain_runs']}")
        print(
            f"  peak memory during drain {r['peak_memory_mib_during_drain']} MiB (tracemalloc), "
            f"load+snapshot {r['load_and_snapshot_s']:.3f} s"
        )
        print(f"  status: {r['status_counts']}")
    out = ROOT / "bench" / "results" / "bench-core.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"  wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
