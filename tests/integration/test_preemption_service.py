"""The preemption service on the real broker, with the queue-manager's side published by hand:
a cohort full of batch and training work, a high-priority inference arrival, a second arrival
only a training victim could satisfy, and a thrash stream of alternating high/low arrivals."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
import yaml

from services.adapters.bus import Publisher, read_envelopes
from tests.integration.processes import start_worker
from tests.integration.test_worker_recovery import wait_for
from tests.unit.preemption.test_preemption_fold import COHORT, FULL, admitted, kueue_docs, needed

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
SEED = Path(__file__).resolve().parents[2] / "examples" / "seed"


def config_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "kueue.yaml").write_text(yaml.safe_dump_all(kueue_docs()))
    shutil.copy(SEED / "preemption-policy.yaml", directory / "preemption-policy.yaml")
    return directory


def start(prefix, tmp_path):
    env = {"QM_TOPIC_PREFIX": prefix, "QM_APP_ID_SUFFIX": f"-{uuid.uuid4().hex[:8]}", "QM_STORE": "memory://",
           "QM_DATA_DIR": str(tmp_path), "QM_CONFIG_DIR": str(config_dir(tmp_path))}
    worker = start_worker("services.preemption", env, tmp_path / "preemption.log")
    worker.wait_ready()
    return worker


async def events_on(bootstrap, topic, event_type):
    return [e async for _, e in read_envelopes(bootstrap, topic)
            if not isinstance(e, Exception) and e.event_type == event_type]


async def answers(bootstrap, prefix, count, what):
    async def enough():
        return len(await events_on(bootstrap, prefix + "qm.preemption", "preemption.victims_selected.v1")) >= count

    await wait_for(enough, 90, what)
    return await events_on(bootstrap, prefix + "qm.preemption", "preemption.victims_selected.v1")


async def test_inference_evicts_only_batch_and_a_training_only_arrival_stays_blocked(kafka_bootstrap, topic_prefix,
                                                                                      tmp_path):
    worker = start(topic_prefix, tmp_path)
    try:
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            # the request alone carries what the decision needs (each workload's reservation and start)
            first = needed("serving-team", "chat", "inference", 8, 1000, FULL)
            await bus.publish("qm.preemption", COHORT, first)
            await bus.publish("qm.preemption", COHORT, first)  # redelivered: answered once
            await bus.flush()
            [selected] = await answers(kafka_bootstrap, topic_prefix, 1, "victims for the inference workload")
            # The queue-manager releases b2/b3, requeues them and admits chat in the same step.
            after = [FULL[0], FULL[1], admitted("serving-team", "chat", "inference", 8, prio=1000, reserved=1,
                                                running=1.5)]
            await bus.publish("qm.preemption", COHORT, needed("serving-team", "chat-2", "inference", 16, 1000, after,
                                                              minute=2))
            await bus.flush()
            both = await answers(kafka_bootstrap, topic_prefix, 2, "the second answer")
    finally:
        worker.stop()

    assert selected.payload.preemptor_uid == "uid-chat" and selected.payload.blocked_message is None
    assert selected.causation_id == first.event_id
    assert {v["name"] for v in selected.payload.victims} == {"b2", "b3"}
    assert all(v["policy"].endswith("mayPreempt batch of lower priority") for v in selected.payload.victims)
    evictions = await events_on(kafka_bootstrap, topic_prefix + "qm.actions", "action.evict.v1")
    assert sorted((e.payload.name, e.payload.grace_period_s) for e in evictions) == [("b2", 120), ("b3", 120)]
    assert all(e.payload.reason.startswith("Preempted by serving-team/chat (InClusterQueue") for e in evictions)
    # Each answer is on the cohort's stream too, under the cohort key and its own event id (ADR 0025).
    on_stream = [(record.key.decode(), e.event_id)
                 async for record, e in read_envelopes(kafka_bootstrap, topic_prefix + "qm.workloads")]
    assert on_stream == [(COHORT, a.event_id) for a in both]
    blocked = both[1].payload
    assert blocked.preemptor_uid == "uid-chat-2" and blocked.victims == []
    assert blocked.blocked_message.startswith("would need to preempt training job ml-team/llm-ft, which is not "
                                              "preemptible")


async def test_thrash_stream_never_preempts_one_workload_more_than_the_cap(kafka_bootstrap, topic_prefix, tmp_path):
    rounds = 13
    stream = []
    for i in range(rounds):  # every 10 minutes: a high inference arrival, then a low batch one
        minute = i * 10
        loop = admitted("batch-team", "loop", "batch", 32, reserved=minute - 7, running=minute - 6)
        stream.append(needed("serving-team", f"hi-{i}", "inference", 32, 1000, [loop], minute))
        hi = admitted("serving-team", f"hi-{i}", "inference", 32, prio=1000, reserved=minute, running=minute)
        stream.append(needed("batch-team", f"lo-{i}", "batch", 32, 0, [hi], minute + 1))
    worker = start(topic_prefix, tmp_path)
    try:
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            for e in stream:
                await bus.publish("qm.preemption", COHORT, e)
            await bus.flush()
        trail = await answers(kafka_bootstrap, topic_prefix, 2 * rounds, "an answer to every arrival")
    finally:
        worker.stop()
    chosen = [int(e.occurred_at[11:13]) * 60 + int(e.occurred_at[14:16]) - 600 for e in trail
              if any(v["uid"] == "uid-loop" for v in e.payload.victims)]
    for start_min in chosen:
        assert sum(1 for t in chosen if start_min <= t < start_min + 60) <= 3
    assert chosen == [0, 10, 20, 60, 70, 80, 120]
    assert all(not e.payload.victims for e in trail if e.payload.preemptor_uid.startswith("uid-lo-"))
    capped = [e.payload.blocked_message for e in trail if e.payload.preemptor_uid == "uid-hi-3"]
    assert "already preempted 3 times in the last 1h (maxPreemptionsPerWorkload 3" in capped[0]
    evictions = await events_on(kafka_bootstrap, topic_prefix + "qm.actions", "action.evict.v1")
    assert len(evictions) == len(chosen)
