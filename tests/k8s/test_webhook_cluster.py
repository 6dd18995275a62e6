"""The admission webhooks called by a real API server (deploy/testcluster).

`qm webhook certs --url` makes the CA and the serving certificate and fills the caBundle into
deploy/kubernetes/admission-webhook.yaml; the configurations it writes are applied as they are,
and the webhook serves the repository's policy library over HTTPS. What the API server then
does with each answer is the API server's: the JSONPatch of the mutating webhook applied, a
denial's message given back to the client, the certificate checked against the caBundle.

The configurations are cluster-wide, and the mutating one fails closed (failurePolicy: Fail),
so they are deleted before the webhook stops: every later test creates labelled Jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import pytest
from k8s_harness import (
    REPO,
    WEBHOOK_CONFIGS,
    EventLog,
    admit_action,
    apply,
    evict_action,
    gpu_job,
    register_webhooks,
    unregister_webhooks,
    volcano_pod,
    wait_until,
    webhook_certs,
)

from services.admission.webhook import make_app, serve
from services.demo.stack import free_base_port
from services.policy import PolicySet
from services.policy.live import StaticLiveState
from services.watcher import normalize
from services.watcher.actuate import ALREADY_APPLIED, APPLIED, Actuator
from services.watcher.kube import Kube, KubeError, resource_path
from services.watcher.normalize import Flavor
from services.watcher.watch import MemoryStateStore, Watcher

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NS = "ml-team"
A100 = {"a100-flavor": Flavor("a100-flavor", {"gpu.nvidia.com/class": "a100"})}

def team_job(name: str, **kw) -> dict:
    """A Job as the policy library wants it: its queue and its cost center named."""
    return gpu_job(name, NS, cost_center="cc-ml", **kw)


def team_vcjob(name: str, *, replicas: int) -> dict:
    """A Volcano Job of ml-team, one task "worker" of `replicas` 1-GPU pods, a gang of 2."""
    template = team_job("t", pods=1, gpus_per_pod=1, run_s=600)["spec"]["template"]
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS,
                         "labels": {"kueue.x-k8s.io/queue-name": "team-ml", "quartermaster.dev/cost-center": "cc-ml"}},
            "spec": {"minAvailable": 2, "tasks": [{"name": "worker", "replicas": replicas, "template": template}]}}


def job_path(name: str) -> str:
    return resource_path("batch", "v1", "jobs", NS, name)


@pytest.fixture
async def webhook(admin: Kube, tmp_path: Path):
    """The webhook on a free loopback port, registered with the API server by the configurations
    `qm webhook certs` wrote. Yields the registered configurations."""
    port = free_base_port(1)
    configs = webhook_certs(tmp_path / "webhook", port)
    namespace = await admin.get(resource_path("", "v1", "namespaces", None, NS))
    # the webhook's view of ml-team without its approval, so that the A100 rule refuses a pin by
    # hand (below); everything else it sees as the cluster has it
    namespace["metadata"]["labels"].pop("quartermaster.dev/approved", None)
    live = StaticLiveState.build(  # the replica's view: ml-team has 28 of its 32 GPUs in use
        namespaces=[namespace],
        usages=[{"namespace": NS, "reserved": {}, "running": {"a100-flavor": {"nvidia.com/gpu": 28_000}},
                 "total": {"nvidia.com/gpu": 28_000}}])
    policies = PolicySet.load(REPO / "policies" / "library")
    runner = await serve(make_app(lambda: policies, live), "127.0.0.1", port,
                         configs.parent / "tls.crt", configs.parent / "tls.key")
    registered = []
    try:
        registered = await register_webhooks(admin, configs)
        yield registered
    finally:
        await unregister_webhooks(admin, registered)
        await runner.cleanup()


async def test_the_api_server_calls_our_webhooks_and_applies_their_answers(admin: Kube, watcher_kube: Kube,
                                                                           webhook):
    assert {c["kind"] for c in webhook} == set(WEBHOOK_CONFIGS)  # the Service is left out with --url
    # /mutate: a queued Job created to run at once is stored suspended, as Kueue's webhook does;
    # nothing runs before the queue-manager admits it.
    name = f"hooked-{uuid.uuid4().hex[:6]}"
    created = await apply(admin, team_job(name, pods=1, gpus_per_pod=1, suspend=False))
    assert created["spec"]["suspend"] is True
    unqueued = team_job(f"plain-{uuid.uuid4().hex[:6]}", pods=1, gpus_per_pod=1, suspend=False)
    del unqueued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    # /validate: the policy library's required labels refuse it (deny), named as Gatekeeper does
    with pytest.raises(KubeError) as refused:
        await apply(admin, unqueued)
    assert refused.value.status == 403, refused.value
    assert "[require-cost-center-and-queue]" in refused.value.message
    assert "kueue.x-k8s.io/queue-name" in refused.value.message

    # /validate: ml-team would pass its 32 GPUs (28 in use + 8): the field report's constraint
    with pytest.raises(KubeError) as over:
        await apply(admin, team_job(f"big-{uuid.uuid4().hex[:6]}", pods=1, gpus_per_pod=8))
    assert over.value.status == 403 and "[ban-excess-gpu-ml-team]" in over.value.message, over.value

    # ADR 0067: the queue label of a submitted Job stays; the API server gives back why
    with pytest.raises(KubeError) as relabel:
        await admin.request("PATCH", job_path(name), body={"metadata": {"labels": {"kueue.x-k8s.io/queue-name": None}}},
                            content_type="application/merge-patch+json")
    assert relabel.value.status == 422, relabel.value
    assert "cannot be removed once set" in relabel.value.message
    assert "delete the Job and create it again" in relabel.value.message
    kept = await admin.get(job_path(name))
    assert kept["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"
    # any other change of the Job still goes through
    await admin.request("PATCH", job_path(name), body={"metadata": {"labels": {"touched": "yes"}}},
                        content_type="application/merge-patch+json")

    # The watcher's own writes are not judged again (the configuration's matchConditions): the
    # policy library refuses A100s to ml-team (not approved, in this webhook's view), so a user pinning the Job there is
    # refused, while the watcher's Admit, which pins the admitted flavor, goes through.
    pin = {"spec": {"template": {"spec": {"nodeSelector": {"gpu.nvidia.com/class": "a100"}}}}}
    with pytest.raises(KubeError) as pinned_by_hand:
        await admin.request("PATCH", job_path(name), body=pin, content_type="application/merge-patch+json")
    assert "[a100-approved-projects]" in pinned_by_hand.value.message, pinned_by_hand.value
    admitted = await Actuator(watcher_kube, EventLog(), flavors=A100).apply(
        admit_action(created["metadata"]["uid"], NS, name, node_selector={"gpu.nvidia.com/class": "a100"}))
    assert admitted.outcome == APPLIED, admitted.message
    await admin.request("DELETE", job_path(name), query={"propagationPolicy": "Background"})


async def test_a_volcano_job_is_held_by_its_pods_gate_until_admitted_and_again_after_an_eviction(
        admin: Kube, watcher_kube: Kube, webhook, volcano_jobs: str):
    """ADR 0068: batch.volcano.sh has no suspend. The webhook labels the Job's task templates
    and gates its pods; kube-scheduler leaves a gated pod alone. The Admit lifts the gates and
    pins the pods to the flavor; a pod made later is released as the watcher sees it; an
    eviction deletes the running pods, and those Volcano makes again stay held."""
    log = EventLog()
    actuator = Actuator(watcher_kube, log, flavors=A100)
    watcher = Watcher(watcher_kube, log, MemoryStateStore(), flavors=A100, watch_timeout_s=30,
                      on_held_pod=actuator.release_if_admitted)
    await watcher.start()
    await watcher.wait_synced(60)
    name = f"vc-train-{uuid.uuid4().hex[:6]}"
    try:
        created = await admin.request("POST", volcano_jobs, body=team_vcjob(name, replicas=2))
        uid = created["metadata"]["uid"]
        assert created["spec"]["tasks"][0]["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"  # the webhook's

        async def volcano_makes_pod(i: int) -> dict:
            return await admin.request("POST", resource_path("", "v1", "pods", NS), body=volcano_pod(created, i))

        def running(pod_name: str) -> list[dict]:
            return [e["payload"] for e in log.events(normalize.POD_RUNNING) if e["payload"]["name"] == pod_name]

        async def pod(pod_name: str) -> dict:
            return await admin.get(resource_path("", "v1", "pods", NS, pod_name))

        held = [await volcano_makes_pod(i) for i in (0, 1)]
        assert all(p["spec"]["schedulingGates"] == [{"name": "quartermaster.dev/admission"}] for p in held)
        await wait_until(lambda: latest(log, normalize.WORKLOAD_SUBMITTED, uid), 30, what="the Job submitted")
        await asyncio.sleep(3)  # kube-scheduler and kwok would have run an ungated pod by now
        for p in held:
            now = await pod(p["metadata"]["name"])
            assert not now["spec"].get("nodeName") and now["status"].get("phase") == "Pending"
            assert (now["status"].get("conditions") or [{}])[0].get("reason") == "SchedulingGated"

        admitted = await actuator.apply(admit_action(uid, NS, name, node_selector={"gpu.nvidia.com/class": "a100"}))
        assert admitted.outcome == APPLIED and "released 2 held pod(s)" in admitted.message, admitted.message
        for p in held:
            await wait_until(lambda p=p: running(p["metadata"]["name"]), 60, what="the released pod running")
        for p in held:
            now = await pod(p["metadata"]["name"])
            assert now["spec"]["nodeSelector"]["gpu.nvidia.com/class"] == "a100"
            assert now["spec"]["nodeName"].startswith("gpu-a100-") and not now["spec"].get("schedulingGates")
        assert {r["queue_name"] for p in held for r in running(p["metadata"]["name"])} == {"team-ml"}

        # Volcano replaces a pod after the Admit: the webhook gates it, the watcher releases it
        late = await volcano_makes_pod(2)
        assert late["spec"]["schedulingGates"] == [{"name": "quartermaster.dev/admission"}]
        await wait_until(lambda: running(late["metadata"]["name"]), 60, what="the later pod released and running")

        evicted = await actuator.apply(evict_action(uid, NS, name, reason="Preempted", grace_period_s=1))
        assert evicted.outcome == APPLIED and "3 running pod(s) deleted" in evicted.message, evicted.message
        again = await volcano_makes_pod(3)  # Volcano makes its pods again: held until a new Admit
        await asyncio.sleep(3)
        now = await pod(again["metadata"]["name"])
        assert now["spec"]["schedulingGates"] == [{"name": "quartermaster.dev/admission"}] and not now["spec"].get(
            "nodeName")
        job_now = await admin.get(resource_path("batch.volcano.sh", "v1alpha1", "jobs", NS, name))
        assert "quartermaster.dev/admitted-placement" not in job_now["metadata"].get("annotations", {})
        assert job_now["metadata"]["annotations"]["quartermaster.dev/evict-reason"] == "Preempted"
    finally:
        await watcher.stop()
        with contextlib.suppress(KubeError):
            await admin.request("DELETE", f"{volcano_jobs}/{name}", query={"propagationPolicy": "Background"})


async def test_a_volcano_job_admitted_partially_runs_only_the_pods_its_quota_holds(
        admin: Kube, watcher_kube: Kube, webhook, volcano_jobs: str):
    """Partial admission (minAvailable below the replicas): the quota holds 2 of the task's 4
    pods. The Admit releases two and the other two stay held, however often the watcher sees
    them; once a released pod ends, a held one takes its place. Every pod used to be released:
    4 pods running on the quota of 2."""
    actuator = Actuator(watcher_kube, EventLog(), flavors=A100)
    name = f"vc-elastic-{uuid.uuid4().hex[:6]}"
    try:
        created = await admin.request("POST", volcano_jobs, body=team_vcjob(name, replicas=4))
        uid = created["metadata"]["uid"]
        for i in range(4):
            await admin.request("POST", resource_path("", "v1", "pods", NS), body=volcano_pod(created, i))

        async def gated() -> list[str]:
            now = await admin.get(resource_path("", "v1", "pods", NS), labelSelector=f"volcano.sh/job-name={name}")
            return sorted(p["metadata"]["name"] for p in now["items"] if p["spec"].get("schedulingGates"))

        admitted = await actuator.apply(admit_action(uid, NS, name, node_selector={"gpu.nvidia.com/class": "a100"},
                                                     counts={"worker": 2}))
        assert admitted.outcome == APPLIED, admitted.message
        assert "released 2 held pod(s)" in admitted.message and "2 stay held" in admitted.message, admitted.message
        assert await gated() == [f"{name}-worker-2", f"{name}-worker-3"]
        # the watcher sees the held pods again (a restart, a resync): they stay held
        for held in (2, 3):
            pod = await admin.get(resource_path("", "v1", "pods", NS, f"{name}-worker-{held}"))
            assert await actuator.release_if_admitted(pod) is False
        again = await actuator.apply(admit_action(uid, NS, name, node_selector={"gpu.nvidia.com/class": "a100"},
                                                  counts={"worker": 2}))
        assert again.outcome == ALREADY_APPLIED and await gated() == [f"{name}-worker-2", f"{name}-worker-3"]

        # a released pod ends: one held pod takes its place, the other still waits
        await admin.request("DELETE", resource_path("", "v1", "pods", NS, f"{name}-worker-0"),
                            query={"gracePeriodSeconds": "0"})
        await wait_until(lambda: _gone(admin, f"{name}-worker-0"), 30, what="the released pod gone")
        pod = await admin.get(resource_path("", "v1", "pods", NS, f"{name}-worker-2"))
        assert await actuator.release_if_admitted(pod) is True
        pod = await admin.get(resource_path("", "v1", "pods", NS, f"{name}-worker-3"))
        assert await actuator.release_if_admitted(pod) is False
        assert await gated() == [f"{name}-worker-3"]
    finally:
        with contextlib.suppress(KubeError):
            await admin.request("DELETE", f"{volcano_jobs}/{name}", query={"propagationPolicy": "Background"})
        for i in range(4):
            with contextlib.suppress(KubeError):
                await admin.request("DELETE", resource_path("", "v1", "pods", NS, f"{name}-worker-{i}"),
                                    query={"gracePeriodSeconds": "0"})


async def _gone(admin: Kube, pod_name: str) -> bool:
    try:
        await admin.get(resource_path("", "v1", "pods", NS, pod_name))
    except KubeError as e:
        if e.status == 404:
            return True
        raise
    return False


def latest(log: EventLog, event_type: str, uid: str) -> dict | None:
    return next((e["payload"] for e in reversed(log.events(event_type)) if e["payload"].get("uid") == uid), None)
