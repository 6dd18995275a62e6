"""The queue-manager's side of preemption: ask with the cohort snapshot, then hold the freed
quota for the preemptor when the preemption service answers."""

from __future__ import annotations

import yaml

from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import make_envelope
from services.contracts.events import PreemptionVictimsSelected, WorkloadValidated
from services.queue_manager.state import Context, apply

AT = "2026-11-29T10:00:00Z"


def config(tmp_path) -> Context:
    docs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "gpu-queue"},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                      {"name": "a100-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 32}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
         "metadata": {"name": "team-ml", "namespace": "ml-team"}, "spec": {"clusterQueue": "gpu-queue"}},
    ]
    (tmp_path / "kueue.yaml").write_text(yaml.safe_dump_all(docs))
    cfg = KueueConfig.load(tmp_path)
    return Context(objects=cfg.objects, node_labels=cfg.node_labels())


def validated(name, gpus, priority, cls, at=AT):
    return make_envelope(WorkloadValidated(
        uid=f"uid-{name}", namespace="ml-team", name=name, queue_name="team-ml", cluster_queue="gpu-queue",
        priority=priority, created_at=at, labels={"quartermaster.dev/class": cls},
        pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}]),
        producer="test", occurred_at=at)


def run(ctx, events, state=None):
    outputs = []
    for e in events:
        state, out = apply(state, e, ctx)
        outputs += out
    return state, outputs


def test_asks_once_with_the_snapshot_then_admits_the_preemptor_in_the_same_step(tmp_path):
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated("train", 16, 0, "training"), validated("batch-a", 8, 0, "batch"),
                         validated("batch-b", 8, 0, "batch")])
    state, out = run(ctx, [validated("chat", 8, 1000, "inference", at="2026-11-29T10:01:00Z")], state)
    needed = [o for o in out if o.envelope.event_type == "preemption.needed.v1"]
    assert len(needed) == 1 and needed[0].topic == "qm.preemption" and needed[0].key == "gpu-queue"
    payload = needed[0].envelope.payload
    assert payload.preemptor["labels"] == {"quartermaster.dev/class": "inference"}
    assert {a["name"] for a in payload.snapshot["admitted"]} == {"train", "batch-a", "batch-b"}
    state, again = run(ctx, [validated("other", 1, 0, "batch", at="2026-11-29T10:01:30Z")], state)
    assert not [o for o in again if o.envelope.event_type == "preemption.needed.v1"]  # nothing changed

    answer = make_envelope(PreemptionVictimsSelected(
        preemptor_uid="uid-chat", cohort="gpu-queue",
        victims=[{"uid": "uid-batch-a", "namespace": "ml-team", "name": "batch-a", "cluster_queue": "gpu-queue",
                  "reason": "InClusterQueue", "policy": "inference-preempts-batch", "grace_period_s": 30}]),
        producer="preemption", occurred_at="2026-11-29T10:02:00Z")
    state, out = run(ctx, [answer], state)
    kinds = [o.envelope.event_type for o in out if o.topic == "qm.workloads"]
    assert kinds[:3] == ["workload.evicted.v1", "workload.released.v1", "workload.requeued.v1"]
    reserved = [o.envelope.payload.name for o in out if o.envelope.event_type == "workload.quota_reserved.v1"]
    assert reserved == ["chat"]  # the freed 8 GPUs went to the preemptor, not to "other" (1 GPU)
    assert "uid-batch-a" in state["pending"] and state["pending"]["uid-batch-a"]["eligible_at"] > state["now"]


def test_blocked_answer_leaves_the_preemptor_pending_with_the_policy_message(tmp_path):
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated("train", 32, 0, "training")])
    state, _ = run(ctx, [validated("chat", 8, 1000, "inference", at="2026-11-29T10:01:00Z")], state)
    message = "would need to preempt training job ml-team/train, which is not preemptible"
    answer = make_envelope(PreemptionVictimsSelected(preemptor_uid="uid-chat", cohort="gpu-queue", victims=[],
                                                     blocked_message=message),
                           producer="preemption", occurred_at="2026-11-29T10:01:05Z")
    state, out = run(ctx, [answer, answer], state)
    pending = [o.envelope.payload for o in out if o.envelope.event_type == "workload.pending.v1"]
    assert [(p.reason, p.message) for p in pending] == [("PreemptionBlocked", message)]
    assert "uid-train" in state["admitted"] and "uid-chat" in state["pending"]
