"""The admission service on the real broker: live usage from qm.usage decides the namespace
GPU maximum (the field report's K8sBanExcessGpuQuota), the verdict lands on qm.workloads."""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest

from services.adapters.bus import DLQ_CONSUMER, DLQ_ERROR, Publisher, read_envelopes, read_topic
from services.contracts.codec import encode, make_envelope
from services.contracts.events import (
    NamespaceLabels,
    NodeCapacity,
    PodFinished,
    PodRunning,
    UsageSnapshot,
    WorkloadFinished,
    WorkloadSubmitted,
)
from tests.integration.processes import start_worker
from tests.integration.test_worker_recovery import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
AT = "2026-11-29T10:00:00Z"
LABELS = {"kueue.x-k8s.io/queue-name": "team-ml", "quartermaster.dev/cost-center": "cc-ml"}
# an approved project: the seed's gpu-queue offers only A100s, which the policy library keeps
# for approved namespaces (ADR 0070)
ML_TEAM_LABELS = {"quartermaster.dev/cost-center": "cc-ml", "quartermaster.dev/approved": "true"}


def submitted(name: str, gpus: int, labels=LABELS, queue="team-ml", namespace="ml-team"):
    return make_envelope(
        WorkloadSubmitted(uid=f"uid-{name}", namespace=namespace, name=name, kind="Job", queue_name=queue,
                          priority=0, labels=dict(labels), created_at=AT,
                          pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}]),
        producer="test", occurred_at=AT)


def usage(gpus: int, tag: str):
    return make_envelope(
        UsageSnapshot(namespace="ml-team", reserved={}, running={"a100-flavor": {"nvidia.com/gpu": gpus * 1000}},
                      total={"nvidia.com/gpu": gpus * 1000}, as_of=AT),
        producer="test", occurred_at=AT, identity=(tag,))


def admission_env(topic_prefix: str, tmp_path) -> dict[str, str]:
    """One admission worker on this test's topics, as a consumer group of its own."""
    return {"QM_TOPIC_PREFIX": topic_prefix, "QM_APP_ID_SUFFIX": f"-{uuid.uuid4().hex[:8]}", "QM_STORE": "memory://",
            "QM_DATA_DIR": str(tmp_path), "QM_CONFIG_DIR": str(REPO / "examples" / "seed"),
            "QM_POLICY_DIR": str(REPO / "policies" / "library")}


async def publish_the_namespace(kafka_bootstrap: str, topic_prefix: str) -> None:
    """ml-team with its cost center: the namespace the policies look up."""
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        ns = NamespaceLabels(namespace="ml-team", labels=ML_TEAM_LABELS)
        await bus.publish("qm.cluster", "ml-team", make_envelope(ns, producer="test", occurred_at=AT))
        await bus.flush()


async def verdicts(bootstrap, prefix) -> dict[str, object]:
    return {e.payload.name: e async for _, e in read_envelopes(bootstrap, prefix + "qm.workloads")
            if not isinstance(e, Exception)}


async def test_namespace_gpu_maximum_counts_live_usage(kafka_bootstrap, topic_prefix, tmp_path):
    env = admission_env(topic_prefix, tmp_path)
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        ns = NamespaceLabels(namespace="ml-team", labels=ML_TEAM_LABELS)
        await bus.publish("qm.cluster", "ml-team", make_envelope(ns, producer="test", occurred_at=AT))
        await bus.publish("qm.usage", "ml-team", usage(28, "28"))
        await bus.flush()
    worker = start_worker("services.admission", env, tmp_path / "admission.log")
    try:
        worker.wait_ready()
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            for e in [submitted("llm-8gpu", 8), submitted("small-4gpu", 4),
                      submitted("no-labels", 1, labels={}, queue="team-ml"),
                      submitted("lost", 1, labels={**LABELS, "kueue.x-k8s.io/queue-name": "nope"}, queue="nope")]:
                await bus.publish("qm.cluster", e.payload.uid, e)
            await bus.flush()

        async def four_verdicts():
            return len(await verdicts(kafka_bootstrap, topic_prefix)) >= 4

        await wait_for(four_verdicts, 60, "four verdicts")
        first = await verdicts(kafka_bootstrap, topic_prefix)

        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            await bus.publish("qm.usage", "ml-team", usage(20, "20"))
            await bus.flush()

            async def replica_sees_20():  # the service follows qm.usage; its page shows what policies see
                state = json.loads(urllib.request.urlopen(
                    f"http://127.0.0.1:{worker.port}/live-state?namespace=ml-team", timeout=5).read())
                return (state["usage"] or {}).get("total", {}).get("nvidia.com/gpu") == 20000

            await wait_for(replica_sees_20, 60, "admission's replica to see 20 GPU in use")
            await bus.publish("qm.cluster", "uid-llm-8gpu-retry", submitted("llm-8gpu-retry", 8))
            await bus.flush()

        async def retried():
            return "llm-8gpu-retry" in await verdicts(kafka_bootstrap, topic_prefix)

        await wait_for(retried, 60, "the retry's verdict")
        second = await verdicts(kafka_bootstrap, topic_prefix)
    finally:
        worker.stop()

    rejected = first["llm-8gpu"]
    assert rejected.event_type == "workload.rejected.v1"
    assert rejected.payload.violations[0]["message"] == "namespace ml-team used 28 GPU, requesting 8, max is 32"
    ok = first["small-4gpu"]
    assert ok.event_type == "workload.validated.v1"
    assert (ok.payload.cluster_queue, ok.payload.queue_name) == ("gpu-queue", "team-ml")
    assert first["no-labels"].event_type == "workload.rejected.v1"
    assert "quartermaster.dev/cost-center" in first["no-labels"].payload.message
    lost = first["lost"]
    assert (lost.event_type, lost.payload.reason) == ("workload.pending.v1", "Inadmissible")
    assert "LocalQueue nope doesn't exist in namespace ml-team" in lost.payload.message
    assert second["llm-8gpu-retry"].event_type == "workload.validated.v1"


async def test_a_workload_in_a_namespace_created_a_moment_before_is_judged_with_it(kafka_bootstrap, topic_prefix,
                                                                                    tmp_path):
    """ADR 0040: a Namespace and its first workload are published back to back, on different
    partitions. Admission's replica reads them with a consumer of its own, here one that waits
    two seconds for data (QM_ADMISSION_REPLICA_BEHIND_MS), so it has not seen the namespace
    when the submission is judged. Admission waits for it rather than refusing the workload
    because the namespace "is not known". (fresh-team has no LocalQueue, so a workload judged
    with its namespace is Pending, and one judged without it is Rejected.)"""
    env = {**admission_env(topic_prefix, tmp_path), "QM_ADMISSION_REPLICA_BEHIND_MS": "2000"}
    await publish_the_namespace(kafka_bootstrap, topic_prefix)
    worker = start_worker("services.admission", env, tmp_path / "admission.log")
    try:
        worker.wait_ready()
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:  # the agent is reading once this is judged
            await bus.publish("qm.cluster", "uid-warm-up", submitted("warm-up", 1))
            await bus.flush()

            async def judged(name: str):
                return name in await verdicts(kafka_bootstrap, topic_prefix)

            await wait_for(lambda: judged("warm-up"), 60, "the warm-up job's verdict")
            fresh = NamespaceLabels(namespace="fresh-team", labels={"quartermaster.dev/cost-center": "cc-fresh"})
            await bus.publish("qm.cluster", "uid-namespace-fresh-team", make_envelope(fresh, producer="test",
                                                                                      occurred_at=AT))
            await bus.publish("qm.cluster", "uid-first-job", submitted("first-job", 1, namespace="fresh-team"))
            await bus.flush()
            await wait_for(lambda: judged("first-job"), 60, "the first job's verdict")
        verdict = (await verdicts(kafka_bootstrap, topic_prefix))["first-job"]
    finally:
        worker.stop()
    assert verdict.event_type == "workload.pending.v1", verdict.payload  # not rejected for lack of its namespace
    assert verdict.payload.reason == "Inadmissible"
    assert "LocalQueue team-ml doesn't exist in namespace fresh-team" in verdict.payload.message


async def test_a_workloads_pod_facts_follow_its_verdict_onto_its_cohorts_stream(kafka_bootstrap, topic_prefix, tmp_path):
    """ADR 0023: admission re-keys pod and workload lifecycle facts from qm.cluster (keyed by
    uid) onto qm.workloads under the cohort key, in the workload's own order; node capacity
    goes to every cohort. A fact about an unknown queue is logged and the stream goes on."""
    env = admission_env(topic_prefix, tmp_path)
    await publish_the_namespace(kafka_bootstrap, topic_prefix)
    worker = start_worker("services.admission", env, tmp_path / "admission.log")
    pod = {"uid": "pod-train", "workload_uid": "uid-train", "namespace": "ml-team", "name": "train-0",
           "queue_name": "team-ml"}
    facts = [
        ("uid-stray", PodRunning(**{**pod, "uid": "pod-stray", "workload_uid": "uid-stray", "queue_name": "nope"},
                                 workload_name="stray", started_at=AT)),
        ("uid-train", submitted("train", 4)),
        ("uid-train", PodRunning(**pod, workload_name="train", started_at="2026-11-29T10:01:00Z")),
        ("uid-train", PodFinished(**pod, phase="Succeeded", finished_at="2026-11-29T10:09:00Z")),
        ("uid-train", WorkloadFinished(uid="uid-train", namespace="ml-team", name="train", queue_name="team-ml",
                                       succeeded=True, finished_at="2026-11-29T10:09:00Z")),
        ("a100-0", NodeCapacity(node="a100-0", flavor="a100-flavor", allocatable={"nvidia.com/gpu": 8000})),
    ]
    try:
        worker.wait_ready()
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            for key, fact in facts:
                envelope = fact if hasattr(fact, "payload") else make_envelope(fact, producer="test", occurred_at=AT)
                await bus.publish("qm.cluster", key, envelope)
            # nobody can read the first; the second is a pod fact without its pod: the fact lane's
            broken = orjson.loads(encode(make_envelope(PodRunning(**pod, workload_name="train", started_at=AT),
                                                       producer="test", occurred_at=AT, identity=("broken",))))
            del broken["payload"]["uid"]
            await bus.publish_raw("qm.cluster", b"uid-train", b"{not json")
            await bus.publish_raw("qm.cluster", b"uid-train", orjson.dumps(broken))
            await bus.flush()

        async def on_stream():
            return [(r.key, e) async for r, e in read_envelopes(kafka_bootstrap, topic_prefix + "qm.workloads")
                    if not isinstance(e, Exception)]

        async def all_forwarded():
            return len(await on_stream()) >= 6

        async def both_dead_lettered():
            return len([r async for r in read_topic(kafka_bootstrap, topic_prefix + "qm.cluster.dlq")]) >= 2

        await wait_for(all_forwarded, 60, "the verdict and five forwarded records")
        await wait_for(both_dead_lettered, 60, "the two unreadable records on qm.cluster.dlq")
        stream = await on_stream()
        dead = [r async for r in read_topic(kafka_bootstrap, topic_prefix + "qm.cluster.dlq")]
        lane = json.loads(urllib.request.urlopen(  # what on-call sees of the fact lane
            f"http://127.0.0.1:{worker.port}/live-state?namespace=ml-team", timeout=5).read())["factLane"]
        metrics = worker.metrics()
    finally:
        worker.stop()
    # a running pod is two records; the stray pod's Job names no LocalQueue, so it is stopped (ADR 0065)
    assert lane == {"joined": True, "recordsForwarded": 5, "unroutable": 1, "jobsStopped": 1}
    assert 'qm_admission_facts_total{outcome="forwarded"} 4.0' in metrics
    assert 'qm_admission_facts_total{outcome="unroutable"} 1.0' in metrics
    assert 'qm_admission_facts_total{outcome="dead-lettered"} 1.0' in metrics
    by_reader = {dict(r.headers)[DLQ_CONSUMER].decode().split("-")[-1]: dict(r.headers)[DLQ_ERROR].decode()
                 for r in dead}
    assert len(dead) == 2 and by_reader.keys() == {"facts", env["QM_APP_ID_SUFFIX"].split("-")[-1]}, by_reader
    assert by_reader["facts"].startswith("contract: ") and "'uid' is a required property" in by_reader["facts"]
    # the facts in their own order; the verdict comes from the other lane (ADR 0026): a pod runs
    # only after its workload's verdict, so in a cluster the verdict is there first anyway
    assert [(key, e.event_type) for key, e in stream if e.event_type not in ("node.capacity.v1",
                                                                               "workload.validated.v1")] == [
        (b"gpu-queue", "pod.running.v1"),
        (b"gpu-queue", "workload.running.v1"),
        (b"gpu-queue", "pod.finished.v1"),
        (b"gpu-queue", "workload.finished.v1"),
    ]
    assert [(key, e.payload.name) for key, e in stream if e.event_type == "workload.validated.v1"] == [
        (b"gpu-queue", "train")]
    assert [(key, e.payload.node) for key, e in stream if e.event_type == "node.capacity.v1"] == [
        (b"gpu-queue", "a100-0")]
    assert all(e.producer == "admission" for _, e in stream)
    assert "pod-stray" not in str([e.payload for _, e in stream])
    assert "no known queue" in worker.log()
    # the stray pod's Job names a LocalQueue that does not exist: stopped, one record of its own
    stops = [(r.key, e) async for r, e in read_envelopes(kafka_bootstrap, topic_prefix + "qm.actions")]
    assert [(key, e.event_type, e.payload.reason, e.payload.name) for key, e in stops] == [
        (b"uid-stray", "action.evict.v1", "NotAdmitted", "stray")]


async def test_pod_facts_do_not_wait_behind_a_burst_of_submissions(kafka_bootstrap, topic_prefix, tmp_path):
    """ADR 0026: a pod fact that reaches qm.cluster behind a burst of submissions is on the
    cohort's stream before the burst's last verdict. In one agent it came after all of them, and
    in kueue-large-scale the queue-manager learnt of finishes 8-13 s late."""
    env = admission_env(topic_prefix, tmp_path)
    await publish_the_namespace(kafka_bootstrap, topic_prefix)
    worker = start_worker("services.admission", env, tmp_path / "admission.log")
    burst = 1500
    pod = PodRunning(uid="pod-early", workload_uid="uid-early", namespace="ml-team", name="early-0",
                     queue_name="team-ml", workload_name="early", started_at=AT)
    try:
        worker.wait_ready()
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:  # one key: one qm.cluster partition
            for n in range(burst):
                await bus.publish("qm.cluster", "one-partition", submitted(f"burst-{n}", 1))
            await bus.publish("qm.cluster", "one-partition", make_envelope(pod, producer="test", occurred_at=AT))
            await bus.flush()

        async def on_stream():
            return [(r.offset, e) async for r, e in read_envelopes(kafka_bootstrap, topic_prefix + "qm.workloads")
                    if not isinstance(e, Exception)]

        async def everything():
            return len(await on_stream()) >= burst + 2  # the verdicts, pod.running and workload.running

        await wait_for(everything, 120, "every verdict and the forwarded pod fact")
        stream = await on_stream()
    finally:
        worker.stop()
    verdicts_at = [offset for offset, e in stream if e.event_type == "workload.validated.v1"]
    fact_at = [offset for offset, e in stream if e.event_type == "pod.running.v1"]
    assert len(verdicts_at) == burst and len(fact_at) == 1
    assert fact_at[0] < max(verdicts_at), "the pod fact waited for every submission before it"


async def test_submissions_wait_while_the_queue_manager_is_behind(kafka_bootstrap, topic_prefix, tmp_path):
    """ADR 0049: with the queue-manager's group 20 records behind on qm.workloads and at most 5
    allowed, a submission is not judged; once the group commits the end, it is."""
    from aiokafka import TopicPartition

    from tests.integration.group_offsets import append, commit, queue_manager_group

    env = {**admission_env(topic_prefix, tmp_path), "QM_ADMISSION_MAX_QM_LAG": "5"}
    group = queue_manager_group(env["QM_APP_ID_SUFFIX"])
    backlog = TopicPartition(f"{topic_prefix}qm.workloads", 0)
    await append(kafka_bootstrap, backlog.topic, 20)  # what the queue-manager has not read yet
    await commit(kafka_bootstrap, group, {backlog: 0})
    await publish_the_namespace(kafka_bootstrap, topic_prefix)
    worker = start_worker("services.admission", env, tmp_path / "admission.log")
    try:
        worker.wait_ready()

        def pace() -> dict:
            return json.loads(urllib.request.urlopen(
                f"http://127.0.0.1:{worker.port}/live-state?namespace=ml-team", timeout=5).read())["pace"]

        async def paused():
            return pace()["paused"]

        await wait_for(paused, 30, "admission to see the queue-manager 20 records behind")
        assert pace()["queueManagerRecordsBehind"] == 20
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            await bus.publish("qm.cluster", "uid-waits", submitted("waits", 1))
            await bus.flush()

        async def judged():
            return "waits" in await verdicts(kafka_bootstrap, topic_prefix)

        with pytest.raises(AssertionError):
            await wait_for(judged, 3, "no verdict while the queue-manager is behind")
        await commit(kafka_bootstrap, group, {backlog: 20})
        await wait_for(judged, 30, "the verdict once the queue-manager caught up")
        assert not pace()["paused"] and pace()["pauses"] == 1
    finally:
        worker.stop()


TWO_CLASSES = """
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: a100-flavor}
spec: {nodeLabels: {gpu.nvidia.com/class: a100}}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: h100-flavor}
spec: {nodeLabels: {gpu.nvidia.com/class: h100}}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: gpu-queue}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - {name: a100-flavor, resources: [{name: nvidia.com/gpu, nominalQuota: 8}]}
    - {name: h100-flavor, resources: [{name: nvidia.com/gpu, nominalQuota: 8}]}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: team-ml, namespace: ml-team}
spec: {clusterQueue: gpu-queue}
"""


async def trail(bootstrap: str, topic: str) -> list:
    return [e async for _, e in read_envelopes(bootstrap, topic) if not isinstance(e, Exception)]


def pinned(name: str, gpus: int, gpu_class: str | None = None):
    """A Job of ml-team, its pods pinned to a GPU class by nodeSelector, or not."""
    envelope = submitted(name, gpus)
    if gpu_class:
        envelope.payload.pod_sets[0]["node_selector"] = {"gpu.nvidia.com/class": gpu_class}
    return envelope


async def test_an_unapproved_namespace_is_kept_off_a100s_however_its_job_asks(kafka_bootstrap, topic_prefix, tmp_path):
    """ADR 0070, on the broker with admission and the queue-manager: ml-team, not approved, in a
    queue of A100s and H100s. A Job pinned to A100s is refused; one pinned to H100s, one that
    names no class, and one whose affinity allows either (ADR 0073) are given H100s, where the
    first flavor that fits used to be A100."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "kueue.yaml").write_text(TWO_CLASSES)
    env = {**admission_env(topic_prefix, tmp_path), "QM_CONFIG_DIR": str(config)}
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        ns = NamespaceLabels(namespace="ml-team", labels={"quartermaster.dev/cost-center": "cc-ml"})
        await bus.publish("qm.cluster", "ml-team", make_envelope(ns, producer="test", occurred_at=AT))
        await bus.flush()
    admission = start_worker("services.admission", env, tmp_path / "admission.log")
    queue_manager = start_worker("services.queue_manager", env, tmp_path / "qm.log")
    try:
        admission.wait_ready()
        queue_manager.wait_ready()
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            either = pinned("either-class", 2)
            either.payload.pod_sets[0]["node_affinity"] = [
                [{"key": "gpu.nvidia.com/class", "operator": "In", "values": ["a100", "h100"]}]]
            for e in [pinned("on-a100", 4, "a100"), pinned("on-h100", 2, "h100"), pinned("any-class", 2), either]:
                await bus.publish("qm.cluster", e.payload.uid, e)
            await bus.flush()

        async def decided():
            seen = {(e.payload.name, e.event_type) for e in await trail(kafka_bootstrap, topic_prefix + "qm.workloads")}
            return {("on-a100", "workload.rejected.v1"), ("on-h100", "workload.quota_reserved.v1"),
                    ("any-class", "workload.quota_reserved.v1"), ("either-class", "workload.quota_reserved.v1")} <= seen

        await wait_for(decided, 90, "a rejection and three reservations")
        said = await trail(kafka_bootstrap, topic_prefix + "qm.workloads")
    finally:
        admission.stop()
        queue_manager.stop()

    by = {(e.payload.name, e.event_type): e.payload for e in said}
    assert "[a100-approved-projects] namespace ml-team is not approved for a100" in by["on-a100", "workload.rejected.v1"].message
    for name in ("on-h100", "any-class", "either-class"):
        assert by[name, "workload.quota_reserved.v1"].flavors == {"main": {"nvidia.com/gpu": "h100-flavor"}}
    for name in ("any-class", "either-class"):
        refused = by[name, "workload.validated.v1"].pod_sets[0]["refused_flavors"]
        assert list(refused) == ["a100-flavor"] and "[a100-approved-projects]" in refused["a100-flavor"]
    assert "refused_flavors" not in by["on-h100", "workload.validated.v1"].pod_sets[0]  # a100 was never on offer


async def test_a_queue_of_nothing_but_refused_flavors_is_a_refusal_that_says_so(kafka_bootstrap, topic_prefix, tmp_path):
    """The field report's queue offers A100s alone: ml-team, not approved, can never run there,
    so its Job is refused at once rather than left to wait for ever."""
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        ns = NamespaceLabels(namespace="ml-team", labels={"quartermaster.dev/cost-center": "cc-ml"})
        await bus.publish("qm.cluster", "ml-team", make_envelope(ns, producer="test", occurred_at=AT))
        await bus.publish("qm.cluster", "uid-unpinned", submitted("unpinned", 4))
        await bus.flush()
    worker = start_worker("services.admission", admission_env(topic_prefix, tmp_path), tmp_path / "admission.log")
    try:
        worker.wait_ready()

        async def judged():
            return "unpinned" in await verdicts(kafka_bootstrap, topic_prefix)

        await wait_for(judged, 60, "the verdict")
        verdict = (await verdicts(kafka_bootstrap, topic_prefix))["unpinned"]
    finally:
        worker.stop()
    assert verdict.event_type == "workload.rejected.v1"
    assert verdict.payload.violations[0]["policy"] == "a100-approved-projects"
    assert "namespace ml-team is not approved for a100" in verdict.payload.message
    assert ("if admitted to flavor a100-flavor; ClusterQueue gpu-queue offers nvidia.com/gpu to pod set main only "
            "on a100-flavor, and the policies refuse each") in verdict.payload.message
