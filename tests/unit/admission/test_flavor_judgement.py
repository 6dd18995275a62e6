"""Policies judged where a workload would run (services/admission/placement.py, ADR 0070): the
field report's "only approved projects may use the A100 cluster", for a Job that names no GPU
class and lands in a queue that offers A100s."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.admission import placement
from services.admission.translate import kubernetes_object
from services.contracts.events import WorkloadSubmitted
from services.core.quota import load_objects
from services.policy import EnforcementPoint, PolicySet, evaluate

LIBRARY = PolicySet.load(Path(__file__).resolve().parents[3] / "policies" / "library")
V1 = "kueue.x-k8s.io/v1beta1"
CLASS = "gpu.nvidia.com/class"
GPU = "nvidia.com/gpu"


def config(*flavors: str):
    docs = [{"apiVersion": V1, "kind": "ResourceFlavor", "metadata": {"name": f"{f}-flavor"},
             "spec": {"nodeLabels": {CLASS: f}}} for f in ("a100", "h100")]
    docs.append({"apiVersion": V1, "kind": "ClusterQueue", "metadata": {"name": "gpu-queue"}, "spec": {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": [GPU], "flavors": [
            {"name": f"{f}-flavor", "resources": [{"name": GPU, "nominalQuota": 8}]} for f in flavors]}]}})
    return load_objects(("test", d) for d in docs)


def namespace(name: str, approved: bool):
    labels = {"kubernetes.io/metadata.name": name}
    if approved:
        labels["quartermaster.dev/approved"] = "true"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def submitted(ns: str, node_selector: dict[str, str] | None = None) -> WorkloadSubmitted:
    pod_set = {"name": "main", "count": 1, "requests": {GPU: 4000}}
    if node_selector:
        pod_set["node_selector"] = node_selector
    return WorkloadSubmitted(uid="u", namespace=ns, name="finetune", kind="Job", queue_name="team",
                             created_at="2026-11-29T10:00:00Z", pod_sets=[pod_set],
                             labels={"kueue.x-k8s.io/queue-name": "team", "quartermaster.dev/cost-center": "cc-1"})


def judged(ns: str, approved: bool, objects, node_selector=None):
    w = submitted(ns, node_selector)
    obj = kubernetes_object(w)
    ns_obj = namespace(ns, approved)

    def judge(o, only=None):
        return evaluate(LIBRARY, o, ns_obj, usage={}, enforcement_point=EnforcementPoint.BUS, only=only)

    assert judge(obj).allowed, judge(obj).message  # nothing refuses the Job as submitted
    return placement.judge(judge, LIBRARY, obj, objects, "gpu-queue", w.pod_sets)


def test_an_unapproved_namespace_is_refused_the_a100_flavor_and_keeps_the_h100_one():
    j = judged("dev-team", False, config("a100", "h100"))
    assert not j.dead_ends
    refused = j.refused_flavors()
    assert list(refused) == ["a100-flavor"]
    assert refused["a100-flavor"].startswith("[a100-approved-projects] namespace dev-team is not approved for a100")


def test_a_queue_that_offers_only_a100_is_a_dead_end_and_says_so():
    j = judged("dev-team", False, config("a100"))
    assert j.dead_ends == (("main", GPU, ("a100-flavor",)),)
    [violation] = placement.dead_end_violations(j, "gpu-queue")
    assert violation.policy == "a100-approved-projects"
    assert "if admitted to flavor a100-flavor; ClusterQueue gpu-queue offers nvidia.com/gpu to pod set main " \
           "only on a100-flavor, and the policies refuse each" in violation.message


def test_an_approved_namespace_is_refused_nothing():
    assert judged("ml-team", True, config("a100", "h100")) == placement.Judgement()


def test_a_flavor_the_jobs_selector_rules_out_is_not_judged():
    j = judged("dev-team", False, config("a100", "h100"), node_selector={CLASS: "h100"})
    assert j == placement.Judgement()


@pytest.mark.parametrize("kind", ["Job", "Workload"])
def test_the_placed_object_is_what_the_watchers_admit_leaves(kind):
    w = submitted("dev-team", {"zone": "z1"})
    if kind == "Workload":
        w = WorkloadSubmitted(**{**{f: getattr(w, f) for f in w.__slots__}, "kind": "JobSet"})
    obj = kubernetes_object(w)
    assert obj["kind"] == kind
    out = placement.placed(obj, "a100-flavor", {CLASS: "a100"}, {"main": [GPU]})
    assert out["metadata"]["annotations"]["quartermaster.dev/admitted-flavor"] == "a100-flavor"
    pod_spec = (out["spec"]["template"]["spec"] if kind == "Job" else out["spec"]["podSets"][0]["template"]["spec"])
    assert pod_spec["nodeSelector"] == {"zone": "z1", CLASS: "a100"}
    assert "nodeSelector" in (obj["spec"]["template"]["spec"] if kind == "Job" else obj["spec"]["podSets"][0]["template"]["spec"])
    assert obj["metadata"]["annotations"] == {}  # the submitted object is left as it was
    if kind == "Workload":
        assert out["status"]["admission"]["podSetAssignments"] == [{"name": "main", "flavors": {GPU: "a100-flavor"}}]



def test_an_affinity_that_allows_either_class_is_judged_on_each_and_kept_off_a100():
    """ADR 0071, 0073: a queued Job whose pods may run on A100 or H100 nodes (required node
    affinity, In) passes as submitted and is kept off the A100 flavor alone."""
    w = submitted("dev-team")
    w.pod_sets[0]["node_affinity"] = [[{"key": CLASS, "operator": "In", "values": ["a100", "h100"]}]]
    obj = kubernetes_object(w)
    ns_obj = namespace("dev-team", False)

    def judge(o, only=None):
        return evaluate(LIBRARY, o, ns_obj, usage={}, enforcement_point=EnforcementPoint.BUS, only=only)

    assert judge(obj).allowed
    j = placement.judge(judge, LIBRARY, obj, config("a100", "h100"), "gpu-queue", w.pod_sets)
    assert list(j.refused_flavors()) == ["a100-flavor"] and not j.dead_ends
    # a queue that offers A100s alone is a dead end, refused in the policy's words
    j = placement.judge(judge, LIBRARY, obj, config("a100"), "gpu-queue", w.pod_sets)
    assert j.dead_ends and "not approved for a100" in j.refused_flavors()["a100-flavor"]


def test_an_affinity_that_allows_only_a100_is_refused_as_submitted():
    w = submitted("dev-team")
    w.pod_sets[0]["node_affinity"] = [[{"key": CLASS, "operator": "In", "values": ["a100"]}]]
    decision = evaluate(LIBRARY, kubernetes_object(w), namespace("dev-team", False), usage={},
                        enforcement_point=EnforcementPoint.BUS)
    assert not decision.allowed
    assert decision.violations[0].message.startswith("namespace dev-team is not approved for a100 GPUs")


def test_a_job_outside_every_queue_that_may_land_on_a100_is_refused():
    """Nothing judges its flavors: kube-scheduler may put it on an A100 node."""
    w = submitted("dev-team")
    w.pod_sets[0]["node_affinity"] = [[{"key": CLASS, "operator": "In", "values": ["a100", "h100"]}]]
    obj = kubernetes_object(w)
    del obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    decision = evaluate(LIBRARY, obj, namespace("dev-team", False), usage={}, enforcement_point=EnforcementPoint.BUS)
    assert not decision.allowed


def test_the_webhook_reads_a_pod_templates_affinity_as_the_watcher_does():
    pod_spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": CLASS, "operator": "In", "values": ["h100"]}]}]}}},
        "containers": [{"name": "c", "resources": {"limits": {GPU: "2"}}}]}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "dev-team"},
           "spec": {"parallelism": 1, "template": {"spec": pod_spec}}}
    assert placement.pod_sets_of(job) == [{"name": "main", "count": 1, "requests": {GPU: 2000},
                                           "node_affinity": [[{"key": CLASS, "operator": "In", "values": ["h100"]}]]}]
    assert placement.offered_flavors(config("a100", "h100"), "gpu-queue", placement.pod_sets_of(job)) == [
        ("main", GPU, ("h100-flavor",))]



def test_a_flavor_whose_taints_the_pods_do_not_tolerate_is_not_judged():
    objects = load_objects(("test", d) for d in [
        {"apiVersion": V1, "kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"},
         "spec": {"nodeLabels": {CLASS: "a100"}, "nodeTaints": [{"key": "reserved", "effect": "NoSchedule"}]}},
        {"apiVersion": V1, "kind": "ResourceFlavor", "metadata": {"name": "h100-flavor"},
         "spec": {"nodeLabels": {CLASS: "h100"}}},
        {"apiVersion": V1, "kind": "ClusterQueue", "metadata": {"name": "gpu-queue"}, "spec": {
            "namespaceSelector": {}, "resourceGroups": [{"coveredResources": [GPU], "flavors": [
                {"name": f, "resources": [{"name": GPU, "nominalQuota": 8}]} for f in ("a100-flavor", "h100-flavor")]}]}}])
    w = submitted("dev-team")
    assert placement.offered_flavors(objects, "gpu-queue", w.pod_sets) == [("main", GPU, ("h100-flavor",))]
    w.pod_sets[0]["tolerations"] = [{"key": "reserved", "operator": "Exists", "value": "", "effect": ""}]
    assert placement.offered_flavors(objects, "gpu-queue", w.pod_sets) == [
        ("main", GPU, ("a100-flavor", "h100-flavor"))]
