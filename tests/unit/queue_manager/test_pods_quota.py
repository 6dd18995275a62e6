"""A ClusterQueue that covers Kueue's `pods` resource: each reservation holds its pods, in the
drain that made it and in every one after it (the fold's own entries carry them)."""

from __future__ import annotations

from fold_steps import fold_all

from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import encode, make_envelope
from services.contracts.events import WorkloadFinished, WorkloadValidated
from services.core.quota import load_objects
from services.queue_manager.state import Context

V1 = "kueue.x-k8s.io/v1beta1"


def _context(groups: list[dict]) -> Context:
    docs = [
        {"apiVersion": V1, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": {}}
        for name in ("default", "pod-slots")
    ] + [
        {"apiVersion": V1, "kind": "ClusterQueue", "metadata": {"name": "cq"},
         "spec": {"namespaceSelector": {}, "resourceGroups": groups}},
        {"apiVersion": V1, "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": "ns"},
         "spec": {"clusterQueue": "cq"}},
    ]
    config = KueueConfig.from_objects(load_objects(("test.yaml", d) for d in docs))
    return Context(objects=config.objects, cache_key=config.root_of["cq"])


def _validated(i: int, count: int = 1):
    at = f"2026-11-29T10:00:{i:02d}Z"
    return make_envelope(WorkloadValidated(
        uid=f"u{i}", namespace="ns", name=f"w{i}", queue_name="lq", cluster_queue="cq", priority=0, created_at=at,
        pod_sets=[{"name": "main", "count": count, "requests": {"cpu": 500}}]), producer="test", occurred_at=at)


ONE_GROUP = [{"coveredResources": ["cpu", "pods"], "flavors": [{"name": "default", "resources": [
    {"name": "cpu", "nominalQuota": 10}, {"name": "pods", "nominalQuota": 3}]}]}]
OWN_GROUP = [
    {"coveredResources": ["cpu"], "flavors": [{"name": "default", "resources": [{"name": "cpu", "nominalQuota": 10}]}]},
    {"coveredResources": ["pods"], "flavors": [{"name": "pod-slots", "resources": [{"name": "pods", "nominalQuota": 3}]}]},
]


def test_arrivals_one_by_one_stop_at_the_pods_quota():
    ctx = _context(ONE_GROUP)
    state, outputs = fold_all([_validated(i) for i in range(5)], ctx)
    assert sorted(state["admitted"]) == ["u0", "u1", "u2"]
    assert sorted(state["pending"]) == ["u3", "u4"]
    reserved = [o.envelope.payload for o in outputs if o.envelope.event_type == "workload.quota_reserved.v1"]
    assert [r.usage for r in reserved] == [{"default": {"cpu": 500, "pods": 1000}}] * 3
    for output in outputs:  # the pods in a reservation's usage and a namespace's are in the contract
        encode(output.envelope)


def test_a_pod_set_of_two_holds_two_pods_in_the_pods_flavor_and_frees_them_when_it_ends():
    ctx = _context(OWN_GROUP)
    state, outputs = fold_all([_validated(0, count=2), _validated(1, count=2)], ctx)
    assert sorted(state["admitted"]) == ["u0"] and sorted(state["pending"]) == ["u1"]  # 2 + 2 pods > 3
    assert state["admitted"]["u0"]["usage"] == {"default": {"cpu": 1000}, "pod-slots": {"pods": 2000}}
    done = make_envelope(WorkloadFinished(uid="u0", namespace="ns", name="w0", succeeded=True,
                                          finished_at="2026-11-29T10:01:00Z"),
                         producer="test", occurred_at="2026-11-29T10:01:00Z")
    state, _ = fold_all([done], ctx, state)
    assert sorted(state["admitted"]) == ["u1"] and not state["pending"]
