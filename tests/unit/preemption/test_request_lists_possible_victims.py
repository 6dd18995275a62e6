"""A preemption request lists only the workloads that could be victims and sums the others'
usage per ClusterQueue: the preemption service must choose exactly the victims it chose when
every admitted workload was listed.

Random cohorts of three ClusterQueues with different preemption policies, some borrowing, with
workloads of every class and priority; the reference is the request as it was before (the whole
admitted set, no sums)."""

from __future__ import annotations

import random

import pytest

from services.core.quota import AdmittedWorkload, build_snapshot, could_be_victim, load_objects
from services.preemption.fold import Context, apply
from tests.unit.preemption.test_preemption_fold import answer, at, needed

COHORT = "cohort:ai-platform"
QUEUES = {  # ClusterQueue -> (withinClusterQueue, reclaimWithinCohort)
    "gpu-queue": ("LowerPriority", "Any"),
    "research": ("LowerOrNewerEqualPriority", "LowerPriority"),
    "batch-pool": ("Never", "Any"),
}
TEAMS = {"ml-team": "gpu-queue", "batch-team": "research", "serving-team": "batch-pool"}
CLASSES = ("training", "inference", "batch")


def kueue_docs() -> list[dict]:
    docs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Cohort", "metadata": {"name": "ai-platform"}, "spec": {}},
    ]
    for name, (within, reclaim) in QUEUES.items():
        docs.append({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"cohort": "ai-platform", "namespaceSelector": {},
                     "preemption": {"withinClusterQueue": within, "reclaimWithinCohort": reclaim},
                     "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                         {"name": "a100-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 16}]}]}]}})
    for ns, cq in TEAMS.items():
        queue = {"ml-team": "team-ml", "batch-team": "batch", "serving-team": "serving"}[ns]
        docs.append({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                     "metadata": {"name": queue, "namespace": ns}, "spec": {"clusterQueue": cq}})
    return docs


OBJECTS = load_objects(("kueue.yaml", d) for d in kueue_docs())
CTX = Context(objects=OBJECTS)


def random_admitted(rng: random.Random) -> list[dict]:
    """Most of the cohort's 48 GPUs, most of it in one or two ClusterQueues (so they borrow)."""
    docs, total, fill = [], 0, rng.randint(40, 48)
    for i in range(40):
        gpus = rng.choice([1, 2, 4, 8])
        if total + gpus > fill:
            break
        total += gpus
        ns = rng.choices(list(TEAMS), weights=[5, 3, 1])[0]
        reserved = -rng.uniform(1, 300)
        docs.append({
            "uid": f"uid-w{i}", "namespace": ns, "name": f"w{i}", "cluster_queue": TEAMS[ns],
            "priority": rng.choice([0, 100, 1000]), "created_at": at(reserved - 1),
            "labels": {"quartermaster.dev/class": rng.choices(CLASSES, weights=[1, 1, 4])[0]},
            "usage": {"a100-flavor": {"nvidia.com/gpu": gpus * 1000}},
            "reserved_at": at(reserved), "running_at": at(reserved + 0.5),
        })
    return docs


def listed_and_summed(docs: list[dict], cluster_queue: str, priority: int) -> tuple[list[dict], dict]:
    """The request's split: possible victims listed, the rest summed per ClusterQueue."""
    snapshot = build_snapshot(OBJECTS, [
        AdmittedWorkload(key=f"{d['namespace']}/{d['name']}", cluster_queue=d["cluster_queue"],
                         priority=d["priority"], uid=d["uid"],
                         usage=((("a100-flavor", "nvidia.com/gpu"), d["usage"]["a100-flavor"]["nvidia.com/gpu"]),))
        for d in docs])
    possible = could_be_victim(snapshot, cluster_queue, priority)
    listed, summed = [], {}
    for d in docs:
        if possible(d["cluster_queue"], d["priority"]):
            listed.append(d)
        else:
            by_res = summed.setdefault(d["cluster_queue"], {}).setdefault("a100-flavor", {})
            by_res["nvidia.com/gpu"] = by_res.get("nvidia.com/gpu", 0) + d["usage"]["a100-flavor"]["nvidia.com/gpu"]
    return listed, summed


@pytest.mark.parametrize("seed", range(300))
def test_the_victims_are_the_same_as_with_every_admitted_workload_listed(seed):
    rng = random.Random(seed)
    docs = random_admitted(rng)
    ns = rng.choice(list(TEAMS))
    priority = rng.choice([0, 100, 1000])
    full = needed(ns, "pre", rng.choice(["inference", "batch"]), rng.choice([4, 8, 16]), priority, docs)
    listed, summed = listed_and_summed(docs, TEAMS[ns], priority)
    reduced = needed(ns, "pre", full.payload.preemptor["labels"]["quartermaster.dev/class"],
                     full.payload.preemptor["pod_sets"][0]["requests"]["nvidia.com/gpu"] // 1000, priority, listed)
    reduced.payload.snapshot["others_usage"] = summed

    expected, got = answer(apply(None, full, CTX)[1]), answer(apply(None, reduced, CTX)[1])
    assert got.victims == expected.victims
    assert (got.blocked_message is None) == (expected.blocked_message is None)


def test_the_split_lists_own_lower_or_equal_priority_and_every_workload_of_a_borrowing_queue():
    def doc(name, cq, prio, gpus):
        ns = {v: k for k, v in TEAMS.items()}[cq]
        return {"uid": f"uid-{name}", "namespace": ns, "name": name, "cluster_queue": cq, "priority": prio,
                "created_at": at(-10), "labels": {}, "usage": {"a100-flavor": {"nvidia.com/gpu": gpus * 1000}},
                "reserved_at": at(-9), "running_at": at(-8)}

    docs = [doc("own-low", "gpu-queue", 0, 2), doc("own-equal", "gpu-queue", 100, 2),
            doc("own-high", "gpu-queue", 1000, 2),
            doc("borrower-high", "research", 1000, 12), doc("borrower-low", "research", 0, 8),  # 20 > 16: borrowing
            doc("within-quota", "batch-pool", 0, 4)]
    listed, summed = listed_and_summed(docs, "gpu-queue", 100)
    assert [d["name"] for d in listed] == ["own-low", "own-equal", "borrower-high", "borrower-low"]
    assert summed == {"gpu-queue": {"a100-flavor": {"nvidia.com/gpu": 2000}},
                      "batch-pool": {"a100-flavor": {"nvidia.com/gpu": 4000}}}
