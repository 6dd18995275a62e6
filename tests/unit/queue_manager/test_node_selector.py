"""A pod set's nodeSelector, and the flavors the admission policies refuse it, reach the
queue-manager's flavor assignment (ADR 0070): a Job asking for h100 nodes gets h100 quota and
is pinned to h100 nodes, never a100's first; a refused flavor is never assigned."""

from __future__ import annotations

import dataclasses

from fold_steps import fold_all

from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import make_envelope
from services.contracts.events import WorkloadValidated
from services.core.quota import load_objects
from services.queue_manager.state import Context

V1 = "kueue.x-k8s.io/v1beta1"
CLASS = "gpu.nvidia.com/class"
DOCS = [
    {"apiVersion": V1, "kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"},
     "spec": {"nodeLabels": {CLASS: "a100"}}},
    {"apiVersion": V1, "kind": "ResourceFlavor", "metadata": {"name": "h100-flavor"},
     "spec": {"nodeLabels": {CLASS: "h100"}}},
    {"apiVersion": V1, "kind": "ResourceFlavor", "metadata": {"name": "reserved-flavor"},
     "spec": {"nodeLabels": {CLASS: "h100"}, "nodeTaints": [{"key": "reserved", "value": "research",
                                                              "effect": "NoSchedule"}]}},
    {"apiVersion": V1, "kind": "ClusterQueue", "metadata": {"name": "reserved-queue"}, "spec": {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "reserved-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]},
        ]}]}},
    {"apiVersion": V1, "kind": "LocalQueue", "metadata": {"name": "team-reserved", "namespace": "ml-team"},
     "spec": {"clusterQueue": "reserved-queue"}},
    {"apiVersion": V1, "kind": "ClusterQueue", "metadata": {"name": "gpu-queue"}, "spec": {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "a100-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]},
            {"name": "h100-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]},
        ]}]}},
    {"apiVersion": V1, "kind": "LocalQueue", "metadata": {"name": "team-ml", "namespace": "ml-team"},
     "spec": {"clusterQueue": "gpu-queue"}},
]
CONFIG = KueueConfig.from_objects(load_objects(("test", d) for d in DOCS))
CTX = Context(objects=CONFIG.objects, pods_ready_timeout_s=300, node_labels=CONFIG.node_labels())


def validated(name: str, gpus: int, node_selector: dict[str, str] | None = None,
              refused: dict[str, str] | None = None):
    pod_set = {"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}
    if node_selector:
        pod_set["node_selector"] = node_selector
    if refused:
        pod_set["refused_flavors"] = refused
    payload = WorkloadValidated(uid=f"uid-{name}", namespace="ml-team", name=name, queue_name="team-ml",
                                cluster_queue="gpu-queue", priority=0, created_at="2026-11-29T10:00:00Z",
                                pod_sets=[pod_set])
    return make_envelope(payload, producer="test", occurred_at="2026-11-29T10:00:00Z")


def last(outputs, event_type):
    return [o.envelope.payload for o in outputs if o.envelope.event_type == event_type][-1]


def test_a_job_asking_for_h100_nodes_gets_h100_quota_and_is_pinned_there():
    _, outputs = fold_all([validated("h", 4, {CLASS: "h100"})], CTX)
    assert last(outputs, "workload.quota_reserved.v1").flavors == {"main": {"nvidia.com/gpu": "h100-flavor"}}
    assert last(outputs, "action.admit.v1").node_selector == {CLASS: "h100"}


def test_without_a_selector_the_first_flavor_that_fits_is_taken():
    _, outputs = fold_all([validated("any", 4)], CTX)
    assert last(outputs, "workload.quota_reserved.v1").flavors == {"main": {"nvidia.com/gpu": "a100-flavor"}}


def test_a_selector_no_flavor_matches_waits_with_kueues_reason():
    state, outputs = fold_all([validated("v", 4, {CLASS: "v100"})], CTX)
    assert "uid-v" not in state["admitted"]
    pending = last(outputs, "workload.pending.v1")
    assert "flavor a100-flavor doesn't match node affinity" in pending.message
    assert "flavor h100-flavor doesn't match node affinity" in pending.message


def test_h100_full_does_not_spill_a_job_that_asks_for_h100_onto_a100():
    state, outputs = fold_all([validated("first", 8, {CLASS: "h100"}), validated("second", 4, {CLASS: "h100"})], CTX)
    assert "uid-first" in state["admitted"] and "uid-second" not in state["admitted"]
    assert "insufficient unused quota for nvidia.com/gpu in flavor h100-flavor" in last(outputs, "workload.pending.v1").message



def test_a_flavor_the_policies_refuse_is_never_assigned_and_the_wait_says_why():
    refused = {"a100-flavor": "[a100-approved-projects] namespace dev-team is not approved for a100"}
    _, outputs = fold_all([validated("no-class", 4, refused=refused)], CTX)
    assert last(outputs, "workload.quota_reserved.v1").flavors == {"main": {"nvidia.com/gpu": "h100-flavor"}}
    # h100 full: it waits rather than take the a100 quota that stands free
    state, outputs = fold_all([validated("h-full", 8, {CLASS: "h100"}), validated("later", 4, refused=refused)], CTX)
    assert "uid-later" not in state["admitted"]
    message = last(outputs, "workload.pending.v1").message
    assert "flavor a100-flavor refused by policy: [a100-approved-projects] namespace dev-team is not approved" in message



def test_a_job_whose_node_affinity_allows_h100_only_gets_h100_quota():
    """ADR 0071: required node affinity, as the nodeSelector."""
    envelope = validated("aff", 4)
    envelope.payload.pod_sets[0]["node_affinity"] = [[{"key": CLASS, "operator": "In", "values": ["h100", "v100"]}]]
    _, outputs = fold_all([envelope], CTX)
    assert last(outputs, "workload.quota_reserved.v1").flavors == {"main": {"nvidia.com/gpu": "h100-flavor"}}
    assert last(outputs, "action.admit.v1").node_selector == {CLASS: "h100"}



def test_a_tainted_flavor_is_given_only_to_pods_that_tolerate_its_taints():
    """ADR 0072: reserved-flavor's nodes carry reserved=research:NoSchedule."""
    def on_reserved(name, tolerations=None):
        envelope = validated(name, 4)
        envelope.payload.pod_sets[0]["tolerations"] = tolerations or []
        return make_envelope(dataclasses.replace(envelope.payload, queue_name="team-reserved",
                                                 cluster_queue="reserved-queue"),
                             producer="test", occurred_at="2026-11-29T10:00:00Z")

    tolerating = [{"key": "reserved", "operator": "Equal", "value": "research", "effect": "NoSchedule"}]
    state, outputs = fold_all([on_reserved("plain"), on_reserved("tolerant", tolerating)], CTX)
    assert "uid-tolerant" in state["admitted"] and "uid-plain" not in state["admitted"]
    pending = last(outputs, "workload.pending.v1")
    assert pending.name == "plain"
    assert "untolerated taint reserved=research:NoSchedule in flavor reserved-flavor" in pending.message
