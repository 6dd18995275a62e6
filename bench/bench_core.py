"""bench-core: one drain pass of the quota core over 50,000 pending workloads in
1,000 ClusterQueues in 10 cohorts. Writes bench/results/bench-core.json.

Each cohort has 100 ClusterQueues with two GPU flavors (a100, h100; nominal 8 each,
borrowingLimit 4, lendingLimit 4) and a cpu resource group. Each queue has 50 pending
workloads of 1–4 GPUs, mixed priorities; 10% of the queues are StrictFIFO. About half of
the demand fits, so the pass exercises admission, borrowing, flavor fallback, in-queue
preemption (withinClusterQueue: LowerPriority) and the
inadmissible paths. Deterministic (fixed seed).
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.quota import WorkloadStatus, build_snapshot, drain, load_objects  # noqa: E402

COHORTS = 10
CQS_PER_COHORT = 100
WORKLOADS_PER_CQ = 50
V1 = "kueue.x-k8s.io/v1beta1"


def documents() -> list[dict]:
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
                        "preemption": {"withinClusterQueue": "LowerPriority"},
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


def main() -> None:
    docs = documents()
    t0 = time.perf_counter()
    objects = load_objects(("bench", d) for d in docs)
    snapshot = build_snapshot(objects)
    pending = [w for w in objects.workloads if w.admission is None]
    t_load = time.perf_counter() - t0

    tracemalloc.start()
    t1 = time.perf_counter()
    result = drain(snapshot, pending, now=1_735_700_000.0)
    t_drain = time.perf_counter() - t1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # timing without tracemalloc overhead
    t2, c2 = time.perf_counter(), time.process_time()
    drain(snapshot, pending, now=1_735_700_000.0)
    t_plain, c_plain = time.perf_counter() - t2, time.process_time() - c2
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    counts: dict[str, int] = {}
    for d in result.decisions:
        counts[str(d.status)] = counts.get(str(d.status), 0) + 1
    decisions = len(result.decisions)
    report = {
        "benchmark": "bench-core: one drain pass",
        "workloads": decisions,
        "cluster_queues": COHORTS * CQS_PER_COHORT,
        "cohorts": COHORTS,
        "cycles": result.cycles,
        "status_counts": counts,
        "load_and_snapshot_s": round(t_load, 3),
        "drain_s": round(t_plain, 3),
        "drain_cpu_s": round(c_plain, 3),
        "load_average_1m": load_avg,
        "decisions_per_s": round(decisions / t_plain),
        "drain_with_tracemalloc_s": round(t_drain, 3),
        "peak_memory_mib_during_drain": round(peak / 2**20, 1),
        "target_s": 2.0,
        "within_target": t_plain < 2.0,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    assert counts.get(str(WorkloadStatus.ADMITTED), 0) > 0
    out = ROOT / "bench" / "results" / "bench-core.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"bench-core: {decisions} workloads, {COHORTS * CQS_PER_COHORT} ClusterQueues, {COHORTS} cohorts, "
        f"{result.cycles} cycles"
    )
    print(
        f"  drain pass {t_plain:.3f} s wall, {c_plain:.3f} s CPU ({report['decisions_per_s']} decisions/s), "
        f"target < 2 s: {'OK' if report['within_target'] else 'MISSED'} (1-min load average {load_avg})"
    )
    print(
        f"  peak memory during drain {report['peak_memory_mib_during_drain']} MiB (tracemalloc), "
        f"load+snapshot {t_load:.3f} s"
    )
    print(f"  status: {counts}")
    print(f"  wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
