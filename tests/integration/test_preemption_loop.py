"""The whole preemption loop on the real broker: the queue-manager asks, the preemption
service chooses by Kueue's rules filtered by PreemptionPolicy, the queue-manager evicts,
requeues the victims and gives the freed quota to the preemptor — and to nobody else."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
import yaml

from services.adapters.bus import Publisher, read_envelopes
from services.adapters.cohort_stream import cohort_stream_outputs
from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import make_envelope
from services.contracts.events import PodRunning, WorkloadValidated
from tests.integration.processes import start_worker
from tests.integration.test_worker_recovery import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
SEED = Path(__file__).resolve().parents[2] / "examples" / "seed"


def config(tmp_path: Path) -> Path:
    directory = tmp_path / "config"
    directory.mkdir()
    docs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"},
         "spec": {"nodeLabels": {"gpu.nvidia.com/class": "a100"}}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "gpu-queue"},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                      {"name": "a100-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 32}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
         "metadata": {"name": "team-ml", "namespace": "ml-team"}, "spec": {"clusterQueue": "gpu-queue"}},
    ]
    (directory / "kueue.yaml").write_text(yaml.safe_dump_all(docs))
    shutil.copy(SEED / "preemption-policy.yaml", directory / "preemption-policy.yaml")
    return directory


def validated(name: str, gpus: int, priority: int, cls: str, at: str):
    return make_envelope(WorkloadValidated(
        uid=f"uid-{name}", namespace="ml-team", name=name, queue_name="team-ml", cluster_queue="gpu-queue",
        priority=priority, created_at=at, labels={"quartermaster.dev/class": cls},
        pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}]),
        producer="test", occurred_at=at)


def running(name: str, at: str):
    return make_envelope(PodRunning(uid=f"pod-{name}", workload_uid=f"uid-{name}", namespace="ml-team",
                                    name=f"{name}-0", queue_name="team-ml", workload_name=name, started_at=at),
                         producer="test", occurred_at=at)


async def trail(bootstrap, prefix):
    return [e async for _, e in read_envelopes(bootstrap, prefix + "qm.workloads") if not isinstance(e, Exception)]


async def test_inference_takes_batch_quota_and_a_training_only_arrival_stays_pending(kafka_bootstrap, topic_prefix,
                                                                                    tmp_path):
    directory = config(tmp_path)
    env = {"QM_TOPIC_PREFIX": topic_prefix, "QM_STORE": "memory://", "QM_DATA_DIR": str(tmp_path),
           "QM_CONFIG_DIR": str(directory)}
    qm = start_worker("services.queue_manager", {**env, "QM_APP_ID_SUFFIX": f"-{uuid.uuid4().hex[:8]}"},
                      tmp_path / "qm.log")
    preemption = start_worker("services.preemption", {**env, "QM_APP_ID_SUFFIX": f"-{uuid.uuid4().hex[:8]}"},
                              tmp_path / "preemption.log")
    try:
        qm.wait_ready()
        preemption.wait_ready()
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            # A full queue: a 16-GPU training run and two 8-GPU batch jobs, running for an hour.
            for name, gpus, cls in [("llm-ft", 16, "training"), ("batch-a", 8, "batch"), ("batch-b", 8, "batch")]:
                await bus.publish("qm.workloads", "gpu-queue", validated(name, gpus, 100, cls, "2026-11-29T09:00:00Z"))
            await bus.flush()

            async def three_reserved():
                return sum(e.event_type == "workload.quota_reserved.v1"
                           for e in await trail(kafka_bootstrap, topic_prefix)) == 3

            await wait_for(three_reserved, 60, "the full queue")
            for name in ("llm-ft", "batch-a", "batch-b"):  # as admission forwards them from qm.cluster
                for forwarded in cohort_stream_outputs(running(name, "2026-11-29T09:01:00Z"), KueueConfig.load(directory)):
                    await bus.publish(forwarded.topic, forwarded.key, forwarded.envelope)
            await bus.flush()

            async def all_running():
                usage = [e async for _, e in read_envelopes(kafka_bootstrap, topic_prefix + "qm.usage")]
                return usage and usage[-1].payload.running.get("a100-flavor", {}).get("nvidia.com/gpu") == 32000

            await wait_for(all_running, 60, "everything running")
            # High-priority inference for 8 GPUs, and a low-priority batch job right behind it.
            await bus.publish("qm.workloads", "gpu-queue", validated("chat", 8, 1000, "inference", "2026-11-29T10:00:00Z"))
            await bus.publish("qm.workloads", "gpu-queue", validated("late-batch", 8, 10, "batch", "2026-11-29T10:00:01Z"))
            await bus.flush()

            async def chat_reserved():
                return any(e.event_type == "workload.quota_reserved.v1" and e.payload.name == "chat"
                           for e in await trail(kafka_bootstrap, topic_prefix))

            await wait_for(chat_reserved, 90, "the inference job to get the freed quota")
            # A second inference needing 24 GPUs could only run by preempting the training run.
            await bus.publish("qm.workloads", "gpu-queue", validated("chat-xl", 24, 1000, "inference", "2026-11-29T10:02:00Z"))
            await bus.flush()

            async def blocked():
                return any(e.event_type == "workload.pending.v1" and e.payload.name == "chat-xl"
                           and e.payload.reason == "PreemptionBlocked" for e in await trail(kafka_bootstrap, topic_prefix))

            await wait_for(blocked, 90, "the training-only arrival to be blocked by policy")
        events = await trail(kafka_bootstrap, topic_prefix)
        actions = [e async for _, e in read_envelopes(kafka_bootstrap, topic_prefix + "qm.actions")]
    finally:
        qm.stop()
        preemption.stop()

    evicted = [e.payload for e in events if e.event_type == "workload.evicted.v1"]
    assert len(evicted) == 1 and evicted[0].name in {"batch-a", "batch-b"}
    assert evicted[0].preemptor == "ml-team/chat"
    evictions = [a.payload for a in actions if a.event_type == "action.evict.v1"]
    assert [(a.name, a.grace_period_s) for a in evictions] == [(evicted[0].name, 120)]  # batch gets 2 minutes
    requeued = [e.payload for e in events if e.event_type == "workload.requeued.v1"]
    assert [(r.name, r.reason) for r in requeued] == [(evicted[0].name, "Preempted")]
    reserved_after = [e.payload.name for e in events if e.event_type == "workload.quota_reserved.v1"][3:]
    assert reserved_after == ["chat"]  # the freed 8 GPUs went to the preemptor, not to late-batch
    assert "llm-ft" not in {e.payload.name for e in events if e.event_type in ("workload.evicted.v1",
                                                                               "workload.released.v1")}
    message = next(e.payload.message for e in events if e.event_type == "workload.pending.v1"
                   and e.payload.name == "chat-xl" and e.payload.reason == "PreemptionBlocked")
    assert message.startswith("would need to preempt training job ml-team/llm-ft, which is not preemptible")
