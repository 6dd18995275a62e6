"""The fold's cohort index (quota tree, per-namespace and per-node figures kept in step with
the admitted set) must decide exactly what a fold that rebuilds everything per event decides."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import make_envelope
from services.contracts.events import (
    ClockTick,
    NodeCapacity,
    PodFinished,
    PodRunning,
    WorkloadFinished,
    WorkloadRunning,
    WorkloadValidated,
)
from services.queue_manager import state as fold

COHORT = KueueConfig.load(Path(__file__).resolve().parents[3] / "examples" / "seed" / "cohort")
QUEUES = [("gpu-queue", "team-ml", "ml-team"), ("research-queue", "research", "research")]
START = datetime(2026, 11, 29, 10, tzinfo=UTC)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def random_events(seed: int, n: int = 400) -> list:
    rng = random.Random(seed)
    now = START
    events, submitted, running = [], [], set()
    for node in range(4):  # 32 GPUs of nodes: capacity, not only quota, decides some admissions
        events.append(make_envelope(NodeCapacity(node=f"n{node}", flavor="a100-flavor",
                                                 allocatable={"nvidia.com/gpu": 8000}), producer="t", occurred_at=iso(now)))
    for i in range(n):
        now += timedelta(seconds=rng.choice([1, 5, 30, 120]))
        roll = rng.random()
        if roll < 0.45 or not submitted:
            cq, queue, ns = rng.choice(QUEUES)
            uid = f"u{i}"
            submitted.append((uid, ns, f"w{i}"))
            events.append(make_envelope(WorkloadValidated(
                uid=uid, namespace=ns, name=f"w{i}", queue_name=queue, cluster_queue=cq, cohort="ai-platform",
                priority=rng.choice([0, 100]), created_at=iso(now),
                pod_sets=[{"name": "main", "count": rng.choice([1, 2]),
                           "requests": {"nvidia.com/gpu": rng.choice([1, 2, 4, 8]) * 1000}}]),
                producer="t", occurred_at=iso(now)))
        elif roll < 0.65:
            uid, ns, name = rng.choice(submitted)
            running.add(uid)
            events.append(make_envelope(PodRunning(uid=f"pod-{uid}", workload_uid=uid, namespace=ns, name=f"{name}-0",
                                                   node="n0", started_at=iso(now)), producer="t", occurred_at=iso(now)))
            events.append(make_envelope(WorkloadRunning(uid=uid, namespace=ns, name=name, started_at=iso(now)),
                                        producer="t", occurred_at=iso(now)))
        elif roll < 0.75 and running:
            uid = rng.choice(sorted(running))
            running.discard(uid)
            ns, name = next((n, w) for u, n, w in submitted if u == uid)
            events.append(make_envelope(PodFinished(uid=f"pod-{uid}", workload_uid=uid, namespace=ns, name=f"{name}-0",
                                                    phase="Failed", finished_at=iso(now)), producer="t", occurred_at=iso(now)))
        elif roll < 0.9:
            uid, ns, name = rng.choice(submitted)
            events.append(make_envelope(WorkloadFinished(uid=uid, namespace=ns, name=name, succeeded=True,
                                                         finished_at=iso(now)), producer="t", occurred_at=iso(now)))
        else:
            events.append(make_envelope(ClockTick(at=iso(now), source="t"), producer="t", occurred_at=iso(now)))
    return events


def run(events, cache_key):
    ctx = fold.Context(objects=COHORT.objects, pods_ready_timeout_s=300, zombie_ttl_s=600, cache_key=cache_key,
                       node_labels=COHORT.node_labels())
    state, said = None, []
    for event in events:
        state, outputs = fold.apply(state, event, ctx)
        said += [(o.topic, o.key, o.envelope.event_id, o.envelope.payload) for o in outputs]
    return state, said


@pytest.mark.parametrize("seed", range(6))
def test_the_indexed_fold_decides_as_the_rebuilding_one(seed):
    events = random_events(seed)
    fold._INDEXES.clear()
    indexed_state, indexed = run(events, cache_key=f"cohort:ai-platform-{seed}")
    rebuilt_state, rebuilt = run(events, cache_key=None)
    assert [s[2] for s in indexed] == [s[2] for s in rebuilt]  # the same events, in the same order
    assert indexed == rebuilt
    assert indexed_state == rebuilt_state
    kinds = {payload.__class__.__name__ for *_, payload in indexed}
    assert {"WorkloadQuotaReserved", "WorkloadReleased", "UsageSnapshot", "WorkloadPending"} <= kinds


def test_an_index_that_fell_out_of_step_is_rebuilt_not_trusted():
    events = random_events(7, n=200)
    key = "cohort:ai-platform-x"
    fold._INDEXES.clear()
    ctx = fold.Context(objects=COHORT.objects, pods_ready_timeout_s=300, cache_key=key, node_labels=COHORT.node_labels())
    state = None
    for event in events[:150]:
        state, _ = fold.apply(state, event, ctx)
    state["admitted"].pop(next(iter(state["admitted"])), None)  # changed behind the index's back
    for event in events[150:]:
        state, _ = fold.apply(state, event, ctx)
    index = fold._index(ctx, state)
    assert index.count == len(state["admitted"]) == len(index.snapshot.workloads)
