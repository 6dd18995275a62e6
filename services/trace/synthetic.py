"""A synthetic pod list with the shape of the Alibaba GPU trace, for runs where the trace is absent.

Seeded and deterministic (``random.Random(seed)``; same seed → same pods on every machine).
The proportions follow ``openb_pod_list_default.csv``: about 13% CPU-only pods, ~86% one-GPU
pods of which about half take a fractional share (160..810 milli), ~1% multi-GPU pods of 2,
4 or 8 whole GPUs; QoS mostly LS and BE with a few Burstable/Guaranteed; ~30% of GPU pods
constrained to one or more GPU models of a heterogeneous fleet; ~11% never scheduled
(Pending); scheduling delay usually zero; run times heavy-tailed; some pods still running at
the end of the window (deletion time = window end, as in the trace).
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from services.trace.alibaba import TracePod

__all__ = ["POD_CSV_COLUMNS", "synthetic_pods", "write_pod_csv"]

POD_CSV_COLUMNS: Final = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
_FRACTIONS: Final = (810, 470, 320, 650, 230, 460, 590, 160, 550, 220)
_MODELS: Final = ("G2", "T4", "P100", "V100M16", "V100M32", "G3", "A10")
_SPECS: Final = (
    ("T4",),
    ("G2",),
    ("P100",),
    ("V100M16", "V100M32"),
    ("P100", "V100M16", "V100M32"),
    ("G3",),
    ("A10", "G2", "T4"),
    ("V100M32",),
)


def synthetic_pods(count: int = 2000, *, seed: int = 2023, span_s: int = 14 * 86_400) -> list[TracePod]:
    """``count`` pods created over ``[0, span_s)``, named ``synth-pod-0000``..."""
    rng = random.Random(seed)
    pods: list[TracePod] = []
    for index in range(count):
        kind = rng.random()
        if kind < 0.13:
            num_gpu, gpu_milli = 0, 0
        elif kind < 0.99:
            num_gpu = 1
            gpu_milli = 1000 if rng.random() < 0.5 else rng.choice(_FRACTIONS)
        else:
            num_gpu, gpu_milli = rng.choice((2, 4, 8, 8)), 1000
        qos_draw = rng.random()
        qos = (
            "LS"
            if qos_draw < 0.57
            else "BE"
            if qos_draw < 0.986
            else "Burstable"
            if qos_draw < 0.999
            else "Guaranteed"
        )
        models = rng.choice(_SPECS) if num_gpu and rng.random() < 0.3 else ()
        cpu_milli = rng.choice((1000, 2000, 4000, 6000, 8000, 12000, 16000)) * max(1, num_gpu)
        memory_mib = cpu_milli // 1000 * rng.choice((2048, 4096))
        creation = rng.randrange(span_s)
        if rng.random() < 0.11:
            scheduled = None
            deletion = min(span_s, creation + int(rng.expovariate(1 / 600)))
            phase = "Pending"
        else:
            scheduled = creation if rng.random() < 0.6 else creation + int(rng.expovariate(1 / 300))
            run_s = int(math.exp(rng.gauss(7.5, 2.0)))  # median ~30 min, long tail to days
            deletion = scheduled + run_s
            phase = rng.choice(("Succeeded", "Failed", "Running"))
            if deletion >= span_s:
                deletion, phase = span_s, "Running"
            scheduled = min(scheduled, span_s)
        pods.append(
            TracePod(
                name=f"synth-pod-{index:04d}",
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_models=models,
                qos=qos,
                phase=phase,
                creation_s=creation,
                deletion_s=deletion,
                scheduled_s=scheduled,
            )
        )
    pods.sort(key=lambda pod: (pod.creation_s, pod.name))
    return pods


def write_pod_csv(pods: Iterable[TracePod], path: str | Path) -> Path:
    """Write pods in the trace's CSV layout (so the reader can be exercised on synthetic data)."""
    target = Path(path)
    with open(target, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(POD_CSV_COLUMNS)
        for pod in pods:
            writer.writerow(
                [
                    pod.name,
                    pod.cpu_milli,
                    pod.memory_mib,
                    pod.num_gpu,
                    pod.gpu_milli,
                    "|".join(pod.gpu_models),
                    pod.qos,
                    pod.phase,
                    "" if pod.creation_s is None else pod.creation_s,
                    "" if pod.deletion_s is None else pod.deletion_s,
                    "" if pod.scheduled_s is None else pod.scheduled_s,
                ]
            )
    return target
