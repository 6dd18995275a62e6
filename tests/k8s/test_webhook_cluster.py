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

import contextlib
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from k8s_harness import KINDS, REPO, apply, gpu_job

from services.admission.webhook import make_app, serve
from services.policy import PolicySet
from services.policy.live import StaticLiveState
from services.watcher.kube import Kube, KubeError, resource_path

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NS = "ml-team"
WEBHOOK_CONFIGS = {
    "ValidatingWebhookConfiguration": ("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", False),
    "MutatingWebhookConfiguration": ("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", False),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def team_job(name: str, **kw) -> dict:
    """A Job as the policy library wants it: its queue and its cost center named."""
    job = gpu_job(name, NS, **kw)
    job["metadata"]["labels"]["quartermaster.dev/cost-center"] = "cc-ml"
    return job


def job_path(name: str) -> str:
    return resource_path("batch", "v1", "jobs", NS, name)


@pytest.fixture
async def webhook(admin: Kube, tmp_path: Path):
    """The webhook on a free loopback port, registered with the API server by the configurations
    `qm webhook certs` wrote. Yields the registered configurations."""
    port = free_port()
    out = tmp_path / "webhook"
    made = subprocess.run([sys.executable, "-m", "services.cli.main", "webhook", "certs", str(out),
                           "--url", f"https://127.0.0.1:{port}"], cwd=REPO, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    namespace = await admin.get(resource_path("", "v1", "namespaces", None, NS))
    live = StaticLiveState.build(  # the replica's view: ml-team has 28 of its 32 GPUs in use
        namespaces=[namespace],
        usages=[{"namespace": NS, "reserved": {}, "running": {"a100-flavor": {"nvidia.com/gpu": 28_000}},
                 "total": {"nvidia.com/gpu": 28_000}}])
    policies = PolicySet.load(REPO / "policies" / "library")
    runner = await serve(make_app(lambda: policies, live), "127.0.0.1", port, out / "tls.crt", out / "tls.key")
    configs = [d for d in yaml.safe_load_all((out / "admission-webhook.yaml").read_text()) if d]
    KINDS.update(WEBHOOK_CONFIGS)
    try:
        for config in configs:
            await apply(admin, config)
        yield configs
    finally:
        for config in configs:
            group, version, plural, _ = WEBHOOK_CONFIGS[config["kind"]]
            with contextlib.suppress(KubeError):
                await admin.request("DELETE", resource_path(group, version, plural, None, config["metadata"]["name"]))
        await runner.cleanup()


async def test_the_api_server_calls_our_webhooks_and_applies_their_answers(admin: Kube, webhook):
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
    # any other change of the Job still goes through (the admit's unsuspend, a label of its own)
    await admin.request("PATCH", job_path(name), body={"metadata": {"labels": {"touched": "yes"}}},
                        content_type="application/merge-patch+json")
    await admin.request("DELETE", job_path(name), query={"propagationPolicy": "Background"})
