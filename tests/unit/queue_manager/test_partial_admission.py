"""Partial admission (Kueue's minCount): the admit action says how many pods the quota holds,
so the watcher runs only those; a workload admitted whole says nothing more."""

from __future__ import annotations

from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import decode, encode, make_envelope
from services.contracts.events import WorkloadValidated
from services.core.quota import load_objects
from services.queue_manager.state import Context, apply

V1 = "kueue.x-k8s.io/v1beta1"
DOCS = [
    {"apiVersion": V1, "kind": "ResourceFlavor", "metadata": {"name": "default"}, "spec": {}},
    {"apiVersion": V1, "kind": "ClusterQueue", "metadata": {"name": "cq"}, "spec": {"namespaceSelector": {},
     "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [{"name": "default", "resources": [
         {"name": "cpu", "nominalQuota": 3}]}]}]}},
    {"apiVersion": V1, "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": "ns"}, "spec": {"clusterQueue": "cq"}},
]
CONFIG = KueueConfig.from_objects(load_objects(("test.yaml", d) for d in DOCS))
CTX = Context(objects=CONFIG.objects, cache_key=CONFIG.root_of["cq"])


def _validated(name: str, count: int, min_count: int | None = None, at: str = "2026-11-29T10:00:00Z"):
    pod_set = {"name": "main", "count": count, "requests": {"cpu": 1000}}
    if min_count is not None:
        pod_set["min_count"] = min_count
    return make_envelope(WorkloadValidated(uid=f"uid-{name}", namespace="ns", name=name, queue_name="lq",
                                           cluster_queue="cq", priority=0, created_at=at, pod_sets=[pod_set]),
                         producer="test", occurred_at=at)


def _admit_actions(outputs):
    return [decode(encode(o.envelope)).payload for o in outputs if o.envelope.event_type == "action.admit.v1"]


def test_a_partial_admission_tells_the_watcher_how_many_pods_run():
    state, outputs = apply(None, _validated("whole", 1), CTX)
    (whole,) = _admit_actions(outputs)
    assert whole.counts is None  # admitted whole: the Job runs as it is
    state, outputs = apply(state, _validated("elastic", 4, min_count=1, at="2026-11-29T10:00:01Z"), CTX)
    (partial,) = _admit_actions(outputs)
    assert partial.counts == {"main": 2}  # 2 cpu left of 3: 2 of its 4 pods
    assert state["admitted"]["uid-elastic"]["usage"] == {"default": {"cpu": 2000}}
