"""Helpers for the tests against the real test cluster (deploy/testcluster).

Fakes, not mocks: ``EventLog`` is the in-memory bus the watcher writes to, ``Downstream`` is a
consumer that dedupes by event_id as every Quartermaster handler does, and ``FifoQuota`` is a
tiny stand-in for the queue-manager (one flavor, nominal quota, FIFO by creation time) that
turns watcher observations into Admit actions, so the loop cluster → watcher → decision →
watcher → cluster runs for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.contracts.codec import envelope_to_dict, make_envelope, validate_document
from services.contracts.events import ActionAdmit, ActionCleanup, ActionEvict
from services.watcher.kube import Credentials, Kube, KubeError, api_client, resource_path

REPO = Path(__file__).resolve().parents[2]
TESTCLUSTER = REPO / "deploy" / "testcluster"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# kind -> (group, version, plural, namespaced)
KINDS: dict[str, tuple[str, str, str, bool]] = {
    "Namespace": ("", "v1", "namespaces", False),
    "Node": ("", "v1", "nodes", False),
    "ServiceAccount": ("", "v1", "serviceaccounts", True),
    "Pod": ("", "v1", "pods", True),
    "Job": ("batch", "v1", "jobs", True),
    "ClusterRole": ("rbac.authorization.k8s.io", "v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False),
    "CustomResourceDefinition": ("apiextensions.k8s.io", "v1", "customresourcedefinitions", False),
    "ResourceFlavor": ("kueue.x-k8s.io", "v1beta1", "resourceflavors", False),
    "ClusterQueue": ("kueue.x-k8s.io", "v1beta1", "clusterqueues", False),
    "LocalQueue": ("kueue.x-k8s.io", "v1beta1", "localqueues", True),
}


@dataclass(frozen=True)
class ClusterInfo:
    server: str
    ca_file: str
    admin_token: str
    watcher_token: str
    run_dir: str
    env: dict[str, str] = field(default_factory=dict)  # QM_TESTCLUSTER_* the cluster was started with

    def kube(self, token: str | None = None) -> Kube:
        return Kube(api_client(Credentials(self.server, token or self.admin_token, self.ca_file)))

    def admin(self) -> Kube:
        return self.kube(self.admin_token)

    def watcher(self) -> Kube:
        return self.kube(self.watcher_token)


async def crash_restart_apiserver(cluster: ClusterInfo) -> None:
    """SIGKILL the API server and start it again (start.sh relaunches only what is down).
    Its watch cache starts empty at the current resourceVersion, so any older resourceVersion
    is now answered with 410 Gone: what a watcher sees after a long outage or a control-plane
    upgrade."""
    pidfile = os.path.join(cluster.run_dir, "pids", "kube-apiserver.pid")
    with open(pidfile) as f:
        pid = int(f.read().strip())
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.1)
    env = {**os.environ, **cluster.env}
    proc = await asyncio.create_subprocess_exec("bash", str(TESTCLUSTER / "start.sh"), env=env,
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"start.sh failed after killing the API server:\n{out.decode()}")


def load_yaml(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def obj_path(obj: dict[str, Any], *, named: bool = False) -> str:
    group, version, plural, namespaced = KINDS[obj["kind"]]
    meta = obj["metadata"]
    return resource_path(group, version, plural, meta.get("namespace") if namespaced else None,
                         meta["name"] if named else None)


async def apply(kube: Kube, obj: dict[str, Any]) -> dict[str, Any]:
    """Create, or replace an existing object of the same name (enough for fixtures)."""
    try:
        return await kube.request("POST", obj_path(obj), body=obj)
    except KubeError as e:
        if e.status != 409:
            raise
    current = await kube.get(obj_path(obj, named=True))
    body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    return await kube.request("PUT", obj_path(obj, named=True), body=body)


async def wait_until(pred: Callable[[], Any], timeout_s: float = 60.0, interval_s: float = 0.2,
                     what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        r = pred()
        if asyncio.iscoroutine(r):
            r = await r
        if r:
            return r
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


# ------------------------------------------------------------------------------- fakes


@dataclass
class EventLog:
    """The bus, in memory: every (topic, key, event) the watcher emitted, in order."""

    records: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    listeners: list[Callable[[str, str, dict[str, Any]], Any]] = field(default_factory=list)

    async def __call__(self, topic: str, key: str, event: dict[str, Any]) -> None:
        # What a producer does before sending: strict validation against schemas/.
        validate_document(event, strict=True)
        self.records.append((topic, key, event))
        for fn in self.listeners:
            r = fn(topic, key, event)
            if asyncio.iscoroutine(r):
                await r

    def events(self, event_type: str | None = None) -> list[dict[str, Any]]:
        return [e for _, _, e in self.records if event_type is None or e["event_type"] == event_type]

    def ids(self) -> list[str]:
        return [e["event_id"] for _, _, e in self.records]


class Downstream:
    """A consumer that is idempotent by event_id, like every Quartermaster handler."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, Any]] = {}
        self.duplicates = 0

    def __call__(self, topic: str, key: str, event: dict[str, Any]) -> None:
        if event["event_id"] in self.seen:
            self.duplicates += 1
            return
        self.seen[event["event_id"]] = event

    def facts(self, event_type: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in self.seen.values() if e["event_type"] == event_type]


class FifoQuota:
    """Stand-in queue-manager: one flavor, one nominal GPU quota, strict FIFO by creation time.
    Admits whole workloads (all pods) when they fit; releases when all their pods finished."""

    def __init__(self, actuate: Callable[[dict[str, Any]], Any], *, flavor: str, nominal_gpu: int,
                 queue_name: str, only: Callable[[dict[str, Any]], bool] = lambda w: True) -> None:
        self.actuate = actuate
        self.only = only
        self.flavor = flavor
        self.nominal_milli = nominal_gpu * 1000
        self.queue_name = queue_name
        self.pending: list[dict[str, Any]] = []
        self.admitted: dict[str, dict[str, Any]] = {}
        self.admission_order: list[str] = []
        self.finished_pods: dict[str, set[str]] = {}
        self.released: list[str] = []
        self.trail: list[tuple[str, str]] = []  # ("admit" | "release", workload name), in order
        self.used_milli = 0
        self.max_used_milli = 0
        self.tasks: list[asyncio.Task[Any]] = []

    @staticmethod
    def gpu_milli(w: dict[str, Any]) -> int:
        return sum(ps["count"] * ps["requests"].get("nvidia.com/gpu", 0) for ps in w["pod_sets"])

    def pods_of(self, w: dict[str, Any]) -> int:
        return sum(ps["count"] for ps in w["pod_sets"])

    async def on_event(self, topic: str, key: str, event: dict[str, Any]) -> None:
        p = event["payload"]
        if (event["event_type"] == "workload.submitted.v1" and p["queue_name"] == self.queue_name
                and self.only(p)):
            uid = p["uid"]
            if uid not in self.admitted and all(w["uid"] != uid for w in self.pending):
                self.pending.append(p)
                self.pending.sort(key=lambda w: (w["created_at"], w["name"]))
        elif event["event_type"] == "pod.finished.v1" and p.get("workload_uid") in self.admitted:
            uid = p["workload_uid"]
            done = self.finished_pods.setdefault(uid, set())
            done.add(p["uid"])
            if len(done) >= self.pods_of(self.admitted[uid]) and uid not in self.released:
                self.released.append(uid)
                self.trail.append(("release", self.admitted[uid]["name"]))
                self.used_milli -= self.gpu_milli(self.admitted[uid])
        self._admit_next()

    def _admit_next(self) -> None:
        while self.pending:
            w = self.pending[0]
            need = self.gpu_milli(w)
            if self.used_milli + need > self.nominal_milli:
                return  # StrictFIFO: the head blocks the rest
            self.pending.pop(0)
            self.used_milli += need
            self.max_used_milli = max(self.max_used_milli, self.used_milli)
            self.admitted[w["uid"]] = w
            self.admission_order.append(w["name"])
            self.trail.append(("admit", w["name"]))
            # As the queue-manager sends it: the flavor per pod set and resource, no nodeSelector
            # (the watcher resolves it from the ResourceFlavor).
            action = admit_action(w["uid"], w["namespace"], w["name"],
                                  flavors={ps["name"]: {"nvidia.com/gpu": self.flavor} for ps in w["pod_sets"]})
            self.tasks.append(asyncio.create_task(self.actuate(action)))


def _action(record: Any, *identity: Any) -> dict[str, Any]:
    return envelope_to_dict(make_envelope(record, producer="test", occurred_at="2026-11-29T10:00:00Z",
                                          identity=identity))


def admit_action(uid: str, namespace: str, name: str, **fields: Any) -> dict[str, Any]:
    return _action(ActionAdmit(workload_uid=uid, namespace=namespace, name=name, kind="Job", **fields),
                   uid, "admit", repr(sorted(fields.items())))


def evict_action(uid: str, namespace: str, name: str, *, reason: str, grace_period_s: int) -> dict[str, Any]:
    return _action(ActionEvict(workload_uid=uid, namespace=namespace, name=name, kind="Job", reason=reason,
                               grace_period_s=grace_period_s), uid, "evict")


def cleanup_action(uid: str, namespace: str, name: str, *, reason: str = "TTLExpired") -> dict[str, Any]:
    return _action(ActionCleanup(workload_uid=uid, namespace=namespace, name=name, kind="Job", reason=reason),
                   uid, "cleanup")


def gpu_job(name: str, namespace: str, *, pods: int, gpus_per_pod: int, queue: str = "team-ml",
            run_s: float = 3.0, suspend: bool = True, cost_center: str | None = None) -> dict[str, Any]:
    """A Job as users submit it to Kueue: queue-name label, created suspended. kwok runs its
    pods: ready after ~1s, complete after run_s (annotations read by kwok's pod stages). With
    `cost_center`, the label the policy library asks for."""
    run_ms = int(run_s * 1000)
    labels = {"kueue.x-k8s.io/queue-name": queue}
    if cost_center:
        labels["quartermaster.dev/cost-center"] = cost_center
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "suspend": suspend,
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {
                    "pod-create.stage.kwok.x-k8s.io/delay": "200ms",
                    "pod-create.stage.kwok.x-k8s.io/jitter-delay": "400ms",
                    "pod-ready.stage.kwok.x-k8s.io/delay": "500ms",
                    "pod-ready.stage.kwok.x-k8s.io/jitter-delay": "1s",
                    "pod-complete.stage.kwok.x-k8s.io/delay": f"{run_ms}ms",
                    "pod-complete.stage.kwok.x-k8s.io/jitter-delay": f"{run_ms + 1000}ms",
                    "pod-delete.stage.kwok.x-k8s.io/delay": "1s",
                }},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "train",
                        "image": "registry.example/pytorch-train:latest",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus_per_pod)},
                                      "requests": {"cpu": "4", "memory": "32Gi"}},
                    }],
                },
            },
        },
    }


VOLCANO_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "jobs.batch.volcano.sh"},
    "spec": {"group": "batch.volcano.sh", "scope": "Namespaced",
             "names": {"plural": "jobs", "singular": "job", "kind": "Job", "shortNames": ["vcjob"]},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}

WEBHOOK_CONFIGS = {
    "ValidatingWebhookConfiguration": ("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", False),
    "MutatingWebhookConfiguration": ("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", False),
}


def webhook_certs(out: Path, port: int) -> Path:
    """`qm webhook certs --url https://127.0.0.1:PORT` into `out` (tls.crt, tls.key, ...); the
    path of the webhook configurations it wrote."""
    made = subprocess.run([sys.executable, "-m", "services.cli.main", "webhook", "certs", str(out),
                           "--url", f"https://127.0.0.1:{port}"], cwd=REPO, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return out / "admission-webhook.yaml"


async def register_webhooks(kube: Kube, configs: Path) -> list[dict[str, Any]]:
    """Apply the webhook configurations in `configs`; the objects to `unregister_webhooks`."""
    KINDS.update(WEBHOOK_CONFIGS)
    registered = []
    for config in yaml.safe_load_all(configs.read_text()):
        if config:
            registered.append(await apply(kube, config))
    return registered


async def unregister_webhooks(kube: Kube, registered: list[dict[str, Any]]) -> None:
    """Delete them: they are cluster-wide, and the mutating one fails closed, so every later
    test's labelled Job would be refused once the webhook is gone."""
    for config in registered:
        with contextlib.suppress(KubeError):
            await kube.request("DELETE", obj_path(config, named=True))


def volcano_pod(vcjob: dict[str, Any], i: int) -> dict[str, Any]:
    """What Volcano's job controller makes: pod `i` of the Job's first task, from its stored
    template (the webhook's labels included), labelled with the Job's name and owned by it."""
    meta, template = vcjob["metadata"], vcjob["spec"]["tasks"][0]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
            "metadata": {"name": f"{meta['name']}-worker-{i}", "namespace": meta["namespace"],
                         "annotations": template["metadata"].get("annotations") or {},
                         "labels": {**template["metadata"]["labels"], "volcano.sh/job-name": meta["name"],
                                    "volcano.sh/task-spec": vcjob["spec"]["tasks"][0]["name"]},
                         "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                                              "name": meta["name"], "uid": meta["uid"], "controller": True}]}}
