"""The watcher against a real API server (deploy/testcluster), as the qm-watcher ServiceAccount.

Must-shows of issue 8:
* ml-team (cost-center label) and kwok nodes with 8 A100 GPUs each; the field report's queue
  config loaded; Jobs with the queue-name label are created suspended, admitted in FIFO order,
  unsuspended with the flavor's nodeSelector, scheduled onto the flavor's nodes, run, finish,
  and their quota is released.
* Kill the watcher mid-stream and restart it: nothing lost, nothing duplicated downstream; a
  stale resourceVersion gets 410 Gone and a clean re-list that emits only what changed.
* Evict: the checkpoint annotation is on the pods before they stop; the Job is suspended after
  the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import pytest
from k8s_harness import (
    FIXTURES,
    ClusterInfo,
    Downstream,
    EventLog,
    FifoQuota,
    admit_action,
    apply,
    cleanup_action,
    crash_restart_apiserver,
    evict_action,
    gpu_job,
    wait_until,
)

from services.watcher import normalize
from services.watcher.actuate import (
    ALREADY_APPLIED,
    ANN_CHECKPOINT,
    ANN_EVICT_REASON,
    APPLIED,
    NOT_FOUND,
    Actuator,
)
from services.watcher.kube import Kube, KubeError, resource_path
from services.watcher.main import WatcherSettings, load_flavors, run
from services.watcher.normalize import Flavor
from services.watcher.watch import FileStateStore, MemoryStateStore, Resource, Watcher

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NS = "ml-team"
A100 = {"a100-flavor": Flavor("a100-flavor", {"gpu.nvidia.com/class": "a100"})}


def job_path(name: str, ns: str = NS) -> str:
    return resource_path("batch", "v1", "jobs", ns, name)


async def start_watcher(kube: Kube, sink, store=None, **kw) -> Watcher:
    w = Watcher(kube, sink, store or MemoryStateStore(), watch_timeout_s=kw.pop("watch_timeout_s", 30), **kw)
    await w.start()
    await w.wait_synced(60)
    return w


def latest_by(log: EventLog, event_type: str, key: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for e in log.events(event_type):
        out[e["payload"][key]] = e["payload"]
    return out


# ----------------------------------------------------------------------------- RBAC


async def test_watcher_account_has_only_what_it_needs(watcher_kube: Kube):
    for path in ("/api/v1/pods", "/apis/batch/v1/jobs", "/api/v1/nodes", "/api/v1/namespaces",
                 "/apis/kueue.x-k8s.io/v1beta1/resourceflavors"):
        await watcher_kube.get(path, limit=1)
    forbidden = [
        ("GET", "/api/v1/secrets"),
        ("GET", "/api/v1/configmaps"),
        ("POST", resource_path("", "v1", "pods", NS)),
        ("DELETE", resource_path("", "v1", "nodes", None, "gpu-a100-0")),
        ("POST", resource_path("batch", "v1", "jobs", NS)),
        ("DELETE", resource_path("", "v1", "namespaces", None, NS)),
    ]
    for method, path in forbidden:
        with pytest.raises(KubeError) as ei:
            await watcher_kube.request(method, path, body={} if method == "POST" else None)
        assert ei.value.status == 403, (method, path, ei.value)


# ----------------------------------------------------------------------------- observations


async def test_initial_list_reports_gpu_nodes_per_flavor_and_cost_center(watcher_kube: Kube):
    log = EventLog()
    # No static flavors: the flavor→node mapping comes from the ResourceFlavor objects.
    w = await start_watcher(watcher_kube, log)
    try:
        def a100_nodes():
            nodes = latest_by(log, normalize.NODE_CAPACITY, "node")
            return {n: p for n, p in nodes.items() if p.get("flavor") == "a100-flavor"}

        nodes = await wait_until(lambda: len(a100_nodes()) == 8 and a100_nodes(), 30, what="8 a100 nodes")
        assert sorted(nodes) == [f"gpu-a100-{i}" for i in range(8)]
        for p in nodes.values():
            assert p["capacity"]["nvidia.com/gpu"] == 8000
            assert p["allocatable"]["nvidia.com/gpu"] == 8000
            assert p["labels"]["gpu.nvidia.com/class"] == "a100"
        others = latest_by(log, normalize.NODE_CAPACITY, "node")
        assert others["gpu-h100-0"].get("flavor") is None and others["gpu-v100-1"].get("flavor") is None
        ns = latest_by(log, normalize.NAMESPACE_LABELS, "namespace")
        assert normalize.cost_center(ns[NS]["labels"]) == "cc-ml-research"
        assert w.stats.lists >= 4
    finally:
        await w.stop()


async def test_a_jobs_namespace_is_reported_before_the_job(admin: Kube, watcher_kube: Kube):
    """ADR 0040: each resource has its own watch, so a Job created right after its Namespace can
    reach the watcher first, and admission would judge it without the namespace's labels. The
    watcher reports the Namespace before anything in it. Here it watches Jobs only, so the
    Namespace can come from nowhere else; the watcher's account may only list namespaces."""
    name = f"fresh-{uuid.uuid4().hex[:6]}"
    log = EventLog()
    w = await start_watcher(watcher_kube, log, resources=(Resource("jobs", "batch"),))
    try:
        await apply(admin, {"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": name, "labels": {"quartermaster.dev/cost-center": "cc-fresh"}}})
        await apply(admin, gpu_job("first", name, pods=1, gpus_per_pod=1))
        await apply(admin, gpu_job("second", name, pods=1, gpus_per_pod=1))

        def reported_in_it():
            return [e for e in log.events() if name in (e["payload"].get("namespace"), e["payload"].get("name"))]

        await wait_until(lambda: len(reported_in_it()) >= 3, 30, what="the namespace and both jobs")
        await asyncio.sleep(0.5)  # room for a second report of the namespace, which must not come
        reported = [(e["event_type"], e["payload"].get("labels")) for e in reported_in_it()]
    finally:
        await w.stop()
        await admin.request("DELETE", resource_path("", "v1", "namespaces", None, name))
    assert [event_type for event_type, _ in reported] == [
        normalize.NAMESPACE_LABELS, normalize.WORKLOAD_SUBMITTED, normalize.WORKLOAD_SUBMITTED]
    assert reported[0][1]["quartermaster.dev/cost-center"] == "cc-fresh"


# ----------------------------------------------------------------------------- the loop


async def test_jobs_admitted_in_order_pinned_to_flavor_run_finish_and_release(
        cluster: ClusterInfo, admin: Kube, watcher_kube: Kube):
    log = EventLog()
    actuator = Actuator(watcher_kube, log, flavors=A100)
    quota = FifoQuota(actuator.apply, flavor="a100-flavor", nominal_gpu=32, queue_name="team-ml",
                      only=lambda w: w["name"].startswith("fifo-"))
    log.listeners.append(quota.on_event)
    w = await start_watcher(watcher_kube, log, flavors=A100)
    names = ["fifo-1", "fifo-2", "fifo-3", "fifo-4"]
    shapes = {"fifo-1": (2, 8), "fifo-2": (2, 8), "fifo-3": (2, 8), "fifo-4": (1, 8)}
    try:
        for n in names:
            pods, gpus = shapes[n]
            await apply(admin, gpu_job(n, NS, pods=pods, gpus_per_pod=gpus, run_s=3))
            await asyncio.sleep(1.05)  # creationTimestamp has 1 s resolution: keep FIFO order unambiguous

        def all_released():
            return len(quota.released) == len(names)

        await wait_until(all_released, 120, what="all four workloads to finish and release quota")
        submitted = {e["payload"]["name"]: e["payload"] for e in log.events(normalize.WORKLOAD_SUBMITTED)}
        # Seen as submitted, with pod sets from parallelism and container limits.
        for n in names:
            pods, gpus = shapes[n]
            assert submitted[n]["pod_sets"][0]["count"] == pods
            assert submitted[n]["pod_sets"][0]["requests"]["nvidia.com/gpu"] == gpus * 1000
            assert submitted[n]["queue_name"] == "team-ml"
        # Admitted FIFO; never more than the nominal 32 GPUs; fifo-3 waits for a release.
        assert quota.admission_order == names
        assert quota.max_used_milli <= 32_000
        trail = quota.trail
        assert trail.index(("admit", "fifo-3")) > min(i for i, t in enumerate(trail) if t[0] == "release")
        assert quota.used_milli == 0
        # Unsuspended with the flavor's nodeSelector; pods ran on a100 nodes only.
        for n in names:
            job = await admin.get(job_path(n))
            assert job["spec"]["suspend"] is False
            assert job["spec"]["template"]["spec"]["nodeSelector"] == {"gpu.nvidia.com/class": "a100"}
        running = [p for p in (e["payload"] for e in log.events(normalize.POD_RUNNING))
                   if p["workload_uid"] in quota.admitted]
        assert len(running) == 7
        assert all(p["node"].startswith("gpu-a100-") for p in running), running
        finished = [p for p in (e["payload"] for e in log.events(normalize.POD_FINISHED))
                    if p["workload_uid"] in quota.admitted]
        assert len(finished) == 7 and {p["phase"] for p in finished} == {"Succeeded"}
        # Each Admit found its Job still suspended (created so) and unsuspended it.
        outcomes = [e["payload"] for e in log.events(normalize.ACTION_OUTCOME)]
        assert [o["outcome"] for o in outcomes] == [APPLIED] * 4
        assert all(o["message"].startswith("unsuspended") for o in outcomes)
        # The Job controller agrees: every Job completed.
        for n in names:
            await wait_until(lambda n=n: _job_succeeded(admin, n), 30, what=f"{n} Complete")
    finally:
        await w.stop()
        for t in quota.tasks:
            await t


async def _job_succeeded(admin: Kube, name: str) -> bool:
    job = await admin.get(job_path(name))
    return job.get("status", {}).get("succeeded", 0) == job["spec"]["completions"]


# ----------------------------------------------------------------------------- restarts


def _facts_per_object(down: Downstream, event_type: str) -> dict[str, int]:
    """How many distinct events (ids) downstream holds per object (pod or workload uid)."""
    counts: dict[str, int] = {}
    for p in down.facts(event_type):
        counts[p["uid"]] = counts.get(p["uid"], 0) + 1
    return counts


def workload_of(p: dict[str, Any]) -> str:
    """The workload uid an event is about (pod events carry workload_uid, submissions uid)."""
    return p.get("workload_uid") or p["uid"]


ONCE_FACTS = (normalize.POD_RUNNING, normalize.POD_FINISHED, normalize.WORKLOAD_SUBMITTED)


async def test_killed_watcher_restarts_without_losing_or_duplicating(admin: Kube, watcher_kube: Kube, tmp_path):
    store = FileStateStore(str(tmp_path / "watcher-state.json"))
    down = Downstream()
    log = EventLog(listeners=[down])
    names = ["restart-1", "restart-2", "restart-3"]
    w1 = await start_watcher(watcher_kube, log, store, flavors=A100)
    uids = set()
    for n in names:
        uids.add((await apply(admin, gpu_job(n, NS, pods=2, gpus_per_pod=1, run_s=4, suspend=False)))
                 ["metadata"]["uid"])

    def of_ours(event_type: str) -> list[dict[str, Any]]:
        return [p for p in down.facts(event_type) if workload_of(p) in uids]

    # Mid-stream: some pods are running, none has finished yet.
    await wait_until(lambda: len(of_ours(normalize.POD_RUNNING)) >= 1, 30, what="a pod running")
    await w1.kill()  # a crash: no final save
    finished_before_kill = len(of_ours(normalize.POD_FINISHED))
    emitted_before = len(log.records)
    await asyncio.sleep(6)  # the cluster moves on while the watcher is down

    w2 = await start_watcher(watcher_kube, log, store, flavors=A100)
    try:
        await wait_until(lambda: len(of_ours(normalize.POD_FINISHED)) == 6, 60, what="6 pods finished")
        # Nothing lost: every pod of the three Jobs has its running and finished fact.
        assert len(of_ours(normalize.POD_RUNNING)) == 6
        # Nothing doubled downstream: exactly one fact per (object, type).
        for et in ONCE_FACTS:
            counts = _facts_per_object(down, et)
            assert all(c == 1 for c in counts.values()), (et, counts)
        assert len(of_ours(normalize.WORKLOAD_SUBMITTED)) == 3
        assert len(log.records) > emitted_before  # the restarted watcher did pick up the changes
        assert finished_before_kill < 6  # the kill really was mid-stream

        # A watcher that lost its state entirely re-lists: its workload and pod events carry
        # the ids already delivered, so downstream takes nothing twice.
        await w2.stop()
        fresh_log = EventLog()
        w3 = await start_watcher(watcher_kube, fresh_log, MemoryStateStore(), flavors=A100)
        await w3.stop()
        relisted = [e for e in fresh_log.events() if e["event_type"] in ONCE_FACTS
                    and workload_of(e["payload"]) in uids]
        assert len(relisted) == 6 + 6 + 3
        assert all(e["event_id"] in down.seen for e in relisted)
    finally:
        await w2.stop()


async def test_stale_resource_version_gets_410_and_a_clean_relist(
        cluster: ClusterInfo, admin: Kube, watcher_kube: Kube, tmp_path):
    store = FileStateStore(str(tmp_path / "watcher-state.json"))
    log = EventLog()
    w1 = await start_watcher(watcher_kube, log, store, flavors=A100)
    await asyncio.sleep(1)
    await w1.stop()
    before_ids = set(log.ids())
    saved = await store.load()
    assert set(saved.resource_versions) >= {"core/v1/pods", "batch/v1/jobs"}

    # While the watcher is down, a new workload runs and the API server restarts: its new watch
    # cache starts at the current resourceVersion, so the saved ones are "too old" (410 Expired).
    await apply(admin, gpu_job("after-gone", NS, pods=1, gpus_per_pod=1, run_s=1, suspend=False))
    await crash_restart_apiserver(cluster)
    assert await _gone(admin, "/api/v1/pods", saved.resource_versions["core/v1/pods"])

    log2 = EventLog()
    w2 = await start_watcher(watcher_kube, log2, store, flavors=A100)
    try:
        uid = (await admin.get(job_path("after-gone")))["metadata"]["uid"]
        await wait_until(lambda: any(e["payload"].get("workload_uid") == uid
                                     for e in log2.events(normalize.POD_FINISHED)), 60,
                         what="the new pod to finish")
        await wait_until(lambda: any(e["payload"].get("uid") == uid for e in log2.events(normalize.WORKLOAD_FINISHED)),
                         60, what="the new Job to finish (ADR 0064)")
        # Every core resource was re-listed after its 410.
        assert {"core/v1/namespaces", "core/v1/nodes", "batch/v1/jobs", "core/v1/pods"} <= set(w2.stats.gone), \
            w2.stats
        # Only what changed: the new workload and its pod; nothing re-emitted from before.
        relisted = [e for e in log2.events() if e["event_type"] != normalize.NODE_CAPACITY]
        assert relisted, "the re-list should report the new workload"
        assert {workload_of(e["payload"]) for e in relisted} == {uid}
        assert {e["event_type"] for e in relisted} == {
            normalize.WORKLOAD_SUBMITTED, normalize.POD_RUNNING, normalize.POD_FINISHED, normalize.WORKLOAD_FINISHED}
        assert not (set(log2.ids()) & before_ids)
        # Nodes whose capacity did not change are not reported again (kwok's heartbeats change
        # their resourceVersion, not their capacity).
        assert not log2.events(normalize.NODE_CAPACITY)
    finally:
        await w2.stop()


async def test_dropped_connections_reconnect_with_backoff(cluster: ClusterInfo, admin: Kube, watcher_kube: Kube):
    """The API server dies under a running watcher: its streams drop, connections are refused
    for a while, then it is back with an empty watch cache. The watcher reconnects (backoff),
    re-lists where its resourceVersion is gone, and reports what happened meanwhile, once."""
    down = Downstream()
    log = EventLog(listeners=[down])
    w = await start_watcher(watcher_kube, log, flavors=A100)
    try:
        await crash_restart_apiserver(cluster)
        job = await apply(admin, gpu_job("after-drop", NS, pods=1, gpus_per_pod=1, run_s=1, suspend=False))
        uid = job["metadata"]["uid"]
        await wait_until(lambda: any(p["workload_uid"] == uid for p in down.facts(normalize.POD_FINISHED)),
                         60, what="the pod created after the drop to finish")
        assert w.stats.reconnects + w.stats.relists_after_gone >= 1, w.stats
        for et in ONCE_FACTS:
            assert all(c == 1 for c in _facts_per_object(down, et).values())
    finally:
        await w.stop()


async def _gone(kube: Kube, path: str, rv: str) -> bool:
    """Whether a watch of ``path`` from ``rv`` is answered with 410 Gone."""
    try:
        async for ev in kube.watch(path, resource_version=rv, timeout_s=1):
            if ev.get("type") == "ERROR":
                return ev["object"].get("code") == 410
        return False
    except KubeError as e:
        return e.status == 410


async def test_bookmarks_advance_the_saved_resource_version(admin: Kube, watcher_kube: Kube):
    """Nothing happens to pods, but the cluster moves on: the pods watch gets a BOOKMARK and the
    watcher's saved resourceVersion moves with it, so a restart resumes from there."""
    log = EventLog()
    w = await start_watcher(watcher_kube, log, flavors=A100, watch_timeout_s=6)
    try:
        # Pods of earlier tests may still be finishing: start once their events have stopped
        # (3 s without a new one), so what follows is the bookmark alone.
        pods_before, quiet_since = -1, 0.0
        for _ in range(300):
            count = len(log.events(normalize.POD_RUNNING)) + len(log.events(normalize.POD_FINISHED))
            if count != pods_before:
                pods_before, quiet_since = count, asyncio.get_running_loop().time()
            elif asyncio.get_running_loop().time() - quiet_since >= 3:
                break
            await asyncio.sleep(0.1)
        r0 = int(w.state.resource_versions["core/v1/pods"])
        # Advance etcd's revision elsewhere, then a consistent pod list: the API server asks
        # etcd for a progress notification, its pods cache catches up, and watchers get a
        # bookmark shortly before their timeout (the server sends them ~2 s before it).
        await admin.request("PATCH", resource_path("", "v1", "namespaces", None, "default"),
                            body={"metadata": {"labels": {"qm-bookmark-probe": str(r0)}}},
                            content_type="application/merge-patch+json")
        await admin.get("/api/v1/pods")
        await wait_until(lambda: w.stats.bookmarks >= 1
                         and int(w.state.resource_versions["core/v1/pods"]) > r0, 30, what="a bookmark")
        assert len(log.events(normalize.POD_RUNNING)) + len(log.events(normalize.POD_FINISHED)) == pods_before
    finally:
        await w.stop()


# ----------------------------------------------------------------------------- actions


async def test_evict_signals_checkpoint_before_pods_stop_then_suspends(admin: Kube, watcher_kube: Kube):
    log = EventLog()
    w = await start_watcher(watcher_kube, log, flavors=A100)
    actuator = Actuator(watcher_kube, log, flavors=A100)
    try:
        await apply(admin, gpu_job("evict-me", NS, pods=2, gpus_per_pod=8, run_s=600))
        uid = (await admin.get(job_path("evict-me")))["metadata"]["uid"]
        admit = admit_action(uid, NS, "evict-me", node_selector={"gpu.nvidia.com/class": "a100"},
                             flavors={"main": {"nvidia.com/gpu": "a100-flavor"}})
        assert (await actuator.apply(admit)).outcome == APPLIED
        # Re-applying is a no-op.
        assert (await actuator.apply(admit)).outcome == ALREADY_APPLIED

        def running_pods():
            return [e["payload"] for e in log.events(normalize.POD_RUNNING) if e["payload"]["workload_uid"] == uid]

        await wait_until(lambda: len(running_pods()) == 2, 60, what="2 pods running")

        # Watch the pods as the workload would see them: when does the checkpoint signal
        # appear, when does deletion start. A watch, not polling: kwok removes a deleted pod
        # within milliseconds, which a poll on a slow machine can miss entirely.
        first_signal: dict[str, float] = {}
        first_deleting: dict[str, float] = {}
        pods_path = resource_path("", "v1", "pods", NS)
        listed = await admin.get(pods_path)

        async def poll():
            version = listed["metadata"]["resourceVersion"]
            while True:
                async for event in admin.watch(pods_path, resource_version=version, timeout_s=60, bookmarks=False):
                    pod = event["object"]
                    version = pod["metadata"].get("resourceVersion", version)
                    if (pod["metadata"].get("labels") or {}).get("batch.kubernetes.io/controller-uid") != uid:
                        continue
                    now, name = time.monotonic(), pod["metadata"]["name"]
                    if ANN_CHECKPOINT in (pod["metadata"].get("annotations") or {}):
                        first_signal.setdefault(name, now)
                    if pod["metadata"].get("deletionTimestamp") or event["type"] == "DELETED":
                        first_deleting.setdefault(name, now)

        poller = asyncio.create_task(poll())
        grace_s = 3
        evict = evict_action(uid, NS, "evict-me", reason="Preempted", grace_period_s=grace_s)
        t0 = time.monotonic()
        outcome = await actuator.apply(evict)
        assert outcome.outcome == APPLIED, outcome.message
        assert time.monotonic() - t0 >= grace_s - 0.1

        def finished():
            return [e["payload"] for e in log.events(normalize.POD_FINISHED) if e["payload"]["workload_uid"] == uid]

        await wait_until(lambda: len(finished()) == 2, 60, what="evicted pods to stop")
        await wait_until(lambda: len(first_deleting) == 2, 30, what="the watch to see both deletions")
        poller.cancel()

        pod_names = {p["name"] for p in running_pods()}
        assert set(first_signal) == pod_names, "every running pod got the checkpoint signal"
        for name in pod_names:
            assert name in first_deleting
            # Signal first, then at least the grace period, then the pod stops.
            assert first_deleting[name] - first_signal[name] >= grace_s - 0.5, (name, first_signal, first_deleting)
        job = await admin.get(job_path("evict-me"))
        assert job["spec"]["suspend"] is True
        assert job["metadata"]["annotations"][ANN_EVICT_REASON] == "Preempted"
        assert "nodeSelector" not in job["spec"]["template"]["spec"]  # restored, as Kueue does
        assert (await actuator.apply(evict)).outcome == ALREADY_APPLIED
    finally:
        await w.stop()


async def test_a_job_unsuspended_before_admission_is_stopped_at_once_with_its_template_as_it_was(
        admin: Kube, watcher_kube: Kube):
    """The queue-manager's stop of a Job found running before it was admitted (ADR 0062):
    someone unsuspends a queued Job by hand; the Evict without grace suspends it again (its
    pods go) and leaves its template as it was, since no admission pinned it."""
    log = EventLog()
    w = await start_watcher(watcher_kube, log, flavors=A100)
    actuator = Actuator(watcher_kube, log, flavors=A100)
    try:
        name = f"jumped-{uuid.uuid4().hex[:6]}"
        await apply(admin, gpu_job(name, NS, pods=1, gpus_per_pod=1, run_s=600))
        job = await admin.get(job_path(name))
        uid = job["metadata"]["uid"]
        await admin.request("PATCH", job_path(name), body={"spec": {"suspend": False}},  # by hand, past the queue
                            content_type="application/merge-patch+json")

        def pods(kind):
            return [e["payload"] for e in log.events(kind) if e["payload"]["workload_uid"] == uid]

        await wait_until(lambda: len(pods(normalize.POD_RUNNING)) == 1, 60, what="the unadmitted pod running")
        stop = evict_action(uid, NS, name, reason="NotAdmitted", grace_period_s=0)
        result = await actuator.apply(stop)
        assert result.outcome == APPLIED, result.message
        await wait_until(lambda: len(pods(normalize.POD_FINISHED)) == 1, 60, what="its pod to stop")
        stopped = await admin.get(job_path(name))
        assert stopped["spec"]["suspend"] is True
        assert stopped["metadata"]["annotations"][ANN_EVICT_REASON] == "NotAdmitted"
        assert stopped["spec"]["template"]["spec"].get("nodeSelector") == job["spec"]["template"]["spec"].get(
            "nodeSelector")
        assert (await actuator.apply(stop)).outcome == ALREADY_APPLIED
    finally:
        await w.stop()


async def test_a_job_whose_queue_label_is_removed_while_it_runs_still_ends_in_its_queue(
        admin: Kube, watcher_kube: Kube):
    """ADR 0067: the label of a running Job is removed (the webhook refuses that; here there is
    none). Its quota is held in team-ml's cohort, so its pods' facts and its end still name
    team-ml. Before, its pods carried no queue and no finish came: its quota stayed taken."""
    log = EventLog()
    w = await start_watcher(watcher_kube, log, flavors=A100)
    actuator = Actuator(watcher_kube, log, flavors=A100)
    try:
        name = f"unlabelled-{uuid.uuid4().hex[:6]}"
        await apply(admin, gpu_job(name, NS, pods=2, gpus_per_pod=1, run_s=4))
        uid = (await admin.get(job_path(name)))["metadata"]["uid"]
        await wait_until(lambda: latest_by(log, normalize.WORKLOAD_SUBMITTED, "uid").get(uid), 30,
                         what="the Job submitted")
        assert (await actuator.apply(admit_action(uid, NS, name, node_selector={"gpu.nvidia.com/class": "a100"}))).outcome == APPLIED
        await admin.request("PATCH", job_path(name),
                            body={"metadata": {"labels": {"kueue.x-k8s.io/queue-name": None}}},
                            content_type="application/merge-patch+json")
        assert "kueue.x-k8s.io/queue-name" not in (await admin.get(job_path(name)))["metadata"].get("labels", {})

        def of_it(kind):
            return [e["payload"] for e in log.events(kind) if uid in (e["payload"].get("workload_uid"),
                                                                      e["payload"].get("uid"))]

        await wait_until(lambda: of_it(normalize.WORKLOAD_FINISHED), 90, what="the Job's end")
        await wait_until(lambda: len(of_it(normalize.POD_FINISHED)) == 2, 30, what="both pods' ends")
    finally:
        await w.stop()
    (finished,) = of_it(normalize.WORKLOAD_FINISHED)
    assert finished["queue_name"] == "team-ml" and finished["succeeded"] is True
    assert {p["queue_name"] for p in of_it(normalize.POD_RUNNING) + of_it(normalize.POD_FINISHED)} == {"team-ml"}
    assert len(of_it(normalize.WORKLOAD_SUBMITTED)) == 1  # the label's removal is no new submission


async def test_partial_admission_runs_the_admitted_pods_and_an_eviction_restores_the_parallelism(
        admin: Kube, watcher_kube: Kube):
    """Kueue's partial admission (job-min-parallelism): quota for 2 of the Job's 4 pods. The Job
    runs 2 at a time until an eviction suspends it with its own parallelism back."""
    log = EventLog()
    w = await start_watcher(watcher_kube, log, flavors=A100)
    actuator = Actuator(watcher_kube, log, flavors=A100)
    try:
        job = gpu_job("partial", NS, pods=4, gpus_per_pod=1, run_s=600)
        job["metadata"]["annotations"] = {"kueue.x-k8s.io/job-min-parallelism": "2"}
        await apply(admin, job)
        uid = (await admin.get(job_path("partial")))["metadata"]["uid"]
        admit = admit_action(uid, NS, "partial", flavors={"main": {"nvidia.com/gpu": "a100-flavor"}},
                             counts={"main": 2})
        result = await actuator.apply(admit)
        assert result.outcome == APPLIED and "2 pods at a time" in result.message
        admitted = await admin.get(job_path("partial"))
        assert admitted["spec"]["parallelism"] == 2 and admitted["spec"]["suspend"] is False
        assert (await actuator.apply(admit)).outcome == ALREADY_APPLIED

        def running_pods():
            return [e["payload"] for e in log.events(normalize.POD_RUNNING) if e["payload"]["workload_uid"] == uid]

        await wait_until(lambda: len(running_pods()) == 2, 60, what="the 2 admitted pods running")
        await asyncio.sleep(2)
        assert len(running_pods()) == 2, "no pod beyond the admitted count"
        evict = evict_action(uid, NS, "partial", reason="Preempted", grace_period_s=1)
        assert (await actuator.apply(evict)).outcome == APPLIED
        evicted = await admin.get(job_path("partial"))
        assert evicted["spec"]["suspend"] is True and evicted["spec"]["parallelism"] == 4
    finally:
        await w.stop()


async def test_a_volcano_pod_whose_job_was_not_seen_yet_gets_the_jobs_queue(admin: Kube, watcher_kube: Kube,
                                                                            volcano_jobs: str):
    """ADR 0064 for Volcano: a pod of a Volcano Job made without the webhook carries no queue
    label; the watcher lists its Job by name (here it watches only pods, so the Job can come from
    nowhere else), reports it first, and gives the pod its queue."""
    log = EventLog()
    w = await start_watcher(watcher_kube, log, resources=(Resource("pods"),))
    name = f"vc-unseen-{uuid.uuid4().hex[:6]}"
    try:
        vcjob = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                 "metadata": {"name": name, "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": "team-ml"}},
                 "spec": {"tasks": [{"name": "worker", "replicas": 1, "template": {"spec": {
                     "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}]}}
        uid = (await admin.request("POST", volcano_jobs, body=vcjob))["metadata"]["uid"]
        await admin.request("POST", resource_path("", "v1", "pods", NS), body={
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-worker-0", "namespace": NS, "labels": {"volcano.sh/job-name": name},
                         "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": name,
                                              "uid": uid, "controller": True}]},
            "spec": {"nodeName": "gpu-a100-0", "restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        await wait_until(lambda: [e for e in log.events(normalize.POD_RUNNING) if e["payload"]["workload_uid"] == uid],
                         60, what="the pod running")
    finally:
        await w.stop()
        with contextlib.suppress(KubeError):
            await admin.request("DELETE", f"{volcano_jobs}/{name}", query={"propagationPolicy": "Background"})
    (submitted,) = [e for e in log.events(normalize.WORKLOAD_SUBMITTED) if e["payload"]["uid"] == uid]
    (run,) = [e for e in log.events(normalize.POD_RUNNING) if e["payload"]["workload_uid"] == uid]
    assert run["payload"]["queue_name"] == "team-ml"
    assert log.ids().index(submitted["event_id"]) < log.ids().index(run["event_id"])  # its Job reported first


async def test_actions_on_a_volcano_job_made_without_the_webhook_say_it_cannot_be_held(
        admin: Kube, watcher_kube: Kube, volcano_jobs: str):
    """A Volcano Job has no suspend; the admission webhook holds its pods by a scheduling gate
    (ADR 0068, tests/k8s/test_webhook_cluster.py). One created without the webhook cannot be
    held: the watcher's answer to its Admit or Evict says so and what to do, where it said "job
    not found" (what on-call read as a lost workload)."""
    name = f"vc-train-{uuid.uuid4().hex[:6]}"
    try:
        vcjob = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                 "metadata": {"name": name, "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": "team-ml"}},
                 "spec": {"minAvailable": 1, "tasks": [{"name": "worker", "replicas": 1, "template": {"spec": {
                     "containers": [{"name": "c", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}}]}}
        uid = (await admin.request("POST", volcano_jobs, body=vcjob))["metadata"]["uid"]
        actuator = Actuator(watcher_kube, EventLog(), flavors=A100)
        admit = await actuator.apply(admit_action(uid, NS, name, flavors={"main": {"nvidia.com/gpu": "a100-flavor"}}))
        stop = await actuator.apply(evict_action(uid, NS, name, reason="NotAdmitted", grace_period_s=0))
        for result in (admit, stop):
            assert result.outcome == NOT_FOUND and "a Volcano Job created without" in result.message
            assert "admission-webhook.yaml" in result.message
        # what `kubectl describe` of the Volcano Job lists: the Events name it, not a batch/v1 Job
        events = (await admin.get(resource_path("", "v1", "events", NS),
                                  fieldSelector=f"involvedObject.name={name}"))["items"]
        assert len(events) == 2 and {e["involvedObject"]["apiVersion"] for e in events} == {
            "batch.volcano.sh/v1alpha1"}, events
        # another uid under that name is not this workload's Job
        other = await actuator.apply(evict_action(str(uuid.uuid4()), NS, name, reason="NotAdmitted",
                                                  grace_period_s=0))
        assert (other.outcome, other.message) == (NOT_FOUND, "job not found")
    finally:
        with contextlib.suppress(KubeError):
            await admin.request("DELETE", f"{volcano_jobs}/{name}", query={"propagationPolicy": "Background"})


async def test_cleanup_deletes_the_job_once(admin: Kube, watcher_kube: Kube):
    log = EventLog()
    actuator = Actuator(watcher_kube, log, flavors=A100)
    await apply(admin, gpu_job("zombie", NS, pods=1, gpus_per_pod=1))
    uid = (await admin.get(job_path("zombie")))["metadata"]["uid"]
    cleanup = cleanup_action(uid, NS, "zombie")
    first = await actuator.apply(cleanup)
    second = await actuator.apply(cleanup)
    assert first.outcome == APPLIED
    assert second.outcome == ALREADY_APPLIED
    assert first.observation.event_id != second.observation.event_id
    # The same outcome of the same action is the same event: a redelivered action dedupes.
    assert (await actuator.apply(cleanup)).observation.event_id == second.observation.event_id
    with pytest.raises(KubeError) as ei:
        await admin.get(job_path("zombie"))
    assert ei.value.status == 404


async def test_admit_retries_on_conflict(admin: Kube, watcher_kube: Kube):
    """Someone else updates the Job between the actuator's read and write: 409, re-read, retry."""
    await apply(admin, gpu_job("contended", NS, pods=1, gpus_per_pod=1, run_s=1))
    uid = (await admin.get(job_path("contended")))["metadata"]["uid"]

    class Interfering(Kube):
        """The real client, with another writer slipped in after the first GET of the Job."""

        def __init__(self, inner: Kube) -> None:
            self.inner = inner
            self.interfered = False

        async def request(self, method, path, **kw):
            r = await self.inner.request(method, path, **kw)
            if method == "GET" and path == job_path("contended") and not self.interfered:
                self.interfered = True
                await admin.request("PATCH", path, body={"metadata": {"labels": {"touched": "yes"}}},
                                    content_type="application/merge-patch+json")
            return r

        async def get(self, path, **query):
            return await self.request("GET", path, query=query)

    kube = Interfering(watcher_kube)
    log = EventLog()
    actuator = Actuator(kube, log, flavors=A100)
    out = await actuator.apply(admit_action(uid, NS, "contended",
                                            flavors={"main": {"nvidia.com/gpu": "a100-flavor"}}))
    assert kube.interfered
    assert out.outcome == APPLIED
    assert out.attempts == 2
    job = await admin.get(job_path("contended"))
    assert job["spec"]["suspend"] is False and job["metadata"]["labels"]["touched"] == "yes"


# ----------------------------------------------------------------------------- the service


async def test_service_run_wires_watch_clock_and_actions(cluster: ClusterInfo, admin: Kube, tmp_path):
    """services.watcher.main.run as the service runs it: token from a file (as a projected
    ServiceAccount token), flavors from a Kueue config dir, actions from an async iterator."""
    token_file = tmp_path / "token"
    token_file.write_text(cluster.watcher_token)
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "queues.yaml").write_text((FIXTURES / "queue-config.yaml").read_text())
    settings = WatcherSettings(server=cluster.server, token_file=str(token_file), ca_file=cluster.ca_file,
                               state_path=str(tmp_path / "state.json"), config_dir=str(config_dir),
                               clock_interval_s=1.0, watch_timeout_s=30)
    assert set(load_flavors(str(config_dir))) == {"a100-flavor"}
    log = EventLog()
    actions: asyncio.Queue[dict] = asyncio.Queue()

    async def action_stream():
        while True:
            yield await actions.get()

    service = asyncio.create_task(run(settings, log, action_stream()))
    try:
        await apply(admin, gpu_job("svc-1", NS, pods=1, gpus_per_pod=8, run_s=1))
        uid = (await admin.get(job_path("svc-1")))["metadata"]["uid"]
        await wait_until(lambda: any(e["payload"]["uid"] == uid
                                     for e in log.events(normalize.WORKLOAD_SUBMITTED)), 30, what="submitted")
        await actions.put(admit_action(uid, NS, "svc-1", flavors={"main": {"nvidia.com/gpu": "a100-flavor"}}))
        await wait_until(lambda: any(e["payload"].get("workload_uid") == uid
                                     for e in log.events(normalize.POD_FINISHED)), 60, what="svc-1 to finish")
        outcomes = [e["payload"]["outcome"] for e in log.events(normalize.ACTION_OUTCOME)]
        assert outcomes == ["applied"]
        ticks = log.events(normalize.CLOCK_TICK)
        assert ticks and all(t["payload"]["at"].endswith("Z") for t in ticks)
    finally:
        service.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await service
