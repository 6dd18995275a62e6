"""A drain handed only each kind's share of the waiting workloads (ADR 0077) must admit, evict,
requeue and ask for preemption exactly as one handed every workload that could fit: only the
Pending messages of waiting workloads it was not handed may differ (they keep their last one)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import make_envelope
from services.contracts.events import (
    ClockTick,
    WorkloadFinished,
    WorkloadPending,
    WorkloadQuotaReserved,
    WorkloadValidated,
)
from services.queue_manager import state as fold

START = datetime(2026, 12, 7, 9, tzinfo=UTC)
RECLAIM = ("Any", "LowerPriority", "Never")
WITHIN = ("LowerPriority", "Never")


def cohort_yaml(rng: random.Random, queues: int) -> str:
    docs = [
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ResourceFlavor\nmetadata: {name: default}\n",
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: Cohort\nmetadata: {name: team}\nspec: {}\n",
    ]
    for q in range(queues):
        borrowing = rng.choice(["", "borrowingLimit: 0", "borrowingLimit: 10", "borrowingLimit: 100"])
        docs.append(f"""apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {{name: cq-{q}}}
spec:
  cohort: team
  namespaceSelector: {{}}
  queueingStrategy: {rng.choice(["BestEffortFIFO", "BestEffortFIFO", "StrictFIFO"])}
  preemption: {{reclaimWithinCohort: {rng.choice(RECLAIM)}, withinClusterQueue: {rng.choice(WITHIN)}}}
  resourceGroups:
  - coveredResources: [cpu]
    flavors:
    - name: default
      resources:
      - name: cpu
        nominalQuota: {rng.choice([4, 10, 20])}
        {borrowing}
""")
        docs.append(f"apiVersion: kueue.x-k8s.io/v1beta1\nkind: LocalQueue\nmetadata: {{name: lq, namespace: ns-{q}}}\n"
                    f"spec: {{clusterQueue: cq-{q}}}\n")
    return "---\n".join(docs)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def fold_both(seed: int, tmp_path: Path, steps: int = 900) -> tuple[list, list, list, list]:
    """Drive two folds with the same events: one with the share (cap 0, the tightest), one
    handed every workload that could fit. Finishes pick from what the first admitted."""
    rng = random.Random(seed)
    queues = rng.choice([2, 4, 6])
    (tmp_path / "kueue.yaml").write_text(cohort_yaml(rng, queues))
    objects = KueueConfig.load(tmp_path).objects
    ctx = {cap: fold.Context(objects=objects, cache_key=f"feed-{seed}-{cap}") for cap in (0, None)}
    states: dict = {0: None, None: None}
    outputs: dict = {0: [], None: []}
    now, running, n = START, [], 0
    for _ in range(steps):
        now += timedelta(milliseconds=rng.choice([0, 0, 100, 1000]))  # many share a creation second
        roll = rng.random()
        if roll < 0.55:
            q = rng.randrange(queues)
            name = f"w{rng.randrange(10**6):06d}-{n}"  # name order is not uid order
            event = WorkloadValidated(
                uid=f"u{n:05d}", namespace=f"ns-{q}", name=name, queue_name="lq", cluster_queue=f"cq-{q}",
                cohort="team", priority=rng.choice([0, 0, 0, 100]), created_at=iso(now),
                pod_sets=[{"name": "main", "count": 1, "requests": {"cpu": rng.choice([1, 1, 1, 5]) * 1000}}])
            n += 1
        elif roll < 0.95 and running:
            uid, namespace, name = running.pop(rng.randrange(len(running)))
            event = WorkloadFinished(uid=uid, namespace=namespace, name=name, succeeded=True, finished_at=iso(now))
        else:
            event = ClockTick(at=iso(now), source="t")
        envelope = make_envelope(event, producer="t", occurred_at=iso(now))
        for cap in (0, None):
            fold.DRAIN_SHARE_MARGIN = cap
            states[cap], out = fold.apply(states[cap], envelope, ctx[cap])
            outputs[cap] += out
            if cap == 0:
                running += [(o.envelope.payload.uid, o.envelope.payload.namespace, o.envelope.payload.name)
                            for o in out if isinstance(o.envelope.payload, WorkloadQuotaReserved)]
    decided = {cap: [(o.topic, o.key, o.envelope.event_id) for o in outs
                     if not isinstance(o.envelope.payload, WorkloadPending)] for cap, outs in outputs.items()}
    pending = {cap: [o for o in outs if isinstance(o.envelope.payload, WorkloadPending)] for cap, outs in outputs.items()}
    return decided[0], decided[None], pending[0], pending[None]


@pytest.fixture(autouse=True)
def _restore_cap():
    cap = fold.DRAIN_SHARE_MARGIN
    yield
    fold.DRAIN_SHARE_MARGIN = cap


# 53, 69, 77, 102 and 135: a waiting preemptor cut from the fed pass stayed a preemptor there,
# while the whole pass judged it and ended its standing (`_preemptor_left_out`)
@pytest.mark.parametrize("seed", [*range(12), 53, 69, 77, 102, 135])
def test_a_drain_fed_its_share_decides_as_one_fed_all_that_fit(seed, tmp_path):
    shared, whole, said_shared, said_whole = fold_both(seed, tmp_path)
    assert shared == whole
    assert any(topic == "qm.actions" for topic, _, _ in shared)  # it admitted something


def test_each_kind_is_fed_its_share_of_the_room_and_names_where_it_was_cut(tmp_path):
    """Six queues of a cohort with room for 29 one-cpu workloads between them: handed every
    workload that could fit, each queue gives 30; fed their share, 5 (29 / 6, rounded up) plus
    the margin, and the last one fed of each is named, to be watched in the drain."""
    (tmp_path / "kueue.yaml").write_text("---\n".join(
        ["apiVersion: kueue.x-k8s.io/v1beta1\nkind: ResourceFlavor\nmetadata: {name: default}\n"]
        + [f"""apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {{name: cq-{q}}}
spec:
  cohort: team
  namespaceSelector: {{}}
  resourceGroups:
  - coveredResources: [cpu]
    flavors:
    - name: default
      resources:
      - {{name: cpu, nominalQuota: 5}}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {{name: lq, namespace: ns-{q}}}
spec: {{clusterQueue: cq-{q}}}
""" for q in range(6)]))
    ctx = fold.Context(objects=KueueConfig.load(tmp_path).objects, cache_key="feed-share", coalesce_drains=True)
    state = None
    for n in range(6 * 40):  # 30 are admitted
        q = n % 6
        event = WorkloadValidated(uid=f"u{n:04d}", namespace=f"ns-{q}", name=f"w{n:04d}", queue_name="lq",
                                  cluster_queue=f"cq-{q}", cohort="team", priority=0, created_at=iso(START),
                                  pod_sets=[{"name": "main", "count": 1, "requests": {"cpu": 1000}}])
        state, _ = fold.apply(state, make_envelope(event, producer="t", occurred_at=iso(START)), ctx)
    for entry in list(state["admitted"].values()):  # the first finish drains at once, the rest free 29 cpu
        event = WorkloadFinished(uid=entry["uid"], namespace=entry["namespace"], name=entry["name"], succeeded=True,
                                 finished_at=iso(START))
        state, _ = fold.apply(state, make_envelope(event, producer="t", occurred_at=iso(START)), ctx)
    snapshot = fold._index(ctx, state).snapshot
    index = fold._pending_index(ctx, state)
    every, none_cut = fold._worth_judging(snapshot, index, state["pending"], state["now"], None)
    assert len(every) == 6 * 30 and not none_cut
    shared, cut = fold._worth_judging(snapshot, index, state["pending"], state["now"], 2)
    assert len(shared) == 6 * (5 + 2)
    assert len(cut) == 6
    by_queue = {}
    for w in shared:
        by_queue.setdefault(w["cluster_queue"], []).append(f"{w['namespace']}/{w['name']}")
    assert sorted(cut) == sorted(names[-1] for names in by_queue.values())
    assert all(names == sorted(names) for names in by_queue.values())  # the queue's own order
