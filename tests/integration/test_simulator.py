"""The trace-driven cluster simulator against the real broker, with a fake admitter that
answers every submission with action.admit: pods run and finish at the right event times, and
two runs give the same event ids."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer

from services.adapters.bus import Publisher, create_topics, read_envelopes
from services.contracts.codec import decode, make_envelope
from services.contracts.events import ActionAdmit, WorkloadRejected
from services.sim import run_simulation, synthetic_nodes
from services.trace.alibaba import TracePod

pytestmark = pytest.mark.kafka

PODS = [
    TracePod("sim-a", 4000, 8192, 1, 1000, (), "LS", "Succeeded", creation_s=0, scheduled_s=0, deletion_s=120),
    TracePod("sim-b", 2000, 4096, 1, 460, ("T4",), "BE", "Failed", creation_s=30, scheduled_s=40, deletion_s=100),
    TracePod("sim-c", 16000, 65536, 8, 1000, (), "Burstable", "Succeeded", creation_s=60, scheduled_s=60,
             deletion_s=150),
    TracePod("sim-never", 1000, 2048, 1, 500, (), "BE", "Pending", creation_s=90, scheduled_s=None, deletion_s=140),
]


async def _admitter(bootstrap: str, prefix: str, stop: asyncio.Event, *, late: dict[str, str] | None = None,
                    never: tuple[str, ...] = (), reject: tuple[str, ...] = ()) -> None:
    """Admits every submission at its creation time, except the workloads named in `late`
    (admitted once a tick at that event time or later is seen, at that tick's time), in
    `never`, and in `reject` (a workload.rejected.v1 on qm.workloads instead)."""
    late = dict(late or {})
    consumer = AIOKafkaConsumer(prefix + "qm.cluster", prefix + "qm.clock", bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    waiting: dict[str, object] = {}  # name -> its submission, for the late ones

    async def admit(bus, submitted, at: str) -> None:
        p = submitted.payload
        action = ActionAdmit(workload_uid=p.uid, namespace=p.namespace, name=p.name, kind="Job",
                             flavors={"main": {"nvidia.com/gpu": "g2-flavor", "cpu": "cpu-flavor"}})
        await bus.publish("qm.actions", p.uid, make_envelope(
            action, producer="fake-admitter", occurred_at=at, identity=(p.uid, "admit"), cause=submitted))

    try:
        async with Publisher(bootstrap, prefix) as bus:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=100)
                for records in batch.values():
                    for record in records:
                        envelope = decode(record.value)
                        if envelope.event_type == "clock.tick.v1":
                            for name, after in list(late.items()):
                                if name in waiting and envelope.payload.at >= after:
                                    del late[name]
                                    await admit(bus, waiting.pop(name), envelope.payload.at)
                            continue
                        if envelope.event_type != "workload.submitted.v1" or envelope.payload.name in never:
                            continue
                        if envelope.payload.name in reject:
                            p = envelope.payload
                            rejected = WorkloadRejected(uid=p.uid, namespace=p.namespace, name=p.name,
                                                        violations=[{"policy": "test", "enforcement_action": "deny",
                                                                     "message": "refused by the test"}],
                                                        message="refused by the test")
                            await bus.publish("qm.workloads", p.namespace, make_envelope(
                                rejected, producer="fake-admitter", occurred_at=p.created_at,
                                identity=(p.uid, "rejected"), cause=envelope))
                            continue
                        if envelope.payload.name in late:
                            waiting[envelope.payload.name] = envelope
                            continue
                        await admit(bus, envelope, envelope.payload.created_at)
                await bus.flush()
    finally:
        await consumer.stop()


async def _run(bootstrap: str, prefix: str) -> tuple[list, object]:
    stop = asyncio.Event()
    admitter = asyncio.create_task(_admitter(bootstrap, prefix, stop))
    progress = []
    stats = await run_simulation(bootstrap, prefix, PODS, speed=60.0, duration_s=200, tick_every_s=60,
                                 nodes=synthetic_nodes(), on_progress=progress.append, progress_every_s=0.2,
                                 tick_holdback_wall_s=0.5)
    stop.set()
    await admitter
    events = [e async for _, e in read_envelopes(bootstrap, prefix + "qm.cluster")]
    ticks = [e async for _, e in read_envelopes(bootstrap, prefix + "qm.clock")]
    assert progress and progress[-1].done
    return events + ticks, stats


async def test_pods_run_and_finish_at_trace_times_with_deterministic_ids(kafka_bootstrap, topic_prefix):
    first, stats = await _run(kafka_bootstrap, topic_prefix)
    assert stats.submitted == 4 and stats.admitted == 4 and stats.finished == 3 and stats.deleted == 1
    assert stats.running == 0 and stats.gpu_running_milli == 0

    def at(event_type: str, name: str) -> str:
        (e,) = [e for e in first if e.event_type == event_type
                and (getattr(e.payload, "workload_name", None) or getattr(e.payload, "name", None)) == name]
        return e.occurred_at

    assert at("workload.submitted.v1", "sim-b") == "2026-11-29T09:00:30Z"
    assert at("pod.running.v1", "sim-a") == "2026-11-29T09:00:02Z"  # admit at creation + 2 s start delay
    assert at("pod.finished.v1", "sim-a") == "2026-11-29T09:02:02Z"  # + 120 s of trace run time
    assert at("pod.running.v1", "sim-b") == "2026-11-29T09:00:32Z"
    assert at("workload.finished.v1", "sim-b") == "2026-11-29T09:01:32Z"  # ran 60 s (deletion - scheduled)
    assert at("workload.finished.v1", "sim-never") == "2026-11-29T09:02:20Z"  # its owner deletes it
    finished = {e.payload.name: e.payload for e in first if e.event_type == "workload.finished.v1"}
    assert finished["sim-b"].succeeded is False and finished["sim-a"].succeeded is True
    assert finished["sim-a"].queue_name == "lq-" + finished["sim-a"].namespace
    submitted = {e.payload.name: e.payload for e in first if e.event_type == "workload.submitted.v1"}
    assert submitted["sim-c"].pod_sets[0]["requests"]["nvidia.com/gpu"] == 8000
    assert submitted["sim-b"].pod_sets[0]["requests"]["nvidia.com/gpu"] == 460
    assert submitted["sim-c"].labels["quartermaster.dev/class"] == "training"
    running = {e.payload.workload_name: e.payload for e in first if e.event_type == "pod.running.v1"}
    assert running["sim-a"].queue_name and running["sim-a"].node.startswith("sim-g2-")
    assert [e.occurred_at for e in first if e.event_type == "clock.tick.v1"][:2] == [
        "2026-11-29T09:00:00Z", "2026-11-29T09:01:00Z"]
    assert sum(e.event_type == "namespace.labels.v1" for e in first) == 8

    second_prefix = topic_prefix.rstrip(".") + "b."
    await create_topics(kafka_bootstrap, second_prefix)
    second, _ = await _run(kafka_bootstrap, second_prefix)
    assert sorted(e.event_id for e in second) == sorted(e.event_id for e in first)


LATE_PODS = [
    # runs past the trace's end (120 s): 2 -> 302 s
    TracePod("runs-on", 4000, 8192, 1, 1000, (), "LS", "Succeeded", creation_s=0, scheduled_s=0, deletion_s=300),
    # admitted only after the trace's end, at the tick of 180 s: runs 182 -> 212 s
    TracePod("admitted-late", 2000, 4096, 1, 500, (), "BE", "Succeeded", creation_s=60, scheduled_s=60,
             deletion_s=90),
    TracePod("never-admitted", 1000, 2048, 1, 500, (), "BE", "Succeeded", creation_s=60, scheduled_s=60,
             deletion_s=70),
]


async def _settle(bootstrap: str, prefix: str, pods: list, *, never: tuple[str, ...] = (),
                  reject: tuple[str, ...] = ()) -> tuple[object, list, float]:
    stop = asyncio.Event()
    admitter = asyncio.create_task(_admitter(bootstrap, prefix, stop, late={"admitted-late": "2026-11-29T09:03:00Z"},
                                             never=never, reject=reject))
    progress = []
    started = asyncio.get_running_loop().time()
    stats = await run_simulation(bootstrap, prefix, pods, speed=120.0, duration_s=120, tick_every_s=60,
                                 nodes=synthetic_nodes(), on_progress=progress.append, progress_every_s=0.2,
                                 tick_holdback_wall_s=0.3, settle_wall_s=1.5)
    took = asyncio.get_running_loop().time() - started
    stop.set()
    await admitter
    events = [e async for _, e in read_envelopes(bootstrap, prefix + "qm.cluster")]
    assert progress[-1].done and progress[-1].stopped_because == stats.stopped_because
    return stats, events, took


async def test_settling_runs_pods_past_the_trace_end_and_answers_late_admits(kafka_bootstrap, topic_prefix):
    stats, events, took = await _settle(kafka_bootstrap, topic_prefix, LATE_PODS, reject=("never-admitted",))
    # the rejected one will never run: the run does not wait out settle_wall_s for it
    assert stats.stopped_because == "every workload done"
    assert stats.finished == 2 and stats.not_to_run == 1 and stats.running == 0 and stats.waiting == 0

    def at(event_type: str, name: str) -> str:
        (e,) = [e for e in events if e.event_type == event_type and e.payload.name == name]
        return e.occurred_at

    assert at("workload.finished.v1", "runs-on") == "2026-11-29T09:05:02Z"
    assert at("workload.finished.v1", "admitted-late") == "2026-11-29T09:03:32Z"
    assert stats.sim_seconds >= 302
    # the last event (302 s) is 1.5 s of wall after the start at 120x; nothing waited out 1.5 s more
    assert took < 302 / 120 + 1.5 + 1.0


async def test_settling_gives_up_on_a_workload_never_admitted(kafka_bootstrap, topic_prefix):
    stats, _, took = await _settle(kafka_bootstrap, topic_prefix, LATE_PODS, never=("never-admitted",))
    assert stats.stopped_because.startswith("nothing happened for") and "1 workloads not done" in stats.stopped_because
    assert stats.finished == 2 and stats.waiting == 1
    assert took < 30


async def test_without_settling_the_run_ends_at_the_trace_end(kafka_bootstrap, topic_prefix):
    stop = asyncio.Event()
    admitter = asyncio.create_task(_admitter(kafka_bootstrap, topic_prefix, stop))
    # 3 s of wall for the round trip to the admitter (at 120x it had 1 s, too tight on a busy machine)
    stats = await run_simulation(kafka_bootstrap, topic_prefix, LATE_PODS[:1], speed=40.0, duration_s=120,
                                 tick_every_s=60, nodes=synthetic_nodes(), tick_holdback_wall_s=0.3)
    stop.set()
    await admitter
    assert stats.stopped_because == "the trace's end"
    assert stats.finished == 0 and stats.running == 1  # its finish (302 s) was past the end: dropped
