"""The webhook over real HTTPS (self-signed cert) with real AdmissionReview v1 JSON."""

import asyncio
import base64
import json
import ssl

import aiohttp
import pytest

from services.admission.webhook import make_app, mutation_patch, queue_change_refusal, serve
from services.demo.stack import free_base_port
from services.policy import PolicySet
from services.policy.live import StaticLiveState
from services.policy.loader import Document

TEMPLATE = """
apiVersion: templates.gatekeeper.sh/v1
kind: ConstraintTemplate
metadata: {name: k8sbanexcessgpuquota}
spec:
  crd: {spec: {names: {kind: K8sBanExcessGpuQuota}}}
  targets:
  - target: admission.k8s.gatekeeper.sh
    code:
    - engine: K8sNativeValidation
      source:
        validations:
        - expression: 'usage.gpus + workload.gpus <= variables.params.maxGpu'
          messageExpression: '"namespace " + request.namespace + " used " + string(usage.gpus) + " GPU, requesting " + string(workload.gpus) + ", max is " + string(variables.params.maxGpu)'
"""


def constraint(name, action, namespaces):
    return f"""
apiVersion: constraints.gatekeeper.sh/v1beta1
kind: K8sBanExcessGpuQuota
metadata: {{name: {name}}}
spec:
  enforcementAction: {action}
  match:
    kinds: [{{apiGroups: ["batch"], kinds: ["Job"]}}]
    namespaces: {json.dumps(namespaces)}
  parameters: {{maxGpu: 32}}
"""


def load(*texts):
    import yaml

    docs = [Document("t.yaml", i, d) for i, t in enumerate(texts) for d in yaml.safe_load_all(t) if d]
    return PolicySet.from_documents(docs)


POLICIES = load(
    TEMPLATE,
    constraint("max-gpu-deny", "deny", ["ml-team"]),
    constraint("max-gpu-warn", "warn", ["staging"]),
    constraint("max-gpu-dryrun", "dryrun", ["canary"]),
)


def usage(ns, gpus):
    return {"namespace": ns, "reserved": {}, "running": {"a100-flavor": {"nvidia.com/gpu": gpus * 1000}},
            "total": {"nvidia.com/gpu": gpus * 1000}}  # fmt: skip


LIVE = StaticLiveState.build(
    namespaces=[
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in ("ml-team", "staging", "canary")
    ],
    usages=[usage("ml-team", 28), usage("staging", 28), usage("canary", 28)],
)


def job(ns, gpus_per_pod=4, parallelism=2, queue="team-ml", suspend=None):
    spec = {"parallelism": parallelism, "template": {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "trainer", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": str(gpus_per_pod)}}}]}}}  # fmt: skip
    if suspend is not None:
        spec["suspend"] = suspend
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": ns, "labels": labels},
            "spec": spec}  # fmt: skip


def review(obj, operation="CREATE", uid="705ab4f5-6393-11e8-b7cc-42010a800002"):
    """An AdmissionReview v1 as the API server sends it."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
            "requestKind": {"group": "batch", "version": "v1", "kind": "Job"},
            "requestResource": {"group": "batch", "version": "v1", "resource": "jobs"},
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"]["namespace"],
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


@pytest.fixture
async def webhook(tls_files):
    cert, key = tls_files
    port = free_base_port(1)
    app = make_app(lambda: POLICIES, LIVE)
    runner = await serve(app, "127.0.0.1", port, cert, key)
    ctx = ssl.create_default_context(cafile=str(cert))  # verifies the server cert and hostname
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        yield session, f"https://127.0.0.1:{port}"
    await runner.cleanup()


async def post(session, url, body):
    async with session.post(url, data=json.dumps(body), headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


@pytest.mark.parametrize(
    "namespace, allowed, status_message, warnings",
    [
        ("ml-team", False, "[max-gpu-deny] namespace ml-team used 28 GPU, requesting 8, max is 32", None),
        ("staging", True, None, ["[max-gpu-warn] namespace staging used 28 GPU, requesting 8, max is 32"]),
        ("canary", True, None, None),  # dryrun: recorded only
        ("research", True, None, None),  # no constraint matches
    ],
)
async def test_validate_deny_warn_dryrun_like_gatekeeper(
    webhook, namespace, allowed, status_message, warnings
):
    session, base = webhook
    out = await post(session, f"{base}/validate", review(job(namespace)))
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    resp = out["response"]
    assert resp["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert resp["allowed"] is allowed
    if status_message:
        assert resp["status"] == {"code": 403, "reason": "Forbidden", "message": status_message}
    else:
        assert "status" not in resp
    assert resp.get("warnings") == warnings


async def test_dryrun_is_recorded_in_metrics(webhook):
    session, base = webhook
    await post(session, f"{base}/validate", review(job("canary")))
    async with session.get(f"{base}/metrics") as r:
        text = await r.text()
    assert 'qm_admission_violations_total{enforcement_action="dryrun",policy="max-gpu-dryrun"} 1.0' in text
    assert 'qm_admission_requests_total{endpoint="validate",result="allowed"}' in text
    assert "qm_admission_request_duration_seconds_bucket" in text


@pytest.mark.parametrize(
    "obj, operation, patch",
    [
        (job("ml-team"), "CREATE", [{"op": "add", "path": "/spec/suspend", "value": True}]),
        (job("ml-team", suspend=False), "CREATE", [{"op": "add", "path": "/spec/suspend", "value": True}]),
        (job("ml-team", suspend=True), "CREATE", None),
        (job("ml-team", queue=None), "CREATE", None),
        (job("ml-team"), "UPDATE", None),
    ],
)
async def test_mutate_suspends_queued_jobs_on_create(webhook, obj, operation, patch):
    session, base = webhook
    resp = (await post(session, f"{base}/mutate", review(obj, operation)))["response"]
    assert resp["allowed"] is True
    if patch is None:
        assert "patch" not in resp
    else:
        assert resp["patchType"] == "JSONPatch"
        assert json.loads(base64.b64decode(resp["patch"])) == patch


def update(old, new):
    r = review(new, "UPDATE")
    r["request"]["oldObject"] = old
    return r


@pytest.mark.parametrize(
    "old, new, refused",
    [
        (job("ml-team", suspend=False), job("ml-team", suspend=False, queue=None), "cannot be removed once set"),
        (job("ml-team", suspend=False), job("ml-team", suspend=False, queue="other"),
         "cannot be changed to 'other' once set"),
        (job("ml-team", suspend=True), job("ml-team", suspend=True, queue="other"), "cannot be changed"),  # Kueue allows
        (job("ml-team", suspend=False, queue=None), job("ml-team", suspend=False), "cannot be added while the Job runs"),
        (job("ml-team", suspend=True, queue=None), job("ml-team", suspend=True), None),  # a first submission
        (job("ml-team", suspend=True), job("ml-team", suspend=False), None),  # the queue-manager's admit
        (job("ml-team", queue=None), job("ml-team", queue=None), None),
    ],
)
def test_a_jobs_queue_label_is_fixed_once_set(old, new, refused):
    """ADR 0067: the watcher keeps a Job in the queue it was submitted to; the webhook says so."""
    message = queue_change_refusal(update(old, new)["request"])
    if refused is None:
        assert message is None
    else:
        assert refused in message and "Job ml-team/train" in message
    assert queue_change_refusal(review(new, "CREATE")["request"]) is None


def test_a_volcano_jobs_queue_label_cannot_be_added_either():
    """A Volcano Job has no suspend: it always runs, so the label can be neither added nor changed."""
    vc = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "vc", "namespace": "ml-team"}}
    labelled = {**vc, "metadata": {**vc["metadata"], "labels": {"kueue.x-k8s.io/queue-name": "team-ml"}}}
    req = {"operation": "UPDATE", "kind": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"},
           "namespace": "ml-team", "object": labelled, "oldObject": vc}
    assert "Volcano Job ml-team/vc" in queue_change_refusal(req) and "cannot be added" in queue_change_refusal(req)
    assert "cannot be removed" in queue_change_refusal({**req, "object": vc, "oldObject": labelled})


async def test_a_queue_label_change_is_refused_over_https_even_before_policies_load(tls_files):
    cert, key = tls_files
    port = free_base_port(1)
    runner = await serve(make_app(lambda: None, LIVE), "127.0.0.1", port, cert, key)
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            body = update(job("ml-team", suspend=False), job("ml-team", suspend=False, queue=None))
            resp = (await post(session, f"https://127.0.0.1:{port}/validate", body))["response"]
    finally:
        await runner.cleanup()
    assert resp["allowed"] is False and resp["status"]["code"] == 422
    assert "delete the Job and create it again" in resp["status"]["message"]


QUEUED = {"kueue.x-k8s.io/queue-name": "team-ml"}


def create(group, kind, obj):
    return {"operation": "CREATE", "kind": {"group": group, "version": "v1", "kind": kind}, "object": obj}


def vcjob(*templates):
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "vc", "namespace": "ml-team", "labels": dict(QUEUED)},
            "spec": {"tasks": [{"name": f"t{i}", "replicas": 1, **({} if t is None else {"template": t})}
                               for i, t in enumerate(templates)]}}


def test_a_volcano_jobs_task_templates_get_its_queue_label():
    """ADR 0068: so that Volcano's pods carry the label, and the webhook can hold them."""
    job = vcjob(None, {"spec": {}}, {"metadata": {}}, {"metadata": {"labels": {"app": "x"}}},
                {"metadata": {"labels": dict(QUEUED)}})
    assert mutation_patch(create("batch.volcano.sh", "Job", job)) == [
        {"op": "add", "path": "/spec/tasks/0/template", "value": {"metadata": {"labels": QUEUED}}},
        {"op": "add", "path": "/spec/tasks/1/template/metadata", "value": {"labels": QUEUED}},
        {"op": "add", "path": "/spec/tasks/2/template/metadata/labels", "value": QUEUED},
        {"op": "add", "path": "/spec/tasks/3/template/metadata/labels/kueue.x-k8s.io~1queue-name", "value": "team-ml"},
    ]
    unqueued = vcjob(None)
    del unqueued["metadata"]["labels"]
    assert mutation_patch(create("batch.volcano.sh", "Job", unqueued)) == []


def pod(owner_api="batch.volcano.sh/v1alpha1", labels=QUEUED, gates=None):
    spec = {"containers": [{"name": "c", "image": "x"}]}
    if gates is not None:
        spec["schedulingGates"] = gates
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": "vc-t0-0", "namespace": "ml-team", "labels": dict(labels),
                         "ownerReferences": [{"apiVersion": owner_api, "kind": "Job", "name": "vc", "uid": "u",
                                              "controller": True}]}}


@pytest.mark.parametrize("obj, patch", [
    (pod(), [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "quartermaster.dev/admission"}]}]),
    (pod(gates=[{"name": "other"}]),
     [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "quartermaster.dev/admission"}}]),
    (pod(gates=[{"name": "quartermaster.dev/admission"}]), []),
    (pod(owner_api="batch/v1"), []),  # a batch/v1 Job's pod: the Job's suspend holds it
    (pod(labels={}), []),  # a Volcano Job that is not ours
])
def test_a_queued_volcano_jobs_pods_are_held_by_the_admission_gate(obj, patch):
    assert mutation_patch(create("", "Pod", obj)) == patch
    assert mutation_patch({**create("", "Pod", obj), "operation": "UPDATE"}) == []


async def test_health_ready_and_bad_requests(webhook):
    session, base = webhook
    async with session.get(f"{base}/healthz") as r:
        assert r.status == 200
    async with session.get(f"{base}/readyz") as r:
        assert r.status == 200 and "policies=3" in await r.text()
    async with session.post(f"{base}/validate", data=b"not json") as r:
        assert r.status == 400
    async with session.post(f"{base}/validate", data=b'{"kind": "AdmissionReview"}') as r:
        assert r.status == 400


async def test_plain_http_is_refused_on_the_tls_port(webhook):
    _session, base = webhook
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            async with plain.get(base.replace("https", "http") + "/healthz") as r:
                await r.read()


async def test_not_ready_without_policy_set(tls_files):
    from aiohttp.test_utils import TestClient, TestServer

    app = make_app(lambda: None, LIVE)
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/readyz")
        assert r.status == 503
        r = await client.post("/validate", data=json.dumps(review(job("ml-team"))))
        assert r.status == 503


CLUSTER_POLICY = """
apiVersion: quartermaster.dev/v1alpha1
kind: AdmissionPolicy
metadata: {name: busy-cluster}
spec:
  enforcementAction: deny
  matchConstraints:
    kinds: [{apiGroups: ["batch"], kinds: ["Job"]}]
    operations: ["CREATE"]
  validations:
  - expression: 'cluster.gpuUtilization < 0.9'
    message: the cluster is busy
"""


async def test_a_policy_that_reads_the_cluster_sees_its_live_signals(tls_files):
    """A policy reading `cluster` judges by the live state's signals."""
    cert, key = tls_files
    port = free_base_port(1)
    busy = StaticLiveState.build(namespaces=LIVE.namespaces.values(), cluster={"gpuUtilization": 0.95})
    quiet = StaticLiveState.build(namespaces=LIVE.namespaces.values(), cluster={"gpuUtilization": 0.5})
    answers = []
    for live in (busy, quiet):
        runner = await serve(make_app(lambda: load(CLUSTER_POLICY), live), "127.0.0.1", port, cert, key)
        try:
            ctx = ssl.create_default_context(cafile=str(cert))
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
                answers.append((await post(session, f"https://127.0.0.1:{port}/validate", review(job("ml-team"))))
                               ["response"]["allowed"])
        finally:
            await runner.cleanup()
    assert answers == [False, True]


SELECTOR_POLICY = """
apiVersion: quartermaster.dev/v1alpha1
kind: AdmissionPolicy
metadata: {name: ml-gpu-cap}
spec:
  enforcementAction: deny
  matchConstraints:
    kinds: [{apiGroups: ["batch"], kinds: ["Job"]}]
    namespaceSelector: {matchLabels: {team: ml}}
  validations:
  - expression: 'workload.gpus <= 8'
    message: ml namespaces run at most 8 GPUs per job
"""


async def test_a_job_in_a_namespace_reported_a_moment_later_is_judged_with_it(monkeypatch):
    """ADR 0040: a Namespace and a Job applied together. The API server admits the Job only in a
    namespace that exists, but the watcher's report of it reaches the replica a moment after the
    review: the webhook waits for it, where the namespaceSelector could not match and refused.
    A namespace that is never reported is refused after the wait, naming what to check."""
    from aiohttp.test_utils import TestClient, TestServer

    from services.adapters.live_replica import LiveReplica
    from services.admission import webhook
    from services.contracts.events import NamespaceLabels

    monkeypatch.setattr(webhook, "NEW_NAMESPACE_WAIT_S", 1.0)
    replica = LiveReplica("127.0.0.1:1", {})  # never run: the test applies what the watcher would report

    async def the_watcher_reports(namespace: str, labels: dict) -> None:
        await asyncio.sleep(0.2)
        replica.apply(NamespaceLabels(namespace=namespace, labels=labels))

    async with TestClient(TestServer(make_app(lambda: load(SELECTOR_POLICY), replica))) as client:
        async def allowed(namespace: str) -> dict:
            r = await client.post("/validate", data=json.dumps(review(job(namespace, gpus_per_pod=8, parallelism=4))))
            return (await r.json())["response"]

        reporting = asyncio.create_task(the_watcher_reports("fresh-team", {"team": "fresh"}))
        fresh = await allowed("fresh-team")
        await reporting
        reporting = asyncio.create_task(the_watcher_reports("fresh-ml", {"team": "ml"}))
        fresh_ml = await allowed("fresh-ml")
        await reporting
        never = await allowed("never-reported")
    assert fresh["allowed"] is True  # judged with its labels: the selector does not match
    assert fresh_ml["allowed"] is False and "at most 8 GPUs" in fresh_ml["status"]["message"]
    assert never["allowed"] is False
    assert "Namespace 'never-reported', which is not known" in never["status"]["message"]
    assert "is the watcher running" in never["status"]["message"]


@pytest.mark.parametrize("offered, allowed", [(("a100", "h100"), True), (("a100",), False)])
async def test_a_queued_job_is_judged_on_the_flavors_its_queue_could_give_it(offered, allowed):
    """ADR 0070 at `kubectl apply`: dev-team is not approved for A100s and its Job names no GPU
    class. Its queue of A100s and H100s takes it with a warning that A100s will not be assigned;
    a queue of A100s alone is a refusal at once, in the policy's words and saying where."""
    from pathlib import Path

    from aiohttp.test_utils import TestClient, TestServer

    from services.core.quota import load_objects

    v1 = "kueue.x-k8s.io/v1beta1"
    docs = [{"apiVersion": v1, "kind": "ResourceFlavor", "metadata": {"name": f"{f}-flavor"},
             "spec": {"nodeLabels": {"gpu.nvidia.com/class": f}}} for f in ("a100", "h100")]
    docs += [{"apiVersion": v1, "kind": "ClusterQueue", "metadata": {"name": "gpu-queue"}, "spec": {
        "namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": f"{f}-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 16}]} for f in offered]}]}},
        {"apiVersion": v1, "kind": "LocalQueue", "metadata": {"name": "team-dev", "namespace": "dev-team"},
         "spec": {"clusterQueue": "gpu-queue"}}]
    objects = load_objects(("test", d) for d in docs)
    library = PolicySet.load(Path(__file__).resolve().parents[3] / "policies" / "library")
    live = StaticLiveState.build(namespaces=[{"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "dev-team", "labels": {"kubernetes.io/metadata.name": "dev-team"}}}])
    unpinned = job("dev-team", queue="team-dev")
    unpinned["metadata"]["labels"]["quartermaster.dev/cost-center"] = "cc-dev"  # as the library requires
    pinned_h100 = json.loads(json.dumps(unpinned))
    pinned_h100["spec"]["template"]["spec"]["nodeSelector"] = {"gpu.nvidia.com/class": "h100"}
    async with TestClient(TestServer(make_app(lambda: library, live, queues=lambda: objects))) as client:
        async def answer(obj) -> dict:
            r = await client.post("/validate", data=json.dumps(review(obj)))
            return (await r.json())["response"]

        unpinned_answer, h100_answer = await answer(unpinned), await answer(pinned_h100)
    assert unpinned_answer["allowed"] is allowed, unpinned_answer
    if allowed:
        [warning] = unpinned_answer["warnings"]
        assert warning.startswith("flavor a100-flavor of ClusterQueue gpu-queue will not be assigned: "
                                  "[a100-approved-projects] namespace dev-team is not approved for a100")
    else:
        message = unpinned_answer["status"]["message"]
        assert message.startswith("[a100-approved-projects] namespace dev-team is not approved for a100")
        assert "ClusterQueue gpu-queue offers nvidia.com/gpu to pod set main only on a100-flavor" in message
    # a Job pinned to H100s is never offered A100s: nothing to warn of or refuse, whatever the queue
    assert h100_answer["allowed"] is True and "warnings" not in h100_answer
