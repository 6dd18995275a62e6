"""Cluster facts re-keyed onto the cohort's stream (services/adapters/cohort_stream.py, ADR 0023 and 0075)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.adapters.cohort_stream import FactRouter, UnknownQueue, cohort_stream_outputs
from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import make_envelope
from services.contracts.events import (
    NamespaceLabels,
    NodeCapacity,
    PodFinished,
    PodRunning,
    WorkloadFinished,
    WorkloadSubmitted,
)

AT = "2026-11-29T10:00:00Z"


@pytest.fixture
def config(tmp_path: Path) -> KueueConfig:
    """Two cohorts (one with two queues) and a ClusterQueue of its own."""
    docs = [{"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "default"}}]
    for cq, cohort, namespace in [("cq-a1", "a", "team-a1"), ("cq-a2", "a", "team-a2"), ("cq-b", "b", "team-b"),
                                  ("cq-alone", None, "team-alone")]:
        spec = {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "default", "resources": [{"name": "cpu", "nominalQuota": 8}]}]}]}
        if cohort:
            spec["cohort"] = cohort
        docs.append({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": cq},
                     "spec": spec})
        docs.append({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                     "metadata": {"name": "lq", "namespace": namespace}, "spec": {"clusterQueue": cq}})
    (tmp_path / "kueue.yaml").write_text(yaml.safe_dump_all(docs))
    return KueueConfig.load(tmp_path)


def from_cluster(payload, tag: str = "x"):
    return make_envelope(payload, producer="watcher", occurred_at=AT, identity=(tag,))


def running(namespace="team-a2", queue="lq"):
    return from_cluster(PodRunning(uid="pod-1", workload_uid="uid-1", namespace=namespace, name="train-0",
                                   queue_name=queue, workload_name="train", started_at=AT))


def test_a_running_pod_travels_under_its_cohort_key_and_also_says_the_workload_runs(config):
    source = running()
    outputs = cohort_stream_outputs(source, config)
    assert [(o.topic, o.key, o.envelope.event_type) for o in outputs] == [
        ("qm.workloads", "cohort:a", "pod.running.v1"),
        ("qm.workloads", "cohort:a", "workload.running.v1"),
    ]
    pod, workload = (o.envelope for o in outputs)
    assert pod.payload == source.payload
    assert (workload.payload.uid, workload.payload.name, workload.payload.started_at) == ("uid-1", "train", AT)
    assert all(o.envelope.causation_id == source.event_id and o.envelope.occurred_at == AT for o in outputs)
    assert all(o.envelope.producer == "admission" for o in outputs)


def test_the_same_fact_forwarded_twice_has_the_same_ids_and_another_fact_other_ids(config):
    """Readers drop a redelivered forward by its id; ids never depend on who forwards."""
    first = [o.envelope.event_id for o in cohort_stream_outputs(running(), config)]
    again = [o.envelope.event_id for o in cohort_stream_outputs(running(), config)]
    assert first == again and len(set(first)) == 2
    other = from_cluster(running().payload, tag="another observation")
    assert not set(first) & {o.envelope.event_id for o in cohort_stream_outputs(other, config)}


def test_finishes_route_by_namespace_and_queue_or_by_the_named_cluster_queue(config):
    pod_done = from_cluster(PodFinished(uid="pod-1", workload_uid="uid-1", namespace="team-b", name="train-0",
                                        queue_name="lq", phase="Succeeded", finished_at=AT))
    workload_done = from_cluster(WorkloadFinished(uid="uid-2", namespace="elsewhere", name="w", queue_name=None,
                                                  cluster_queue="cq-alone", succeeded=True, finished_at=AT))
    assert [(o.key, o.envelope.event_type) for o in cohort_stream_outputs(pod_done, config)] == [
        ("cohort:b", "pod.finished.v1")]
    assert [(o.key, o.envelope.event_type) for o in cohort_stream_outputs(workload_done, config)] == [
        ("cq-alone", "workload.finished.v1")]


def test_node_capacity_goes_to_every_cohort_with_an_id_per_cohort(config):
    node = from_cluster(NodeCapacity(node="n1", flavor="default", allocatable={"cpu": 64000}))
    outputs = cohort_stream_outputs(node, config)
    assert [o.key for o in outputs] == ["cohort:a", "cohort:b", "cq-alone"]
    assert len({o.envelope.event_id for o in outputs}) == 3


def test_submissions_and_namespace_labels_are_not_forwarded(config):
    submitted = from_cluster(WorkloadSubmitted(uid="uid-1", namespace="team-a1", name="w", kind="Job",
                                               queue_name="lq", priority=0, created_at=AT, pod_sets=[]))
    labels = from_cluster(NamespaceLabels(namespace="team-a1", labels={}))
    assert cohort_stream_outputs(submitted, config) == []
    assert cohort_stream_outputs(labels, config) == []


def test_a_pod_of_an_unknown_queue_is_refused_with_its_namespace_and_queue(config):
    with pytest.raises(UnknownQueue, match=r"namespace 'team-a1', queue 'nope' is in no configured LocalQueue"):
        cohort_stream_outputs(running(namespace="team-a1", queue="nope"), config)


def test_a_running_pod_of_a_job_in_no_localqueue_is_stopped(config):
    # Its Job names a LocalQueue that does not exist: nothing will admit it, so its running pod is
    # stopped (ADR 0065) as Kueue's reconciler stops every queue-labelled Job it has not admitted.
    source = running(namespace="team-a1", queue="nope")
    with pytest.raises(UnknownQueue) as refused:
        cohort_stream_outputs(source, config)
    (stop,) = refused.value.stops
    p = stop.envelope.payload
    assert (stop.topic, stop.key, stop.envelope.event_type) == ("qm.actions", "uid-1", "action.evict.v1")
    assert (p.workload_uid, p.namespace, p.name, p.kind, p.reason, p.grace_period_s) == (
        "uid-1", "team-a1", "train", "Job", "NotAdmitted", 0)
    assert stop.envelope.producer == "admission" and stop.envelope.causation_id == source.event_id
    with pytest.raises(UnknownQueue) as again:  # the same fact forwarded twice: one stop
        cohort_stream_outputs(source, config)
    assert again.value.stops[0].envelope.event_id == stop.envelope.event_id
    # its finish, and pods of Jobs that name no queue at all (none of ours), stop nothing
    finished = from_cluster(PodFinished(uid="pod-1", workload_uid="uid-1", namespace="team-a1", name="train-0",
                                        queue_name="nope", phase="Succeeded", finished_at=AT))
    for fact in (finished, running(namespace="team-a1", queue=None)):
        with pytest.raises(UnknownQueue) as refused:
            cohort_stream_outputs(fact, config)
        assert refused.value.stops == []


def test_the_source_routes_a_queued_workloads_facts_as_admission_would_under_its_own_name(config):
    # ADR 0075: the watcher sends them to the cohort's stream itself; a copy admission forwarded
    # too (an upgrade, a config the two saw differently) has the same ids, so readers keep one
    router = FactRouter(config, "watcher")
    done = from_cluster(WorkloadFinished(uid="uid-1", namespace="team-a2", name="train", queue_name="lq",
                                         succeeded=True, finished_at=AT))
    for fact in (running(), done):
        routed = router.outputs(fact)
        by_admission = cohort_stream_outputs(fact, config)
        assert [(o.topic, o.key, o.envelope.event_id) for o in routed] == [
            (o.topic, o.key, o.envelope.event_id) for o in by_admission]
        assert {o.envelope.producer for o in routed} == {"watcher"}


def test_the_source_leaves_node_capacity_other_facts_and_unknown_queues_to_qm_cluster(config):
    router = FactRouter(config, "watcher")
    node = from_cluster(NodeCapacity(node="n1", flavor="default", allocatable={"cpu": 64000}))
    labels = from_cluster(NamespaceLabels(namespace="team-a1", labels={}))
    # node capacity: the replicas read it on qm.cluster; a queue this config does not know:
    # admission forwards the fact with a newer config, or stops the Job (ADR 0065)
    for fact in (node, labels, running(namespace="team-a1", queue="nope"), running(namespace="team-a1", queue=None)):
        assert router.outputs(fact) is None, fact.event_type
    router.config = KueueConfig.from_objects(config.objects)  # a newer set (qm.config) routes from then on
    assert [o.key for o in router.outputs(running())] == ["cohort:a", "cohort:a"]
