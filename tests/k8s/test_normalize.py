"""Pure normalization (services/watcher/normalize.py): no cluster needed, table-driven."""

from __future__ import annotations

import copy

import pytest

from services.contracts.codec import validate_document
from services.watcher import normalize as n
from services.watcher.normalize import Flavor


def valid(o: n.Observation) -> dict:
    """Every event the watcher builds passes the producer's strict schema check."""
    validate_document(o.event, strict=True)
    return o.event["payload"]


def job(**over):
    base = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml-team", "uid": "job-uid-1", "resourceVersion": "100",
                     "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"kueue.x-k8s.io/queue-name": "team-ml",
                                "kueue.x-k8s.io/priority-class": "high"},
                     "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                          "name": "pt", "uid": "pt-uid", "controller": True}]},
        "spec": {"suspend": True, "parallelism": 4, "completions": 4,
                 "template": {"spec": {"containers": [
                     {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "8"},
                                                 "requests": {"cpu": "500m", "memory": "1Gi"}}},
                     {"name": "b", "resources": {"requests": {"cpu": "1"}}}],
                     "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}]}}},
    }
    for k, v in over.items():
        base["spec"][k] = v
    return base


@pytest.mark.parametrize("q,milli", [
    ("8", 8000), ("500m", 500), ("1Gi", 2**30 * 1000), ("1k", 1_000_000), ("0.5", 500), ("1e3", 1_000_000),
    (2, 2000), ("100n", 1),
])
def test_quantity_milli(q, milli):
    assert n.quantity_milli(q) == milli


def test_job_with_queue_label_is_a_submitted_workload():
    o = n.workload_submitted(job())
    assert o is not None and o.topic == "qm.cluster" and o.key == "job-uid-1"
    p = valid(o)
    assert o.event["event_type"] == "workload.submitted.v1" and o.event["producer"] == "watcher"
    assert o.event["occurred_at"] == "2026-01-01T00:00:00Z"
    assert p["uid"] == "job-uid-1" and p["kind"] == "Job"
    assert p["queue_name"] == "team-ml" and p["priority_class"] == "high"
    assert p["owner"] == "PyTorchJob/pt"
    ps = p["pod_sets"][0]
    # GPUs from limits; cpu = max(0.5 + 1, init 4) = 4.
    assert ps["count"] == 4 and "min_count" not in ps
    assert ps["requests"] == {"cpu": 4000, "memory": 2**30 * 1000, "nvidia.com/gpu": 8000}


def test_a_pod_sets_node_selector_travels_with_it():
    """The queue-manager assigns only flavors that agree with it (ADR 0070)."""
    j = job()
    j["spec"]["template"]["spec"]["nodeSelector"] = {"gpu.nvidia.com/class": "h100", "a-zone": "z1"}
    ps = valid(n.workload_submitted(j))["pod_sets"][0]
    assert ps["node_selector"] == {"a-zone": "z1", "gpu.nvidia.com/class": "h100"}
    assert "node_selector" not in valid(n.workload_submitted(job()))["pod_sets"][0]


def test_a_pod_sets_tolerations_travel_with_it():
    """ADR 0072: a flavor's nodeTaints must be tolerated; tolerationSeconds stays the node's."""
    j = job()
    j["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "reserved", "operator": "Equal", "value": "research", "effect": "NoSchedule"},
        {"operator": "Exists"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]
    assert valid(n.workload_submitted(j))["pod_sets"][0]["tolerations"] == [
        {"key": "reserved", "operator": "Equal", "value": "research", "effect": "NoSchedule"},
        {"key": "", "operator": "Exists", "value": "", "effect": ""},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "value": "", "effect": "NoExecute"}]
    assert "tolerations" not in valid(n.workload_submitted(job()))["pod_sets"][0]


def test_a_pod_sets_required_node_affinity_travels_with_it():
    """ADR 0071: its matchExpressions (matchFields name nodes, and stay kube-scheduler's)."""
    j = job()
    j["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu.nvidia.com/class", "operator": "In", "values": ["a100", "h100"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]}},
        "podAntiAffinity": {}}
    ps = valid(n.workload_submitted(j))["pod_sets"][0]
    assert ps["node_affinity"] == [
        [{"key": "gpu.nvidia.com/class", "operator": "In", "values": ["a100", "h100"]}], []]
    assert "node_affinity" not in valid(n.workload_submitted(job()))["pod_sets"][0]


@pytest.mark.parametrize("parallelism,completions,count", [(4, 2, 2), (2, 10, 2), (3, None, 3), (None, None, 1)])
def test_pod_set_count_from_parallelism_and_completions(parallelism, completions, count):
    j = job(parallelism=parallelism, completions=completions)
    assert valid(n.workload_submitted(j))["pod_sets"][0]["count"] == count


def test_job_without_queue_label_is_not_a_workload():
    j = job()
    del j["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert n.workload_submitted(j) is None


def test_submitted_id_survives_any_resource_version():
    """Once-in-a-lifetime facts: a re-list at a later resourceVersion gives the same id."""
    a = n.workload_submitted(job())
    later = job(suspend=False)
    later["metadata"]["resourceVersion"] = "999"
    assert n.workload_submitted(later).event_id == a.event_id


def pod(phase, **kw):
    p = {"metadata": {"name": "train-abc", "namespace": "ml-team", "uid": "pod-1", "resourceVersion": "7",
                      "creationTimestamp": "2026-01-01T00:00:01Z",
                      "ownerReferences": [{"kind": "Job", "name": "train", "uid": "job-uid-1", "controller": True}]},
         "spec": {"nodeName": kw.get("node", "gpu-a100-0"),
                  "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
         "status": {"phase": phase, "containerStatuses": []}}
    if phase == "Running":
        p["status"]["containerStatuses"] = [{"state": {"running": {"startedAt": "2026-01-01T00:00:05Z"}}}]
    if phase in ("Succeeded", "Failed"):
        p["status"]["containerStatuses"] = [{"state": {"terminated": {
            "startedAt": "2026-01-01T00:00:05Z", "finishedAt": "2026-01-01T00:10:05Z"}}}]
    return p


@pytest.mark.parametrize("phase,deleted,types", [
    ("Pending", False, []),
    ("Running", False, ["pod.running.v1"]),
    ("Succeeded", False, ["pod.running.v1", "pod.finished.v1"]),
    ("Failed", False, ["pod.running.v1", "pod.finished.v1"]),
    ("Running", True, ["pod.running.v1", "pod.finished.v1"]),  # evicted: deleted while running
])
def test_pod_lifecycle(phase, deleted, types):
    obs = n.pod_observations(pod(phase), deleted=deleted)
    assert [o.event_type for o in obs] == types
    for o in obs:
        p = valid(o)
        assert o.key == "job-uid-1" and p["workload_uid"] == "job-uid-1" and p["uid"] == "pod-1"
        assert p["workload_name"] == "train" and p["node"] == "gpu-a100-0"
    if "pod.finished.v1" in types:
        fin = obs[-1].event["payload"]
        assert fin["phase"] == (phase if not deleted else "Deleted")
    if types:
        assert obs[0].event["payload"]["requests"] == {"nvidia.com/gpu": 8000}


def test_pods_of_no_workload_are_not_reported():
    p = pod("Running")
    p["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": True}]
    assert n.pod_observations(p) == []


def test_pod_ids_do_not_depend_on_resource_version():
    a = n.pod_observations(pod("Succeeded"))
    b_pod = pod("Succeeded")
    b_pod["metadata"]["resourceVersion"] = "12345"
    b = n.pod_observations(b_pod)
    assert [o.event_id for o in a] == [o.event_id for o in b]


def test_a_pod_without_the_label_carries_its_jobs_queue():
    """A Job's labels are not copied to its pods: the watcher passes the Job's queue, and
    admission routes the pod's facts to the cohort by it (ADR 0064)."""
    for o in n.pod_observations(pod("Succeeded"), owner_queue="team-ml"):
        assert valid(o)["queue_name"] == "team-ml"
    assert all(valid(o).get("queue_name") is None for o in n.pod_observations(pod("Succeeded")))
    labelled = pod("Running")
    labelled["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "own"}
    (o,) = n.pod_observations(labelled, owner_queue="team-ml")
    assert valid(o)["queue_name"] == "own"  # the pod's own label wins
    assert n.pod_workload(labelled) == ("job-uid-1", "train")


def ended(job_, kind, at="2026-01-01T00:10:00Z"):
    job_["status"] = {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"},
                                     {"type": kind, "status": "True", "lastTransitionTime": at}]}
    if kind == "Complete":
        job_["status"]["completionTime"] = at
    return job_


@pytest.mark.parametrize("kind,succeeded", [("Complete", True), ("Failed", False)])
def test_a_finished_job_is_a_finished_workload(kind, succeeded):
    submitted, finished = n.observe("jobs", ended(job(suspend=False), kind), {})
    assert submitted.event_type == "workload.submitted.v1"
    p = valid(finished)
    assert finished.event_type == "workload.finished.v1" and finished.key == "job-uid-1"
    assert (p["uid"], p["namespace"], p["name"], p["queue_name"]) == ("job-uid-1", "ml-team", "train", "team-ml")
    assert p["succeeded"] is succeeded and p["finished_at"] == "2026-01-01T00:10:00Z"
    # deleted afterwards (ttlSecondsAfterFinished): the same fact, the same id
    (again,) = n.observe("jobs", ended(job(suspend=False), kind), {}, deleted=True)
    assert again.event_id == finished.event_id and valid(again) == p


def test_a_job_deleted_before_it_finished_is_a_failed_workload():
    running = job(suspend=False)
    running["status"] = {"active": 4, "conditions": [{"type": "Suspended", "status": "False"}]}
    assert [o.event_type for o in n.observe("jobs", running, {})] == ["workload.submitted.v1"]
    running["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    (o,) = n.observe("jobs", running, {}, deleted=True, observed_at="2026-01-01T00:05:01Z")
    p = valid(o)
    assert o.event_type == "workload.finished.v1"
    assert p["succeeded"] is False and p["finished_at"] == "2026-01-01T00:05:00Z"
    unlabelled = ended(job(), "Complete")
    del unlabelled["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert n.observe("jobs", unlabelled, {}) == [] and n.observe("jobs", unlabelled, {}, deleted=True) == []


@pytest.mark.parametrize("label", [None, "other-queue"])
def test_a_job_relabelled_after_submission_stays_in_its_first_queue(label):
    """ADR 0067: the watcher passes the queue it first reported a Job under; it stands for the
    label, removed or changed later, in the Job's submission and its end."""
    relabelled = ended(job(suspend=False), "Complete")
    if label is None:
        del relabelled["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    else:
        relabelled["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = label
    submitted, finished = n.observe("jobs", relabelled, {}, job_queue="team-ml")
    assert valid(submitted)["queue_name"] == "team-ml" and valid(finished)["queue_name"] == "team-ml"
    assert submitted.event_id == n.observe("jobs", job(), {})[0].event_id  # the same submission


@pytest.mark.parametrize("phase,succeeded", [("Completed", True), ("Failed", False), ("Aborted", False),
                                             ("Running", None), ("Pending", None)])
def test_a_volcano_job_in_a_terminal_phase_is_a_finished_workload(phase, succeeded):
    vc = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
          "metadata": {"name": "vc", "namespace": "ml-team", "uid": "vc-uid", "resourceVersion": "1",
                       "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"kueue.x-k8s.io/queue-name": "team-ml"}},
          "spec": {"tasks": [{"name": "w", "replicas": 2, "template": {"spec": {"containers": [{"name": "w"}]}}}]},
          "status": {"state": {"phase": phase, "lastTransitionTime": "2026-01-01T00:09:00Z"}}}
    found = n.workload_finished(vc, volcano=True)
    if succeeded is None:
        assert found is None
    else:
        assert valid(found)["succeeded"] is succeeded and valid(found)["finished_at"] == "2026-01-01T00:09:00Z"


def node(labels, gpus="8", rv="5", unschedulable=False):
    return {"metadata": {"name": "gpu-a100-0", "uid": "node-1", "resourceVersion": rv, "labels": labels},
            "spec": {"unschedulable": unschedulable},
            "status": {"capacity": {"nvidia.com/gpu": gpus, "cpu": "96"},
                       "allocatable": {"nvidia.com/gpu": gpus, "cpu": "95"}}}


FLAVORS = {"a100-flavor": Flavor("a100-flavor", {"gpu.nvidia.com/class": "a100"}),
           "h100-flavor": Flavor("h100-flavor", {"gpu.nvidia.com/class": "h100"}),
           "empty": Flavor("empty", {})}


def test_node_capacity_per_flavor():
    o = n.node_capacity(node({"gpu.nvidia.com/class": "a100"}), FLAVORS, observed_at="2026-01-01T00:00:00Z")
    p = valid(o)
    assert o.event["occurred_at"] == "2026-01-01T00:00:00Z"
    assert p["node"] == "gpu-a100-0" and p["flavor"] == "a100-flavor"
    assert p["capacity"]["nvidia.com/gpu"] == 8000 and p["allocatable"]["cpu"] == 95000
    assert p["unschedulable"] is False and p["deleted"] is False
    cordoned = n.node_capacity(node({"gpu.nvidia.com/class": "a100"}, unschedulable=True), FLAVORS)
    assert valid(cordoned)["unschedulable"] is True
    assert cordoned.fact != o.fact
    other = n.node_capacity(node({"gpu.nvidia.com/class": "t4"}), FLAVORS)
    assert "flavor" not in valid(other)


def test_node_fact_ignores_resource_version_but_id_does_not():
    a = n.node_capacity(node({"gpu.nvidia.com/class": "a100"}, rv="5"), FLAVORS)
    b = n.node_capacity(node({"gpu.nvidia.com/class": "a100"}, rv="6"), FLAVORS)
    assert a.fact == b.fact and a.event_id != b.event_id
    assert n.node_capacity(node({"gpu.nvidia.com/class": "a100"}, rv="5"), FLAVORS).event_id == a.event_id


def test_flavors_from_resource_flavor_objects():
    objs = [{"kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"},
             "spec": {"nodeLabels": {"gpu.nvidia.com/class": "a100"},
                      "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}},
            {"kind": "ClusterQueue", "metadata": {"name": "gpu-queue"}}]
    f = n.flavors_from_objects(objs)
    assert list(f) == ["a100-flavor"]
    assert f["a100-flavor"].matches({"gpu.nvidia.com/class": "a100", "x": "y"})
    assert not f["a100-flavor"].matches({"gpu.nvidia.com/class": "v100"})
    assert f["a100-flavor"].tolerations[0]["key"] == "gpu"


def test_namespace_cost_center():
    ns = {"metadata": {"name": "ml-team", "uid": "ns-1", "resourceVersion": "3",
                       "labels": {"quartermaster.dev/cost-center": "cc-ml-research"}}}
    o = n.namespace_labels(ns)
    assert o.key == "ml-team" and n.cost_center(valid(o)["labels"]) == "cc-ml-research"
    changed = copy.deepcopy(ns)
    changed["metadata"]["labels"]["quartermaster.dev/cost-center"] = "cc-other"
    assert n.namespace_labels(changed).fact != o.fact


def test_action_outcome_id_is_function_of_action_and_outcome():
    action = {"event_id": "a-1", "event_type": "action.admit.v1", "correlation_id": "c-0",
              "payload": {"workload_uid": "w", "namespace": "ml-team", "name": "train", "kind": "Job"}}
    a = n.action_outcome(action, "applied", "ok", occurred_at="2026-01-01T00:00:01Z")
    b = n.action_outcome(action, "applied", "ok again", occurred_at="2026-01-01T00:00:02Z")
    c = n.action_outcome(action, "already-applied", "", occurred_at="2026-01-01T00:00:03Z")
    assert a.event_id == b.event_id != c.event_id
    assert a.event["causation_id"] == "a-1" and a.event["correlation_id"] == "c-0" and a.key == "w"
    assert valid(a)["action"] == "admit" and valid(c)["outcome"] == "already-applied"


def test_clock_ticks_are_deterministic():
    t = n.clock_tick("watcher", "2026-01-01T00:00:10Z")
    assert t.event_id == n.clock_tick("watcher", "2026-01-01T00:00:10Z").event_id
    assert valid(t) == {"at": "2026-01-01T00:00:10Z", "source": "watcher"} and t.topic == "qm.clock"


def test_volcano_job_pod_sets_from_tasks():
    vc = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
          "metadata": {"name": "vc", "namespace": "ml-team", "uid": "vc-uid", "resourceVersion": "1",
                       "creationTimestamp": "2026-01-01T00:00:00Z",
                       "labels": {"kueue.x-k8s.io/queue-name": "team-ml"}},
          "spec": {"minAvailable": 3, "tasks": [
              {"name": "master", "replicas": 1, "template": {"spec": {"containers": [
                  {"name": "m", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}},
              {"name": "worker", "replicas": 3, "template": {"spec": {"containers": [
                  {"name": "w", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}}]}}
    (o,) = n.observe("vcjobs", vc, {})
    p = valid(o)
    assert [(ps["name"], ps["count"], ps["requests"]["nvidia.com/gpu"]) for ps in p["pod_sets"]] == [
        ("master", 1, 4000), ("worker", 3, 4000)]
    # minAvailable 3 of 4: the master must run, at least 2 of 3 workers... expressed on pod set 0
    # with the others whole: 3 - 3 -> the floor of 1.
    assert p["pod_sets"][0].get("min_count") is None or p["pod_sets"][0]["min_count"] >= 1
    del vc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert n.observe("vcjobs", vc, {}) == []
