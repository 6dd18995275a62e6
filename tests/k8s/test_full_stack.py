"""Every service between a real API server and the real broker: the watcher process, admission,
the queue-manager, preemption and cost-accounting (the processes `make demo` starts), with the
field report's queue configuration (examples/seed).

The other tests of tests/k8s put a fake quota behind the watcher, and the simulated clusters
of the other suites write the facts a watcher would. This one checks that what the watcher
reports of a real Job is what the services need. It did not hold before ADR 0064: a Job's pods
do not carry its queue label, so their facts reached no cohort, and no Job ever finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from k8s_harness import (
    ClusterInfo,
    apply,
    gpu_job,
    register_webhooks,
    unregister_webhooks,
    volcano_pod,
    wait_until,
    webhook_certs,
)

from services.adapters.bus import Publisher, read_envelopes
from services.cli.explain_cmd import read_all
from services.contracts.codec import make_envelope
from services.contracts.events import ClockTick
from services.demo.stack import Stack, free_base_port
from services.explain import Verdict, explain
from services.watcher.kube import KubeError, resource_path

pytestmark = [pytest.mark.k8s, pytest.mark.kafka]
REPO = Path(__file__).resolve().parents[2]
PODS_READY_TIMEOUT_S = 20


async def trail_of(bootstrap: str, prefix: str, topic: str, uid: str) -> list:
    """The envelopes of `topic` about workload `uid`."""
    found = []
    async for _, e in read_envelopes(bootstrap, prefix + topic):
        if isinstance(e, Exception):
            continue
        p = e.payload
        if uid in (getattr(p, "uid", None), getattr(p, "workload_uid", None), getattr(p, "ResourceId", None)):
            found.append(e)
    return found


async def story(bootstrap: str, prefix: str, uid: str, logs: Path) -> str:
    """What each topic and process said about the workload, for a failure's message."""
    lines = []
    for topic in ("qm.cluster", "qm.workloads", "qm.actions", "qm.billing", "qm.billing.dlq", "qm.workloads.dlq"):
        for e in await trail_of(bootstrap, prefix, topic, uid):
            lines.append(f"{topic} {e.event_type} {e.payload}"[:400])
    for log in sorted(logs.glob("*.log")):
        lines.append(f"--- {log.name}: " + log.read_text(errors="replace")[-1500:])
    return "\n".join(lines)


@pytest.fixture
def config_dir(request, tmp_path) -> Path:
    """The field report's configuration; or, parametrized indirectly, these Kueue and
    Quartermaster objects with the seed's price list."""
    objects = getattr(request, "param", None)
    if objects is None:
        return REPO / "examples" / "seed"
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "objects.yaml").write_text(objects)
    (directory / "pricelist.yaml").write_text((REPO / "examples" / "seed" / "pricelist.yaml").read_text())
    return directory


@pytest.fixture
def webhook_env(request, tmp_path) -> dict[str, str]:
    """Nothing; or, parametrized indirectly with "webhook", the admission service's webhook
    settings, with a certificate from `qm webhook certs` and the configurations it wrote (in
    `QM_TEST_WEBHOOK_CONFIGS`, for the stack to register once the services are up)."""
    if getattr(request, "param", None) != "webhook":
        return {}
    port = free_base_port(1)
    configs = webhook_certs(tmp_path / "webhook", port)
    return {"QM_WEBHOOK_PORT": str(port), "QM_WEBHOOK_CERT": str(configs.parent / "tls.crt"),
            "QM_WEBHOOK_KEY": str(configs.parent / "tls.key"), "QM_TEST_WEBHOOK_CONFIGS": str(configs)}


@pytest.fixture
async def stack(cluster: ClusterInfo, kafka_bootstrap, topic_prefix, tmp_path, config_dir, webhook_env, admin):
    """The four services (as `make demo` starts them) and the watcher process, on fresh topics,
    with `config_dir` and the policy library; with `webhook_env`, admission's webhook registered
    with the API server (and taken away before the services stop: the mutating one fails closed)."""
    suffix = f"-{uuid.uuid4().hex[:8]}"
    common = {"QM_KAFKA_BOOTSTRAP": kafka_bootstrap, "QM_TOPIC_PREFIX": topic_prefix, "QM_APP_ID_SUFFIX": suffix,
              "QM_CONFIG_DIR": str(config_dir)}
    services = Stack(tmp_path, {**common, **webhook_env, "QM_POLICY_DIR": str(REPO / "policies" / "library"),
                                "QM_STORE": "memory://", "QM_DATA_DIR": str(tmp_path / "data"),
                                # kwok's pods are ready 0.5-1.5 s after they are created
                                "QM_PODS_READY_TIMEOUT_S": str(PODS_READY_TIMEOUT_S)})
    token = tmp_path / "token"
    token.write_text(cluster.watcher_token)
    watcher_log = open(tmp_path / "watcher.log", "wb")  # noqa: SIM115 - closed with the process
    services.start()
    watcher = None
    registered: list[dict] = []
    await clear_queued_jobs(admin)
    try:
        await asyncio.get_running_loop().run_in_executor(None, services.wait_ready)
        if webhook_env:
            registered = await register_webhooks(admin, Path(webhook_env["QM_TEST_WEBHOOK_CONFIGS"]))
        watcher = subprocess.Popen(
            [sys.executable, "-m", "services.watcher"], cwd=REPO, stdout=watcher_log, stderr=subprocess.STDOUT,
            env={**os.environ, **common, "PYTHONPATH": str(REPO), "QM_K8S_SERVER": cluster.server,
                 "QM_K8S_TOKEN_FILE": str(token), "QM_K8S_CA": cluster.ca_file, "QM_CLOCK_INTERVAL_S": "1"})
        yield services
    finally:
        await unregister_webhooks(admin, registered)
        if watcher is not None:
            watcher.terminate()
            watcher.wait(30)
        services.stop()
        watcher_log.close()
        await clear_queued_jobs(admin)


async def clear_queued_jobs(admin) -> None:
    """Delete every queued Job (batch/v1 and Volcano) in ml-team and wait until they are gone:
    each stack's watcher lists the cluster afresh, and a Job left by an earlier test would be
    submitted to it again and take quota (a stuck Job re-admitted, the namespace's GPUs used)."""
    selector = {"labelSelector": "kueue.x-k8s.io/queue-name", "propagationPolicy": "Background"}
    kinds = [resource_path("batch", "v1", "jobs", "ml-team")]
    if await admin.serves("batch.volcano.sh", "v1alpha1", "jobs"):
        kinds.append(resource_path("batch.volcano.sh", "v1alpha1", "jobs", "ml-team"))
    async def deleted(path: str) -> bool:
        try:
            await admin.request("DELETE", path, query=selector)
            return True
        except KubeError as e:  # a CRD just created answers 429 while its storage initializes
            if not e.temporary:
                raise
            return False

    for path in kinds:
        await wait_until(lambda path=path: deleted(path), 30, what=f"the delete of {path}")

    async def gone() -> bool:
        for path in kinds:
            if (await admin.get(path, labelSelector=selector["labelSelector"])).get("items"):
                return False
        return True

    await wait_until(gone, 60, what="the earlier tests' Jobs deleted")


def gpu_only_job(name: str, *, queue: str = "team-ml", cost_center: str | None = "cc-ml", suspend: bool = True,
                 pods: int = 2, run_s: float = 3):
    """gpu_job with GPUs only (4 a pod), as the field report's Job: its gpu-queue covers
    nvidia.com/gpu alone, and (as in Kueue) a request for anything else would find no flavor.
    The policy library asks for the cost-center label."""
    spec = gpu_job(name, "ml-team", pods=pods, gpus_per_pod=4, run_s=run_s, queue=queue, suspend=suspend,
                   cost_center=cost_center)
    for container in spec["spec"]["template"]["spec"]["containers"]:
        container["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    return spec


async def test_a_real_job_is_admitted_runs_finishes_releases_its_quota_and_is_billed(
        stack, admin, kafka_bootstrap, topic_prefix, tmp_path):
    name = f"stack-{uuid.uuid4().hex[:6]}"
    job = await apply(admin, gpu_only_job(name))
    uid = job["metadata"]["uid"]

    async def released():
        trail = await trail_of(kafka_bootstrap, topic_prefix, "qm.workloads", uid)
        done = [e for e in trail if e.event_type == "workload.released.v1"]
        return done and (trail, done)

    try:
        trail, done = await wait_until(released, 150, what=f"the queue-manager's release of {name}")
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}\n{await story(kafka_bootstrap, topic_prefix, uid, tmp_path)}") from None
    types = [e.event_type for e in trail]
    for expected in ("workload.validated.v1", "workload.quota_reserved.v1", "workload.running.v1",
                     "pod.finished.v1", "workload.finished.v1"):
        assert expected in types, (expected, types)
    assert done[0].payload.reason == "Finished", done[0].payload  # not an expiry, nor a zombie's clean-up
    actions = await trail_of(kafka_bootstrap, topic_prefix, "qm.actions", uid)
    assert [e.event_type for e in actions] == ["action.admit.v1"], [e.payload for e in actions]
    finished = await admin.get(f"/apis/batch/v1/namespaces/ml-team/jobs/{name}")
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in finished["status"]["conditions"])

    # The ledger bills whole hours once event time has passed them: a clock tick two hours on
    # (as a replay's trace driver sends) closes the hour the Job ran in.
    later = (datetime.now(UTC) + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        await bus.publish("qm.clock", "test", make_envelope(ClockTick(at=later, source="test"), producer="test",
                                                            occurred_at=later))
        await bus.flush()

    async def billed():
        rows = await trail_of(kafka_bootstrap, topic_prefix, "qm.billing", uid)
        return [r for r in rows if r.payload.x_UsageKind != "reserved-idle"]

    try:
        rows = await wait_until(billed, 90, what=f"ledger rows for the GPU time {name}'s pods ran")
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}\n{await story(kafka_bootstrap, topic_prefix, uid, tmp_path)}") from None
    # two pods of 4 GPUs ran ~3 s each: GPU-hours of running time, not of an idle reservation
    assert {r.payload.x_UsageKind for r in rows} == {"running"}, [r.payload for r in rows]
    assert 0 < sum(float(r.payload.ConsumedQuantity) for r in rows) < 1, [r.payload for r in rows]
    # what on-call reads of it (`qm explain ml-team/<name>`)
    told = explain(f"ml-team/{name}", await read_all(kafka_bootstrap, topic_prefix))
    assert told.verdict == Verdict.FINISHED and "succeeded" in told.answer and "Billed so far" in told.answer, told


async def test_jobs_that_run_without_admission_are_stopped(stack, admin, kafka_bootstrap, topic_prefix, tmp_path):
    """Created unsuspended (no mutating webhook in the test cluster), as a Job unsuspended by
    hand: one that admission rejected (no cost-center label) and one whose LocalQueue does not
    exist. Kueue's reconciler stops every queue-labelled Job it has not admitted; so do the
    queue-manager and admission's fact lane (ADR 0065)."""
    tag = uuid.uuid4().hex[:6]
    rejected = await apply(admin, gpu_only_job(f"denied-{tag}", cost_center=None, suspend=False))
    unqueued = await apply(admin, gpu_only_job(f"noqueue-{tag}", queue="no-such-queue", suspend=False))

    async def stopped(job):
        uid = job["metadata"]["uid"]
        actions = await trail_of(kafka_bootstrap, topic_prefix, "qm.actions", uid)
        stops = [e for e in actions if e.event_type == "action.evict.v1"]
        now = await admin.get(f"/apis/batch/v1/namespaces/ml-team/jobs/{job['metadata']['name']}")
        return stops and now["spec"].get("suspend") is True and (stops, now)

    for job, producer in ((rejected, "queue-manager"), (unqueued, "admission")):
        try:
            stops, _ = await wait_until(lambda job=job: stopped(job), 120, what=f"{job['metadata']['name']} stopped")
        except AssertionError as timeout:
            trail = await story(kafka_bootstrap, topic_prefix, job["metadata"]["uid"], tmp_path)
            raise AssertionError(f"{timeout}\n{trail}") from None
        assert {(e.producer, e.payload.reason, e.payload.grace_period_s) for e in stops} == {
            (producer, "NotAdmitted", 0)}, [e.payload for e in stops]
        admissions = [e for e in await trail_of(kafka_bootstrap, topic_prefix, "qm.actions", job["metadata"]["uid"])
                      if e.event_type == "action.admit.v1"]
        assert admissions == []
    everything = await read_all(kafka_bootstrap, topic_prefix)
    for job, verdict in ((rejected, Verdict.REJECTED), (unqueued, Verdict.NOT_IN_LOCAL_QUEUE)):
        told = explain(f"ml-team/{job['metadata']['name']}", everything)
        assert told.verdict == verdict and "it stays stopped" in told.answer, told


async def test_a_reservation_whose_pods_never_start_expires_and_its_job_is_stopped(
        stack, admin, kafka_bootstrap, topic_prefix, tmp_path):
    """The field report's central case: quota reserved (pre-frozen), but no node runs the pods
    (here a nodeSelector no node carries). After podsReadyTimeout the queue-manager releases the
    quota, requeues the workload and stops its Job (ADR 0062); the watcher suspends it and puts
    its template's scheduling fields back."""
    name = f"stuck-{uuid.uuid4().hex[:6]}"
    spec = gpu_only_job(name)
    spec["spec"]["template"]["spec"]["nodeSelector"] = {"topology.example/zone": "nowhere"}
    job = await apply(admin, spec)
    uid = job["metadata"]["uid"]

    async def stopped():
        workloads = await trail_of(kafka_bootstrap, topic_prefix, "qm.workloads", uid)
        actions = await trail_of(kafka_bootstrap, topic_prefix, "qm.actions", uid)
        now = await admin.get(f"/apis/batch/v1/namespaces/ml-team/jobs/{name}")
        expired = [e for e in workloads if e.event_type == "workload.prefreeze_expired.v1"]
        evicts = [e for e in actions if e.event_type == "action.evict.v1"]
        restored = now["spec"]["template"]["spec"].get("nodeSelector") == {"topology.example/zone": "nowhere"}
        return expired and evicts and now["spec"].get("suspend") is True and restored and (workloads, evicts, now)

    try:
        workloads, evicts, now = await wait_until(stopped, PODS_READY_TIMEOUT_S + 90,
                                                  what=f"{name}'s expiry and its Job stopped")
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}\n{await story(kafka_bootstrap, topic_prefix, uid, tmp_path)}") from None
    types = [e.event_type for e in workloads]
    assert "workload.running.v1" not in types and "workload.requeued.v1" in types, types
    released = [e.payload for e in workloads if e.event_type == "workload.released.v1"]
    assert [r.reason for r in released] == ["PodsReadyTimeout"], released
    assert [(e.payload.reason, e.payload.grace_period_s) for e in evicts] == [("PodsReadyTimeout", 0)]
    # (waited for above: suspended, and the selector the user's again, the flavor's label taken
    # off; the restore is the eviction's last write, so reading right at the suspend raced it)
    told = explain(f"ml-team/{name}", await read_all(kafka_bootstrap, topic_prefix))
    assert told.verdict == Verdict.PREFREEZE_EXPIRED and "Its Job was stopped" in told.answer, told


PREEMPTING_CONFIG = """
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: a100-flavor}
spec:
  nodeLabels: {gpu.nvidia.com/class: a100}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: gpu-queue}
spec:
  namespaceSelector: {}
  preemption: {withinClusterQueue: LowerPriority}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: a100-flavor
      resources: [{name: nvidia.com/gpu, nominalQuota: 24}]
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: team-ml, namespace: ml-team}
spec: {clusterQueue: gpu-queue}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: WorkloadPriorityClass
metadata: {name: urgent}
value: 1000
---
apiVersion: quartermaster.dev/v1alpha1
kind: PreemptionPolicy
metadata: {name: quick}
spec:
  defaultClass: batch
  classes:
  - name: batch
    selector: {matchLabels: {quartermaster.dev/class: batch}}
    preemptible: true
    mayPreempt: [{class: batch, priority: Lower}]
    gracePeriod: 2s
    minRuntimeBeforePreemption: 0s
"""


@pytest.mark.parametrize("config_dir", [PREEMPTING_CONFIG], indirect=True, ids=["preempting"])
async def test_a_higher_priority_job_preempts_a_running_one_which_runs_again_after(
        stack, admin, kafka_bootstrap, topic_prefix, tmp_path):
    """Who gives way, on the real cluster: a 24-GPU Job holds the ClusterQueue's whole quota; an
    urgent 4-GPU Job comes. The preemption service picks the first as its victim with a 2 s grace;
    the watcher signals the checkpoint, then suspends it; the urgent Job is admitted and runs;
    when it has finished, the victim is admitted again and runs to its end."""
    tag = uuid.uuid4().hex[:6]
    low = gpu_only_job(f"low-{tag}")
    # 6 pods x 4 GPUs: the whole quota, and with the urgent Job's 4 under the policy library's
    # 32-GPU limit for ml-team (namespace-gpu-max), which would refuse it otherwise
    low["spec"]["parallelism"] = low["spec"]["completions"] = 6
    for stage in ("pod-complete.stage.kwok.x-k8s.io/delay", "pod-complete.stage.kwok.x-k8s.io/jitter-delay"):
        low["spec"]["template"]["metadata"]["annotations"][stage] = "20s"  # runs long enough to be preempted
    low = await apply(admin, low)

    async def running(job):
        trail = await trail_of(kafka_bootstrap, topic_prefix, "qm.workloads", job["metadata"]["uid"])
        return [e for e in trail if e.event_type == "workload.running.v1"]

    await wait_until(lambda: running(low), 90, what="the 24-GPU Job running")
    urgent = gpu_only_job(f"urgent-{tag}")
    urgent["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent"
    urgent["spec"]["parallelism"] = urgent["spec"]["completions"] = 1
    urgent = await apply(admin, urgent)

    async def urgent_released_and_low_back():
        low_trail = await trail_of(kafka_bootstrap, topic_prefix, "qm.workloads", low["metadata"]["uid"])
        urgent_trail = await trail_of(kafka_bootstrap, topic_prefix, "qm.workloads", urgent["metadata"]["uid"])
        reserved_again = [e for e in low_trail if e.event_type == "workload.quota_reserved.v1"][1:]
        done = [e for e in urgent_trail if e.event_type == "workload.released.v1"]
        return reserved_again and done and (low_trail, urgent_trail)

    try:
        low_trail, urgent_trail = await wait_until(urgent_released_and_low_back, 180,
                                                   what="the urgent Job done and the victim admitted again")
    except AssertionError as timeout:
        trail = await story(kafka_bootstrap, topic_prefix, urgent["metadata"]["uid"], tmp_path)
        raise AssertionError(f"{timeout}\n{trail}") from None
    evicts = [e for e in await trail_of(kafka_bootstrap, topic_prefix, "qm.actions", low["metadata"]["uid"])
              if e.event_type == "action.evict.v1"]
    assert [(e.producer, e.payload.grace_period_s) for e in evicts] == [("preemption", 2)], [e.payload for e in evicts]
    assert f"Preempted by ml-team/{urgent['metadata']['name']} (InClusterQueue" in evicts[0].payload.reason
    evicted = [e.payload for e in low_trail if e.event_type == "workload.evicted.v1"]
    assert [(p.reason, p.preemptor) for p in evicted] == [("InClusterQueue", f"ml-team/{urgent['metadata']['name']}")]
    assert [e.payload.reason for e in urgent_trail if e.event_type == "workload.released.v1"] == ["Finished"]
    # the victim's Job was stopped (its pods told to checkpoint first) and runs again once re-admitted
    outcomes = [e.payload for e in await trail_of(kafka_bootstrap, topic_prefix, "qm.cluster", low["metadata"]["uid"])
                if e.event_type == "action.outcome.v1"]
    assert [o.action for o in outcomes if o.outcome == "applied"][:3] == ["admit", "evict", "admit"], outcomes


@pytest.mark.parametrize("webhook_env", ["webhook"], indirect=True)
async def test_the_field_reports_volcano_walk_through(stack, admin, volcano_jobs, kafka_bootstrap, topic_prefix,
                                                      tmp_path):
    """The field report's 3.4, end to end: a VolcanoJob of 4 one-GPU workers for team-ml, in a
    namespace that already runs 12 GPUs. Admission's webhook lets it in (12 + 4 <= 32), labels
    it and holds its pods (Volcano has no suspend, ADR 0068); the queue-manager admits it; the
    watcher releases the pods onto A100 nodes; they run; Volcano marks the Job Completed, and
    its quota is released and its GPU time billed. While it runs, a Job that would pass the
    namespace's 32 GPUs is refused at creation, with the numbers."""
    running_12 = gpu_only_job(f"running-12-{uuid.uuid4().hex[:6]}", pods=3, run_s=600)
    first = await apply(admin, running_12)
    name = f"dist-train-{uuid.uuid4().hex[:6]}"
    try:
        async def has(topic: str, uid: str, event_type: str, n: int = 1):
            trail = [e for e in await trail_of(kafka_bootstrap, topic_prefix, topic, uid) if e.event_type == event_type]
            return len(trail) >= n and trail

        try:
            await wait_until(lambda: has("qm.workloads", first["metadata"]["uid"], "workload.running.v1"), 120,
                             what="the 12-GPU Job running")
        except AssertionError as failed:
            raise AssertionError(f"{failed}\n{await story(kafka_bootstrap, topic_prefix, first['metadata']['uid'], tmp_path)}") from None
        vcjob = yaml.safe_load((REPO / "policies/library/namespace-gpu-max/samples/ml-team-max-32/"
                                "example_volcano_job.yaml").read_text())
        vcjob["metadata"]["name"] = name
        template = vcjob["spec"]["tasks"][0]["template"]
        template["metadata"] = {"annotations": running_12["spec"]["template"]["metadata"]["annotations"] | {
            "pod-complete.stage.kwok.x-k8s.io/delay": "3s", "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "4s"}}
        created = await admin.request("POST", volcano_jobs, body=vcjob)
        uid = created["metadata"]["uid"]
        stored = created["spec"]["tasks"][0]["template"]
        assert stored["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"  # the webhook's

        pods = [await admin.request("POST", resource_path("", "v1", "pods", "ml-team"), body=volcano_pod(created, i))
                for i in range(4)]  # Volcano's job controller makes the gang's pods
        assert all(p["spec"]["schedulingGates"] == [{"name": "quartermaster.dev/admission"}] for p in pods)
        try:
            await wait_until(lambda: has("qm.workloads", uid, "pod.running.v1", 4), 120, what="the 4 pods running")
            usage_16 = await wait_until(lambda: _usage(kafka_bootstrap, topic_prefix, 16_000), 30,
                                        what="ml-team's usage at 16 GPUs")
            await asyncio.sleep(1)  # admission's replica follows qm.usage
            too_big = yaml.safe_load(yaml.safe_dump(vcjob))
            too_big["metadata"]["name"] = f"too-big-{uuid.uuid4().hex[:6]}"
            too_big["spec"]["tasks"][0]["replicas"] = 20
            with pytest.raises(KubeError) as refused:
                await admin.request("POST", volcano_jobs, body=too_big)
            assert refused.value.status == 403, refused.value
            assert "namespace ml-team used 16 GPU, requesting 20, max is 32" in refused.value.message, (
                refused.value, usage_16)
            for p in pods:
                placed = await admin.get(resource_path("", "v1", "pods", "ml-team", p["metadata"]["name"]))
                assert placed["spec"]["nodeName"].startswith("gpu-a100-"), placed["spec"]
            # Volcano marks the Job Completed once its pods have succeeded
            await wait_until(lambda: has("qm.workloads", uid, "pod.finished.v1", 4), 60, what="the 4 pods done")
            await admin.request("PATCH", f"{volcano_jobs}/{name}", content_type="application/merge-patch+json",
                                body={"status": {"state": {"phase": "Completed",
                                                           "lastTransitionTime": _now_iso()}}})
            released = await wait_until(lambda: has("qm.workloads", uid, "workload.released.v1"), 60,
                                        what="the Volcano Job's quota released")
        except AssertionError as failed:
            raise AssertionError(f"{failed}\n{await story(kafka_bootstrap, topic_prefix, uid, tmp_path)}") from None
        assert released[0].payload.reason == "Finished", released[0].payload
        actions = await trail_of(kafka_bootstrap, topic_prefix, "qm.actions", uid)
        assert [e.event_type for e in actions] == ["action.admit.v1"], [e.payload for e in actions]
        told = explain(f"ml-team/{name}", await read_all(kafka_bootstrap, topic_prefix))
        assert told.verdict == Verdict.FINISHED and "succeeded" in told.answer, told
    finally:
        for path in (f"{volcano_jobs}/{name}", f"/apis/batch/v1/namespaces/ml-team/jobs/{first['metadata']['name']}"):
            with contextlib.suppress(KubeError):
                await admin.request("DELETE", path, query={"propagationPolicy": "Background"})


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _usage(bootstrap: str, prefix: str, gpu_milli: int):
    """The newest qm.usage record of ml-team, when its total is `gpu_milli` GPUs."""
    last = None
    async for _, e in read_envelopes(bootstrap, prefix + "qm.usage"):
        if not isinstance(e, Exception) and getattr(e.payload, "namespace", None) == "ml-team":
            last = e.payload
    return last if last is not None and (last.total or {}).get("nvidia.com/gpu") == gpu_milli else None


TWO_CLASSES_CONFIG = """
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: a100-flavor}
spec:
  nodeLabels: {gpu.nvidia.com/class: a100}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: h100-flavor}
spec:
  nodeLabels: {gpu.nvidia.com/class: h100}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: gpu-queue}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: a100-flavor
      resources: [{name: nvidia.com/gpu, nominalQuota: 32}]
    - name: h100-flavor
      resources: [{name: nvidia.com/gpu, nominalQuota: 16}]
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: team-ml, namespace: ml-team}
spec: {clusterQueue: gpu-queue}
"""


@pytest.mark.parametrize("config_dir", [TWO_CLASSES_CONFIG], indirect=True, ids=["a100-and-h100"])
async def test_a_job_that_asks_for_h100_nodes_runs_on_h100_nodes(stack, admin, kafka_bootstrap, topic_prefix, tmp_path):
    """ADR 0070, on the real cluster: the queue offers A100s first and has room there, and the
    Job's pods ask for H100 nodes. It is given H100 quota, keeps its own selector, and its pods
    run on the H100 nodes. It was given A100 quota, its selector overwritten with a100's."""
    name = f"h100-{uuid.uuid4().hex[:6]}"
    spec = gpu_only_job(name)
    spec["spec"]["template"]["spec"]["nodeSelector"] = {"gpu.nvidia.com/class": "h100"}
    job = await apply(admin, spec)
    uid = job["metadata"]["uid"]

    async def finished():
        trail = await trail_of(kafka_bootstrap, topic_prefix, "qm.workloads", uid)
        return any(e.event_type == "workload.finished.v1" for e in trail) and trail

    try:
        trail = await wait_until(finished, 150, what=f"{name} finished")
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}\n{await story(kafka_bootstrap, topic_prefix, uid, tmp_path)}") from None
    reserved = [e.payload for e in trail if e.event_type == "workload.quota_reserved.v1"]
    assert [r.flavors for r in reserved] == [{"main": {"nvidia.com/gpu": "h100-flavor"}}], reserved
    admits = [e.payload for e in await trail_of(kafka_bootstrap, topic_prefix, "qm.actions", uid)
              if e.event_type == "action.admit.v1"]
    assert [a.node_selector for a in admits] == [{"gpu.nvidia.com/class": "h100"}], admits
    pods = (await admin.get(resource_path("", "v1", "pods", "ml-team"), labelSelector=f"job-name={name}"))["items"]
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} <= {"gpu-h100-0", "gpu-h100-1"}, pods
