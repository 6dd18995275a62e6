"""The watcher process (python -m services.watcher) between a real API server and the real
broker: cluster facts land on qm.cluster, an Admit on qm.actions unsuspends the Job, and each
outcome comes back as an event."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from k8s_harness import ClusterInfo, apply, gpu_job, wait_until

from services.adapters.bus import Publisher, read_envelopes
from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import make_envelope
from services.contracts.events import ActionAdmit

pytestmark = [pytest.mark.k8s, pytest.mark.kafka]
REPO = Path(__file__).resolve().parents[2]


async def events(bootstrap: str, topic: str) -> list:
    return [e async for _, e in read_envelopes(bootstrap, topic) if not isinstance(e, Exception)]


async def test_watcher_process_publishes_and_actuates_through_kafka(cluster: ClusterInfo, admin, kafka_bootstrap,
                                                                     topic_prefix, tmp_path):
    token = tmp_path / "token"
    token.write_text(cluster.watcher_token)
    env = {**os.environ, "PYTHONPATH": str(REPO), "QM_K8S_SERVER": cluster.server, "QM_K8S_TOKEN_FILE": str(token),
           "QM_K8S_CA": cluster.ca_file, "QM_KAFKA_BOOTSTRAP": kafka_bootstrap, "QM_TOPIC_PREFIX": topic_prefix,
           "QM_APP_ID_SUFFIX": f"-{uuid.uuid4().hex[:8]}", "QM_CONFIG_DIR": str(REPO / "examples" / "seed"),
           "QM_CLOCK_INTERVAL_S": "1"}
    log = open(tmp_path / "watcher.log", "wb")  # noqa: SIM115
    watcher = subprocess.Popen([sys.executable, "-m", "services.watcher"], cwd=REPO, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    name = f"kafka-{uuid.uuid4().hex[:6]}"
    try:
        await apply(admin, gpu_job(name, "ml-team", pods=1, gpus_per_pod=4, run_s=2))

        async def submitted():
            found = [e for e in await events(kafka_bootstrap, topic_prefix + "qm.cluster")
                     if e.event_type == "workload.submitted.v1" and e.payload.name == name]
            return found[0] if found else None

        submission = await wait_until(submitted, 60, what="the Job's submission on qm.cluster")
        assert submission.payload.queue_name == "team-ml"
        assert submission.payload.pod_sets[0]["requests"]["nvidia.com/gpu"] == 4000

        async def ticked():  # one a second; the first may follow the submission
            return [e for e in await events(kafka_bootstrap, topic_prefix + "qm.clock")]

        await wait_until(ticked, 30, what="the watcher's clock ticks on qm.clock")

        admit = make_envelope(ActionAdmit(workload_uid=submission.payload.uid, namespace="ml-team", name=name,
                                          kind="Job", node_selector={"gpu.nvidia.com/class": "a100"},
                                          flavors={"main": {"nvidia.com/gpu": "a100-flavor"}}),
                              producer="test", occurred_at="2026-11-29T10:00:00Z")
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            await bus.publish("qm.actions", submission.payload.uid, admit)
            await bus.flush()

        config = KueueConfig.load(REPO / "examples" / "seed")
        key = config.routing_key("ml-team", "team-ml")

        async def facts(event_type: str) -> list:
            """The Job's facts of that type: on its cohort's stream, sent there by the watcher itself
            (ADR 0075), and never on qm.cluster."""
            def ours(e) -> bool:  # the watcher sees the other tests' pods too
                return e.event_type == event_type and submission.payload.uid in (
                    getattr(e.payload, "workload_uid", None), e.payload.uid)

            on_cluster = [e for e in await events(kafka_bootstrap, topic_prefix + "qm.cluster") if ours(e)]
            assert on_cluster == [], on_cluster
            return [(r.key, e) async for r, e in read_envelopes(kafka_bootstrap, topic_prefix + "qm.workloads")
                    if not isinstance(e, Exception) and ours(e)]

        async def outcome_and_running():
            trail = await events(kafka_bootstrap, topic_prefix + "qm.cluster")
            outcomes = [e.payload for e in trail if e.event_type == "action.outcome.v1"
                        and e.payload.action_event_id == admit.event_id]
            running = await facts("pod.running.v1")
            return outcomes and running and (outcomes, running)

        outcomes, running = await wait_until(outcome_and_running, 90, what="the admit's outcome and a running pod")
        assert outcomes[0].outcome == "applied"
        job = await admin.get(f"/apis/batch/v1/namespaces/ml-team/jobs/{name}")
        assert job["spec"]["suspend"] is False
        assert job["spec"]["template"]["spec"]["nodeSelector"] == {"gpu.nvidia.com/class": "a100"}

        # The pods do not carry the Job's queue-name label; their facts carry the Job's queue, so
        # they reach the queue-manager's cohort (ADR 0064): the watcher puts them on its stream
        # itself, with the workload.running admission used to add (ADR 0075). When the Job
        # completes, its finish is a fact too: the queue-manager releases its quota on it.
        assert "kueue.x-k8s.io/queue-name" not in ((job["spec"]["template"].get("metadata") or {}).get("labels") or {})
        (pod_key, pod), = running
        assert pod_key == key.encode() and pod.payload.queue_name == "team-ml" and pod.producer == "watcher"
        assert [k for k, _ in await facts("workload.running.v1")] == [key.encode()]

        (finish_key, finish), = await wait_until(lambda: facts("workload.finished.v1"), 90,
                                                 what="the Job's workload.finished on its cohort's stream")
        assert finish_key == key.encode()
        assert finish.payload.succeeded is True and finish.payload.queue_name == "team-ml"
    finally:
        watcher.terminate()
        watcher.wait(30)
    assert watcher.returncode in (0, -15), (tmp_path / "watcher.log").read_text()[-3000:]
