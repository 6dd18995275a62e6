"""A real faust worker on the real broker: dead letters, and SIGKILL in mid-stream.

The worker (tests/integration/workers/usage_worker.py) folds reservations and releases into
a changelog-backed table keyed by namespace, storing each event id with the state it
changed, and publishes each new total on qm.usage."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter

import orjson
import pytest

from services.adapters.bus import DLQ_ERROR, Publisher, create_topics, read_envelopes, read_topic
from services.contracts.codec import event_id_for, make_envelope
from services.contracts.events import WorkloadPending, WorkloadQuotaReserved, WorkloadReleased
from tests.integration.processes import kill_when_written, start_worker, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
NAMESPACES = [f"team-{i}" for i in range(8)]
T0 = "2026-11-29T10:00:00Z"


def usage_events(count: int, seed: int = 7):
    """Reservations and releases across namespaces; the expected table is their plain sum."""
    rng = random.Random(seed)
    open_reservations: list[tuple[str, str, int]] = []
    events = []
    for i in range(count):
        if open_reservations and rng.random() < 0.4:
            uid, ns, gpus = open_reservations.pop(rng.randrange(len(open_reservations)))
            payload = WorkloadReleased(uid=uid, namespace=ns, name=uid, cluster_queue="cq", reason="Finished",
                                       usage={"a100": {"nvidia.com/gpu": gpus}}, released_at=T0)
        else:
            ns, gpus = rng.choice(NAMESPACES), rng.choice([1000, 2000, 4000, 8000, 460])
            uid = f"wl-{i}"
            open_reservations.append((uid, ns, gpus))
            payload = WorkloadQuotaReserved(uid=uid, namespace=ns, name=uid, cluster_queue="cq", flavors={},
                                            counts={"main": 1}, usage={"a100": {"nvidia.com/gpu": gpus}}, reserved_at=T0)
        events.append(make_envelope(payload, producer="test", occurred_at=T0, identity=(i,)))
    return events


def expected_table(events) -> dict[str, dict]:
    table: dict[str, dict] = {}
    for e in events:
        sign = 1 if isinstance(e.payload, WorkloadQuotaReserved) else -1
        row = table.setdefault(e.payload.namespace, {"reserved_gpu_milli": 0, "applied": 0})
        row["reserved_gpu_milli"] += sign * e.payload.usage["a100"]["nvidia.com/gpu"]
        row["applied"] += 1
    return table


async def changelog_table(bootstrap: str, topic: str) -> dict[str, dict]:
    """The table as its changelog holds it: the latest value per key."""
    latest = {}
    async for record in read_topic(bootstrap, topic):
        latest[orjson.loads(record.key)] = orjson.loads(record.value)["state"] if record.value else None
    return latest


async def publish_all(bootstrap, prefix, events, key=lambda e: e.payload.namespace, topics=("qm.workloads",)):
    """Round robin over `topics` (the same key lands in the same partition number of each)."""
    async with Publisher(bootstrap, prefix) as bus:
        for i, e in enumerate(events):
            await bus.publish(topics[i % len(topics)], key(e), e)
        await bus.flush()


async def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    return {name: value for name, value, *_ in response.resources[0][4]}


def worker_env(prefix: str, suffix: str, data_dir) -> dict[str, str]:
    return {"QM_TOPIC_PREFIX": prefix, "QM_APP_ID_SUFFIX": suffix, "QM_STORE": "memory://", "QM_DATA_DIR": str(data_dir)}


async def distinct_outputs(bootstrap: str, topic: str) -> int:
    return len({envelope.event_id async for _, envelope in read_envelopes(bootstrap, topic)})


# "1.0": values applied in memory reach the changelog once a second, cursors held back to the
# first unstored event (ADR 0014, as the services run); "0": every batch stores its values.
# Two topics: one agent folds two co-partitioned topics into one table (ADR 0017; the
# preemption service did until ADR 0021); a value then holds back the cursors of both.
# "rocksdb://": the services' default store, restarted as on another machine (an empty data
# directory), so it too rebuilds the table from the changelog, as raw records.
@pytest.mark.parametrize(
    ("store_interval_s", "topics", "store"),
    [("1.0", ("qm.workloads",), "memory://"), ("0", ("qm.workloads",), "memory://"),
     ("1.0", ("qm.workloads", "qm.preemption"), "memory://"), ("1.0", ("qm.workloads",), "rocksdb://")],
)
async def test_sigkill_mid_stream_loses_nothing_and_applies_nothing_twice(
    kafka_bootstrap, topic_prefix, tmp_path, store_interval_s, topics, store
):
    if store.startswith("rocksdb"):
        pytest.importorskip("rocksdict")
    events = usage_events(3000)
    expected = expected_table(events)
    suffix = f"-{uuid.uuid4().hex[:8]}"
    changelog = f"qm-usage-test-worker{suffix}-namespace_gpu_usage-changelog"
    await publish_all(kafka_bootstrap, topic_prefix, events, topics=topics)
    env = {**worker_env(topic_prefix, suffix, tmp_path), "QM_STORE_INTERVAL_S": store_interval_s,
           "QM_TEST_TOPICS": ",".join(topics), "QM_STORE": store}

    worker = start_worker("tests.integration.workers.usage_worker", env, tmp_path / "w1.log")
    try:
        worker.wait_ready()

        await kill_when_written(worker, kafka_bootstrap, topic_prefix + "qm.usage", 300, timeout_s=90)
        applied = await distinct_outputs(kafka_bootstrap, topic_prefix + "qm.usage")
        assert applied < len(events), "killed too late to test anything"
        at_kill = await changelog_table(kafka_bootstrap, changelog)
        assert sum((r or {}).get("applied", 0) for r in at_kill.values()) <= applied
    finally:
        worker.stop()
    # Its segments roll every 64 MiB, so the broker compacts what a restart replays (ADR 0042).
    assert (await topic_configs(kafka_bootstrap, changelog))["segment.bytes"] == str(64 * 1024 * 1024)

    moved = {**env, "QM_DATA_DIR": str(tmp_path / "elsewhere")}
    restarted = start_worker("tests.integration.workers.usage_worker", moved, tmp_path / "w2.log")
    try:
        restarted.wait_ready()
        seen = {}

        async def caught_up():
            seen.update(await changelog_table(kafka_bootstrap, changelog))
            return seen == expected

        try:
            await wait_for(caught_up, 300, "the restarted worker to reach the uninterrupted table")
        finally:
            assert seen == expected, restarted.log()
    finally:
        restarted.stop()

    # Every output the table reflects was published: the latest qm.usage value per namespace matches.
    latest_usage = {}
    async for _, envelope in read_envelopes(kafka_bootstrap, topic_prefix + "qm.usage"):
        latest_usage[envelope.payload.namespace] = envelope
    # Outputs may repeat after the crash (same deterministic id), never differ.
    assert {ns: e.payload.total["nvidia.com/gpu"] for ns, e in latest_usage.items()} == {
        ns: max(row["reserved_gpu_milli"], 0) for ns, row in expected.items()
    }
    ids, causes = Counter(), set()
    async for _, envelope in read_envelopes(kafka_bootstrap, topic_prefix + "qm.usage"):
        ids[envelope.event_id] += 1
        causes.add(envelope.causation_id)
    assert causes == {e.event_id for e in events}  # every event applied, and said
    if len(topics) == 1:
        assert len(ids) == len(events)
    # (Over two topics the order between them is not fixed: an event re-applied after the crash
    # may meet its namespace's other events in another order and say another running total.)


async def test_a_topic_created_after_the_worker_is_ready_is_read(kafka_bootstrap, tmp_path):
    """A service started before `qm topics create` joins its group without its input topic, and
    says so on /readyz (not ready, the topic named). Its consumer's next metadata refresh
    (QM_METADATA_MAX_AGE_MS; 5 s here, 30 s by default, faust's own 5 min) finds the topic, and
    the group rebalances onto it."""
    prefix = f"t{uuid.uuid4().hex[:10]}."  # no topics yet (cleaned up with the run's, see conftest)
    env = {**worker_env(prefix, f"-{uuid.uuid4().hex[:8]}", tmp_path), "QM_METADATA_MAX_AGE_MS": "5000"}
    worker = start_worker("tests.integration.workers.usage_worker", env, tmp_path / "w.log")
    try:
        readiness = {}

        async def joined():
            nonlocal readiness
            readiness = await asyncio.to_thread(worker.readiness)
            return readiness.get("joined")

        await wait_for(joined, 120, "the worker joining its group")
        assert readiness["ready"] is False and readiness["missing_topics"] == [prefix + "qm.workloads"], readiness
        await create_topics(kafka_bootstrap, prefix)
        await asyncio.to_thread(worker.wait_ready, 60)
        events = usage_events(20)
        await publish_all(kafka_bootstrap, prefix, events)

        async def all_applied():
            return await distinct_outputs(kafka_bootstrap, prefix + "qm.usage") == len(events)

        await wait_for(all_applied, 60, "the events of a topic created after the worker was ready")
    finally:
        worker.stop()
    said = [line for line in worker.json_log() if line["msg"].startswith("a consumed topic does not exist")]
    assert [line["topic"] for line in said] == [prefix + "qm.workloads"], said  # once, with what to do


async def test_malformed_message_goes_to_the_dlq_and_the_stream_goes_on(kafka_bootstrap, topic_prefix, tmp_path):
    suffix = f"-{uuid.uuid4().hex[:8]}"
    good = usage_events(1)[0]
    wrong_event = make_envelope(
        WorkloadPending(uid="u1", namespace="team-0", name="n", reason="R", message="m"),
        producer="test", occurred_at=T0, identity=("pending",),
    )
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        await bus.publish_raw("qm.workloads", b"team-0", b"{this is not json")
        await bus.publish_raw("qm.workloads", b"team-0", orjson.dumps({"event_id": event_id_for("x"), "payload": {}}))
        await bus.publish("qm.workloads", "team-0", wrong_event)  # valid contract, but the handler cannot use it
        await bus.publish("qm.workloads", good.payload.namespace, good)
        await bus.flush()

    worker = start_worker("tests.integration.workers.usage_worker", worker_env(topic_prefix, suffix, tmp_path),
                          tmp_path / "w.log", loglevel="info")
    changelog = f"qm-usage-test-worker{suffix}-namespace_gpu_usage-changelog"
    try:
        worker.wait_ready()

        async def processed():
            return await changelog_table(kafka_bootstrap, changelog) == expected_table([good])

        await wait_for(processed, 90, "the good message after the bad ones")
        dead = [r async for r in read_topic(kafka_bootstrap, topic_prefix + "qm.workloads.dlq")]
    finally:
        worker.stop()

    reasons = [dict(r.headers)[DLQ_ERROR].decode() for r in dead]
    assert len(dead) == 3, reasons
    assert reasons[0].startswith("contract: message: not valid JSON")
    assert reasons[1].startswith("contract: envelope: (top level):") and "is a required property" in reasons[1]
    assert reasons[2].startswith("handler: AttributeError")
    assert dead[0].value == b"{this is not json"
    assert dict(dead[0].headers)["qm-source-topic"] == (topic_prefix + "qm.workloads").encode()
    # The worker logs JSON lines under faust's `worker` command too, fields and all: on-call
    # finds the failed event by its id.
    [failed] = [line for line in worker.json_log() if line["msg"] == "handler failed; message dead-lettered"]
    assert failed["event_id"] == wrong_event.event_id and failed["topic"] == "qm.workloads", failed
    assert failed["service"] == "usage-test-worker" and "AttributeError" in failed["error"]
    # faust's start-up banner is a JSON line too, not a text table before the first one
    assert worker.log_path.read_text().startswith("{"), worker.log_path.read_text()[:300]
    [starting] = [line for line in worker.json_log() if line["msg"] == "worker starting"]
    assert f"id qm-usage-test-worker{suffix}" in starting["detail"] and "web http://" in starting["detail"], starting
