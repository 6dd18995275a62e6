"""The queue-manager service on the real broker: decisions per event, pre-freeze expiry
through qm.clock, running through the cohort's stream (as admission forwards it from
qm.cluster), and SIGKILL in the middle of a burst."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from services.adapters.bus import Publisher, read_envelopes, read_topic
from services.adapters.cohort_stream import cohort_stream_outputs
from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import encode, make_envelope
from services.contracts.events import (
    ClockTick,
    NamespaceLabels,
    NodeCapacity,
    PodRunning,
    WorkloadFinished,
    WorkloadValidated,
)
from services.queue_manager.state import Context, apply
from tests.integration.processes import kill_when_written, start_worker
from tests.integration.test_worker_recovery import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
SEED = Path(__file__).resolve().parents[2] / "examples" / "seed"


def validated(name, gpus, cq="gpu-queue", queue="team-ml", ns="ml-team", at="2026-11-29T10:00:00Z", cohort=None):
    return make_envelope(
        WorkloadValidated(uid=f"uid-{name}", namespace=ns, name=name, queue_name=queue, cluster_queue=cq,
                          cohort=cohort, priority=0, created_at=at,
                          pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}]),
        producer="test", occurred_at=at)


def env(prefix, tmp_path, config_dir, **extra):
    return {"QM_TOPIC_PREFIX": prefix, "QM_APP_ID_SUFFIX": f"-{uuid.uuid4().hex[:8]}", "QM_STORE": "memory://",
            "QM_DATA_DIR": str(tmp_path), "QM_CONFIG_DIR": str(config_dir), **extra}


async def events_on(bootstrap, topic):
    return [e async for _, e in read_envelopes(bootstrap, topic) if not isinstance(e, Exception)]


async def test_seed_flow_reserve_pending_run_expire(kafka_bootstrap, topic_prefix, tmp_path):
    worker = start_worker("services.queue_manager", env(topic_prefix, tmp_path, SEED, QM_PODS_READY_TIMEOUT_S="300"),
                          tmp_path / "qm.log")
    try:
        worker.wait_ready()
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            for e in [validated("used", 12), validated("train-4", 4), validated("train-16", 24)]:
                await bus.publish("qm.workloads", "gpu-queue", e)
            running = make_envelope(PodRunning(uid="pod-used", workload_uid="uid-used", namespace="ml-team",
                                               name="used-0", queue_name="team-ml", workload_name="used",
                                               started_at="2026-11-29T10:01:00Z"),
                                    producer="test", occurred_at="2026-11-29T10:01:00Z")
            for forwarded in cohort_stream_outputs(running, KueueConfig.load(SEED)):  # what admission sends
                await bus.publish(forwarded.topic, forwarded.key, forwarded.envelope)
            await bus.flush()

            async def running_counted():  # topics are read concurrently: order the tick after it
                usage = await events_on(kafka_bootstrap, topic_prefix + "qm.usage")
                return any(u.payload.running for u in usage)

            await wait_for(running_counted, 60, "the running pod to count as running usage")
            tick = make_envelope(ClockTick(at="2026-11-29T10:05:30Z", source="test"), producer="test",
                                 occurred_at="2026-11-29T10:05:30Z")
            await bus.publish("qm.clock", "test", tick)
            await bus.flush()

        async def expired():
            return any(e.event_type == "workload.prefreeze_expired.v1"
                       for e in await events_on(kafka_bootstrap, topic_prefix + "qm.workloads"))

        await wait_for(expired, 60, "the idle reservation to expire")

        async def gauges_settled():  # set once a second for the cohorts that changed
            return 'kueue_pending_workloads{cluster_queue="gpu-queue"} 2.0' in worker.metrics()

        await wait_for(gauges_settled, 30, "the pending gauge to count train-16 and the requeued train-4")
        metrics = worker.metrics()
        assert 'kueue_cluster_queue_resource_usage{cluster_queue="gpu-queue",flavor="a100-flavor",' \
               'resource="nvidia.com/gpu"} 12.0' in metrics  # "used" holds its 12; train-4 gave its 4 back
        assert "qm_queue_decision_seconds_count 3.0" in metrics
        assert 'qm_event_loop_info{implementation="uvloop"} 1.0' in metrics  # the default (ADR 0019)
    finally:
        worker.stop()
    trail = await events_on(kafka_bootstrap, topic_prefix + "qm.workloads")
    by_type = Counter(e.event_type for e in trail)
    reserved = {e.payload.name for e in trail if e.event_type == "workload.quota_reserved.v1"}
    assert reserved == {"used", "train-4"}
    pending = [e.payload for e in trail if e.event_type == "workload.pending.v1"]
    assert pending[0].name == "train-16" and pending[0].message.endswith("8 more needed")
    expired_events = [e.payload for e in trail if e.event_type == "workload.prefreeze_expired.v1"]
    assert [(p.name, p.idle_s) for p in expired_events] == [("train-4", 300.0)]  # "used" is running
    assert by_type["workload.requeued.v1"] == 1
    # With train-4 released at 10:05, 20 GPUs are free: the 24-GPU one still does not fit; nothing else moved.
    actions = await events_on(kafka_bootstrap, topic_prefix + "qm.actions")
    admits = [a.payload for a in actions if a.event_type == "action.admit.v1"]
    assert sorted(a.name for a in admits) == ["train-4", "used"]
    assert all(a.node_selector == {"gpu.nvidia.com/class": "a100"} for a in admits)
    # the expired reservation's Job is stopped, so its pods cannot start on the released quota
    stops = [(a.payload.name, a.payload.reason, a.payload.grace_period_s) for a in actions
             if a.event_type == "action.evict.v1"]
    assert stops == [("train-4", "PodsReadyTimeout", 0)]
    assert len(actions) == 3


async def uncommitted(bootstrap: str, group: str, topic: str) -> int:
    """Records of `topic` the group has not committed (end offset - committed, summed)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        committed = {tp: meta.offset for tp, meta in (await admin.list_consumer_group_offsets(group)).items()
                     if tp.topic == topic}
        ends = await consumer.end_offsets(list(committed)) if committed else {}
        return sum(ends[tp] - committed[tp] for tp in committed) if committed else -1
    finally:
        await consumer.stop()
        await admin.close()


async def test_records_nobody_reads_are_dropped_on_arrival_and_still_committed(kafka_bootstrap, topic_prefix,
                                                                                tmp_path):
    """ADR 0030: a backlog where three of every four records are of a type the queue-manager does
    not read. They are dropped before faust delivers them, the gaps they leave are not taken
    for skipped events (no partition is read again), every submission is decided, the group's
    committed offset reaches the end of the topic, and what cannot be read is still
    dead-lettered. (A filler naming a wanted type in its payload is delivered, then passed over
    once parsed.)"""
    def unread(i: int, note: str = "") -> object:
        return make_envelope(NamespaceLabels(namespace=f"ns-{i}", labels={"note": note or f"filler {i}"}),
                             producer="test", occurred_at="2026-11-29T10:00:00Z", identity=("filler", i, note))

    async with Publisher(kafka_bootstrap, topic_prefix) as bus:  # the backlog waits for the worker
        for i in range(8):
            await bus.publish("qm.workloads", "gpu-queue", validated(f"w{i}", 4))
            for j in range(3):
                await bus.publish("qm.workloads", "gpu-queue", unread(10 * i + j))
        await bus.publish_raw("qm.workloads", b"gpu-queue", b"{not json")
        truncated = encode(unread(98))[:-2]  # names a type it does not read, but is not JSON
        await bus.publish_raw("qm.workloads", b"gpu-queue", truncated)
        await bus.publish("qm.workloads", "gpu-queue", unread(99, note="workload.validated.v1"))  # delivered
        await bus.publish("qm.workloads", "gpu-queue", validated("w8", 4, at="2026-11-29T10:00:01Z"))
        await bus.publish("qm.workloads", "gpu-queue", unread(100))
        await bus.flush()
    environment = env(topic_prefix, tmp_path, SEED)
    worker = start_worker("services.queue_manager", environment, tmp_path / "qm.log")
    group = f"qm-queue-manager{environment['QM_APP_ID_SUFFIX']}"
    topic = topic_prefix + "qm.workloads"
    try:
        worker.wait_ready()

        async def all_decided():
            trail = await events_on(kafka_bootstrap, topic)
            return sum(e.event_type in ("workload.quota_reserved.v1", "workload.pending.v1") for e in trail) >= 9

        await wait_for(all_decided, 60, "a decision for each of the nine submissions")

        async def all_committed():  # its own decisions, at the end of the topic, included
            return await uncommitted(kafka_bootstrap, group, topic) == 0

        await wait_for(all_committed, 60, "the group's committed offset to reach the end of qm.workloads")
        metrics = worker.metrics()
    finally:
        worker.stop()
    trail = await events_on(kafka_bootstrap, topic)
    assert sorted(e.payload.name for e in trail if e.event_type == "workload.quota_reserved.v1") == \
        [f"w{i}" for i in range(8)]  # 32 GPUs of nominal quota: eight of 4
    assert [e.payload.name for e in trail if e.event_type == "workload.pending.v1"] == ["w8"]
    passed_over = [line for line in metrics.splitlines() if line.startswith("qm_messages_passed_over_total{")]
    assert passed_over and float(passed_over[0].split()[-1]) >= 20, passed_over  # of the 24 fillers between submissions
    assert "qm_partition_rewinds_total{" not in metrics  # no gap was taken for a skipped event
    dead = [r async for r in read_topic(kafka_bootstrap, topic + ".dlq")]
    assert [r.value for r in dead] == [b"{not json", truncated]  # dead-lettered, as before


async def test_bundled_records_are_applied_envelope_by_envelope(kafka_bootstrap, topic_prefix, tmp_path):
    """ADR 0034: a record may carry several envelopes of one key (admission's fact lane sends
    its facts so). Each is applied in its order; one that breaks its contract is dead-lettered
    alone, named by its place; a bundle read twice is applied once (event ids); a bundle of
    types the queue-manager does not read is dropped on arrival."""
    def filler(i: int) -> object:
        return make_envelope(NamespaceLabels(namespace=f"ns-{i}", labels={"note": "filler"}), producer="test",
                             occurred_at="2026-11-29T10:00:00Z", identity=("filler", i))

    def bundle(*documents: bytes) -> bytes:
        return b"[" + b",".join(documents) + b"]"

    broken = encode(validated("w-broken", 4)).replace(b'"uid":"uid-w-broken",', b"")
    first = bundle(encode(validated("w0", 4)), broken, encode(validated("w1", 4)))
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        await bus.publish_raw("qm.workloads", b"gpu-queue", first)
        await bus.publish_raw("qm.workloads", b"gpu-queue", bundle(encode(filler(1)), encode(filler(2))))
        await bus.publish_raw("qm.workloads", b"gpu-queue", first)  # read again, as after a crash upstream
        await bus.publish_raw("qm.workloads", b"gpu-queue", bundle(encode(filler(3)), encode(validated("w2", 4))))
        await bus.flush()
    worker = start_worker("services.queue_manager", env(topic_prefix, tmp_path, SEED), tmp_path / "qm.log")
    topic = topic_prefix + "qm.workloads"
    try:
        worker.wait_ready()

        async def all_decided():
            trail = await events_on(kafka_bootstrap, topic)
            return sum(e.event_type == "workload.quota_reserved.v1" for e in trail) >= 3

        await wait_for(all_decided, 60, "reservations for w0, w1 and w2")
        dead: list = []

        async def dead_lettered_twice():  # the broken envelope, once per reading of its bundle
            dead[:] = [r async for r in read_topic(kafka_bootstrap, topic + ".dlq", idle_timeout_s=0.3)]
            return len(dead) >= 2

        await wait_for(dead_lettered_twice, 30, "the broken envelope on qm.workloads.dlq")
        await asyncio.sleep(1.0)
    finally:
        worker.stop()
    trail = await events_on(kafka_bootstrap, topic)
    assert [e.payload.name for e in trail if e.event_type == "workload.quota_reserved.v1"] == ["w0", "w1", "w2"]
    assert [r.value for r in dead] == [broken, broken]  # the envelope alone, not its bundle
    error = dict(dead[0].headers)["qm-error"].decode()
    assert error.startswith("contract: envelope 2 of 3 in the record: ") and "uid" in error, error


def cohort_config(directory: Path, cohorts: int = 3, queues: int = 2) -> None:
    docs = [{"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"},
             "spec": {"nodeLabels": {"gpu.nvidia.com/class": "a100"}}}]
    for c in range(cohorts):
        for q in range(queues):
            docs.append({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": f"cq-{c}-{q}"},
                         "spec": {"cohort": f"cohort-{c}", "namespaceSelector": {}, "resourceGroups": [{
                             "coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "a100-flavor", "resources": [
                                 {"name": "nvidia.com/gpu", "nominalQuota": 16, "borrowingLimit": 8}]}]}]}})
            docs.append({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                         "metadata": {"name": "lq", "namespace": f"ns-{c}-{q}"}, "spec": {"clusterQueue": f"cq-{c}-{q}"}})
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kueue.yaml").write_text(yaml.safe_dump_all(docs))


def check_invariants(trail) -> dict[str, int]:
    """Replay the qm.workloads log: no moment with a ClusterQueue above nominal + borrowingLimit
    (16 + 8) or a cohort above its capacity (2 x 16), and no workload holding two reservations."""
    held: dict[str, tuple[str, str, int]] = {}
    by_cq: Counter = Counter()
    by_cohort: Counter = Counter()
    reservations: Counter = Counter()
    for e in trail:
        p = e.payload
        if e.event_type == "workload.quota_reserved.v1":
            assert p.uid not in held, f"{p.uid} reserved twice"
            gpus = p.usage["a100-flavor"]["nvidia.com/gpu"]
            cohort = "cohort-" + p.cluster_queue.split("-")[1]
            held[p.uid] = (p.cluster_queue, cohort, gpus)
            by_cq[p.cluster_queue] += gpus
            by_cohort[cohort] += gpus
            reservations[p.uid] += 1
            assert by_cq[p.cluster_queue] <= 24_000, f"{p.cluster_queue} above nominal + borrowingLimit"
            assert by_cohort[cohort] <= 32_000, f"{cohort} above its capacity"
        elif e.event_type == "workload.released.v1" and p.uid in held:
            cq, cohort, gpus = held.pop(p.uid)
            by_cq[cq] -= gpus
            by_cohort[cohort] -= gpus
    return dict(reservations)


def burst_events(cohorts: int, submissions: int):
    """Submissions spread over the cohorts, and every fifth step a finish of an earlier one."""
    burst = []
    for i in range(submissions):
        c, q = i % cohorts, (i // cohorts) % 2
        at = f"2026-11-29T{10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        burst.append((f"cohort:cohort-{c}", validated(f"w{i}", [1, 2, 4, 8][i % 4], cq=f"cq-{c}-{q}", queue="lq",
                                                      ns=f"ns-{c}-{q}", at=at, cohort=f"cohort-{c}")))
        if i % 5 == 4 and i >= 40:  # finishes free quota and drive more admissions
            j = i - 40
            burst.append((f"cohort:cohort-{j % cohorts}", make_envelope(
                WorkloadFinished(uid=f"uid-w{j}", namespace=f"ns-{j % cohorts}-{(j // cohorts) % 2}", name=f"w{j}",
                                 succeeded=True, finished_at=at), producer="test", occurred_at=at)))
    return burst


def held_reservations(trail) -> set[str]:
    reserved = {e.payload.uid for e in trail if e.event_type == "workload.quota_reserved.v1"}
    return reserved - {e.payload.uid for e in trail if e.event_type == "workload.released.v1"}


async def fold_of_log(bootstrap: str, topic: str, config_dir: Path) -> tuple[set[str], list]:
    """The reservations the pure fold ends with over the log as it stands (each cohort's records
    in partition order, a repeated event id applied once, as the service does), and the log.
    The log holds the queue-manager's own queue.drain_due.v1 where they landed (ADR 0016), so
    this is what any replay of it must decide, crash or no crash."""
    cfg = KueueConfig.load(config_dir)
    ctx = Context(objects=cfg.objects, node_labels=cfg.node_labels(), coalesce_drains=True)
    records = sorted([(r, e) async for r, e in read_envelopes(bootstrap, topic) if not isinstance(e, Exception)],
                     key=lambda item: (item[0].partition, item[0].offset))
    states: dict[str, dict] = {}
    seen: set[str] = set()
    for record, envelope in records:
        if envelope.event_id in seen:
            continue
        seen.add(envelope.event_id)
        key = record.key.decode()
        states[key], _ = apply(states.get(key), envelope, dataclasses.replace(ctx, cache_key=key))
    return {uid for state in states.values() for uid in state["admitted"]}, [e for _, e in records]


async def test_two_replicas_and_a_sigkill_in_a_5000_burst_keep_every_invariant(kafka_bootstrap, topic_prefix, tmp_path):
    config = tmp_path / "config"
    cohort_config(config, cohorts=5)
    burst = burst_events(cohorts=5, submissions=5000)
    environment = env(topic_prefix, tmp_path, config)
    topic = topic_prefix + "qm.workloads"
    published = {e.event_id for _, e in burst}

    async def publish(events):
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            for key, e in events:
                await bus.publish("qm.workloads", key, e)
            await bus.flush()

    first = start_worker("services.queue_manager", environment, tmp_path / "qm-a1.log")
    second = start_worker("services.queue_manager", environment, tmp_path / "qm-b.log")
    restarted = None
    try:
        first.wait_ready()
        second.wait_ready()
        # The first half streams in while both replicas decide; one dies at the 20th
        # reservation, and the second half arrives while its partitions have no owner.
        killed = asyncio.create_task(kill_when_written(
            first, kafka_bootstrap, topic, 20, timeout_s=120,
            counts=lambda record: record.value.count(b'"workload.quota_reserved.v1"')))  # bundles: ADR 0034
        await publish(burst[: len(burst) // 2])
        await killed
        decided_at_kill = sum(e.producer == "queue-manager" for e in await events_on(kafka_bootstrap, topic))
        await publish(burst[len(burst) // 2:])
        restarted = start_worker("services.queue_manager", environment, tmp_path / "qm-a2.log")
        restarted.wait_ready()
        diff = {}
        log_sizes = [-1]

        async def settled():
            expected, trail = await fold_of_log(kafka_bootstrap, topic, config)
            held = held_reservations(trail)
            diff.update(extra=sorted(held - expected)[:10], missing=sorted(expected - held)[:10],
                        n_extra=len(held - expected), n_missing=len(expected - held),
                        events_in_log=sum(e.event_id in published for e in trail), events_published=len(published))
            # and nothing written since the last look: a queue.drain_due.v1 (ADR 0016) in flight
            # leaves held == expected until it lands, and its reservations follow it
            quiet = log_sizes[-1] == len(trail)
            log_sizes.append(len(trail))
            return quiet and held == expected and diff["events_in_log"] == len(published)

        try:
            await wait_for(settled, 240, "the replicas to reach what the pure fold decides over their log")
        except AssertionError as error:
            raise AssertionError(f"{error}: {diff}") from None
    finally:
        first.stop()
        second.stop()
        if restarted:
            restarted.stop()
    expected, trail = await fold_of_log(kafka_bootstrap, topic, config)
    assert decided_at_kill < sum(e.producer == "queue-manager" for e in trail), \
        "killed after the burst was decided: nothing left to recover"
    # Outputs repeated after the crash carry the same event id: dedupe as any consumer does.
    seen, unique = set(), []
    for e in trail:
        if e.event_id not in seen:
            seen.add(e.event_id)
            unique.append(e)
    reservations = check_invariants(unique)
    assert reservations and max(reservations.values()) == 1
    assert held_reservations(unique) == expected


async def test_a_cohort_state_above_kafkas_1_mb_default_is_stored(kafka_bootstrap, topic_prefix, tmp_path):
    """One cohort with thousands pending: its state record passes 1 MB (the queue-manager used
    to crash with MessageSizeTooLargeError); every submission still gets its decision."""
    config = tmp_path / "config"
    cohort_config(config, cohorts=1)
    n = 4000
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        for i in range(n):
            at = f"2026-11-29T10:{i // 60 % 60:02d}:{i % 60:02d}Z"
            await bus.publish("qm.workloads", "cohort:cohort-0", validated(
                f"big-{i:05d}-" + "x" * 40, 8, cq="cq-0-0", queue="lq", ns="ns-0-0", at=at, cohort="cohort-0"))
        await bus.flush()
    environment = env(topic_prefix, tmp_path, config)
    worker = start_worker("services.queue_manager", environment, tmp_path / "qm.log")
    try:
        worker.wait_ready()

        async def all_decided():
            trail = await events_on(kafka_bootstrap, topic_prefix + "qm.workloads")
            decided = {e.payload.uid for e in trail if e.event_type in ("workload.quota_reserved.v1", "workload.pending.v1")}
            assert worker.process.poll() is None, f"queue-manager exited; log:\n{worker.log()}"
            return len(decided) == n

        await wait_for(all_decided, 240, "a decision for every submission")
        changelog = f"qm-queue-manager{environment['QM_APP_ID_SUFFIX']}-cohorts-changelog"
        sizes: list[int] = []

        async def stored():  # values reach the changelog QM_STORE_INTERVAL_S after they change
            sizes[:] = [len(record.value or b"") async for record in _records(kafka_bootstrap, changelog)]
            return any(size > 1_048_576 for size in sizes)

        await wait_for(stored, 60, "the cohort's state, above 1 MB, in its changelog")
    finally:
        worker.stop()
    assert max(sizes) > 1_048_576, f"the state never passed 1 MB ({max(sizes, default=0)} bytes): the test tests nothing"


async def _records(bootstrap, topic):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=32 << 20,
                                fetch_max_bytes=64 << 20)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        if not tps:
            await consumer._client.force_metadata_update()
            tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for record in records:
                    yield record
    finally:
        await consumer.stop()


DYNAMIC = Path(__file__).resolve().parents[2] / "examples" / "dynamic-quota"


async def test_a_quota_rule_lends_while_the_cluster_is_quiet_and_takes_it_back_when_it_fills(
        kafka_bootstrap, topic_prefix, tmp_path):
    """examples/dynamic-quota on the broker: team-a (16 nominal, borrowingLimit 0) may borrow
    16 while the cluster is below 40% utilization. The queue-manager reads the cluster's usage
    and nodes, says the signals on the cohort's stream at each tick, and the fold decides."""
    # train-24 never runs here: without a long pods-ready timeout its reservation expires 5
    # minutes (of ticks) later and, requeued, it may be admitted again before the limit falls.
    worker = start_worker("services.queue_manager", env(topic_prefix, tmp_path, DYNAMIC, QM_PODS_READY_TIMEOUT_S="86400"),
                          tmp_path / "qm.log")
    key = "cohort:ai-platform"
    workloads = topic_prefix + "qm.workloads"

    async def trail():
        return await events_on(kafka_bootstrap, workloads)

    async def ticks_until(bus, done, what, start_minute):
        minute = start_minute
        for _ in range(60):  # the worker's replica of qm.usage/qm.cluster catches up on its own time
            at = f"2026-11-29T10:{minute:02d}:00Z"
            await bus.publish("qm.clock", "test", make_envelope(ClockTick(at=at, source="test"), producer="test",
                                                                occurred_at=at))
            await bus.flush()
            minute += 1
            try:
                await wait_for(done, 1.5, what)
                return minute
            except AssertionError:
                continue
        raise AssertionError(f"no {what} after 60 ticks; log:\n{worker.log()}")

    try:
        worker.wait_ready()
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            await bus.publish("qm.workloads", key, validated("train-24", 24, cq="team-a", queue="team-a", ns="team-a",
                                                             cohort="ai-platform"))
            await bus.flush()

            async def said_pending():
                return any(e.event_type == "workload.pending.v1" for e in await trail())

            await wait_for(said_pending, 60, "train-24 to wait for quota")

            async def admitted():
                return any(e.event_type == "workload.quota_reserved.v1" for e in await trail())

            minute = await ticks_until(bus, admitted, "admission once the rule lends", start_minute=1)

            # Two 8-GPU nodes appear: 24 GPUs held of 16 that exist, far above 40%.
            for node in ("a100-0", "a100-1"):
                await bus.publish("qm.cluster", node, make_envelope(
                    NodeCapacity(node=node, flavor="a100-flavor", allocatable={"nvidia.com/gpu": 8000}),
                    producer="test", occurred_at="2026-11-29T10:30:00Z"))
            await bus.flush()

            async def taken_back():
                changes = [e for e in await trail() if e.event_type == "quota.limits_changed.v1"]
                return len(changes) >= 2

            await ticks_until(bus, taken_back, "the limit to fall back", start_minute=minute + 30)
    finally:
        worker.stop()
    events = await trail()
    changes = [e.payload for e in events if e.event_type == "quota.limits_changed.v1"]
    assert [(c.previous_borrowing_limit, c.effective_borrowing_limit) for c in changes] == [(0, 16000), (16000, 0)]
    assert changes[0].rule.endswith("cluster.gpuUtilization < 0.4") and changes[1].rule is None
    assert changes[0].signals["capacitySource"] == "quota" and changes[1].signals["gpuCapacity"] == 16
    assert any(e.event_type == "cluster.signals.v1" for e in events)
    reserved = [e.payload for e in events if e.event_type == "workload.quota_reserved.v1"]
    assert [(r.name, r.borrowing) for r in reserved] == [("train-24", True)]
    assert not any(e.event_type == "workload.evicted.v1" for e in events)  # lowering evicts nobody
    usage = [e.payload for e in await events_on(kafka_bootstrap, topic_prefix + "qm.usage")]
    assert {"team-a": {"a100-flavor": {"nvidia.com/gpu": 16000}}} in [u.effective_borrowing_limits for u in usage]
