"""The trace-driven cluster simulator: stands in for the watcher when no cluster is given.

It publishes what the watcher would observe — ``namespace.labels.v1`` and ``node.capacity.v1``
at the start, ``workload.submitted.v1`` at each pod's creation time, ``clock.tick.v1`` every
``tick_every_s`` simulated seconds — and answers ``qm.actions`` the way a cluster would:

* ``action.admit.v1`` → ``pod.running.v1`` ``start_delay_s`` after the admit's event time,
  then ``pod.finished.v1`` + ``workload.finished.v1`` the pod's trace duration later;
* ``action.evict.v1`` → ``pod.finished.v1`` (Failed) after the grace period; the workload is
  then suspended with the rest of its run time and waits for a new admit;
* ``action.cleanup.v1`` → the workload is deleted (``workload.finished.v1``, not succeeded).

Event times come from the trace and from the actions' own event times, never from the wall
clock, so the same trace and the same admissions always give the same events and ids. The
wall clock only paces publication: ``speed`` simulated seconds per wall second. Ticks are held
back ``tick_holdback_wall_s`` wall seconds so an admit in flight gets answered before time
moves past it (at high speeds raise the queue-manager's QM_PODS_READY_TIMEOUT_S as well).

A run ends at ``duration_s`` (default: the last submission plus a tick), dropping what would
happen later. With ``settle_wall_s`` it goes on instead, as a cluster would: it keeps ticking,
answers admits that come late and runs their pods to their end, and stops once nothing is
scheduled and every workload is done, or nothing happened for ``settle_wall_s`` wall seconds
(workloads that never get admitted, e.g. too big for any queue). A workload rejected by policy
or deactivated counts as done, as a Job a validating webhook refused is never created: it reads
those verdicts on ``qm.workloads``. A last tick then moves time ``close_books_s`` further, so
that a ledger which closes hours late (CostSettings closeDelaySeconds) closes the last ones
too. A replay compressed 300,000-fold needs this: a second of decision latency is 83 trace
hours, and a reservation the cluster never ran would be billed reserved-idle to the end.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from services.adapters.cohort_stream import FactRouter
from services.adapters.kueue_config import KueueConfig
from services.adapters.rdkafka_publisher import RdkafkaPublisher
from services.contracts.codec import ContractError, Envelope, decode, decode_all, encode_bundle, parse_utc
from services.contracts.events import ActionAdmit, ActionCleanup, ActionEvict
from services.sim.config import synthetic_nodes
from services.sim.workloads import (
    PRODUCER,
    SIM_EPOCH,
    Compression,
    SimWorkload,
    namespace_events,
    node_events,
    node_for,
    pod_finished,
    pod_running,
    submitted_event,
    tick_event,
    workload_finished,
    workloads_from_trace,
)
from services.trace.alibaba import TEAM_NAMESPACES, TraceNode, TracePod, read_pods
from services.trace.synthetic import synthetic_pods

__all__ = ["SimStats", "Simulator", "load_trace", "run_simulation"]


@dataclass(slots=True)
class SimStats:
    """Progress counters (workloads), for the live view."""

    sim_time: str = ""
    sim_seconds: float = 0.0
    submitted: int = 0
    admitted: int = 0  # admits applied (a re-admitted workload counts again)
    running: int = 0  # now
    finished: int = 0
    evicted: int = 0
    deleted: int = 0  # deleted by their owner before finishing (trace pods that never ran)
    not_to_run: int = 0  # rejected by policy or deactivated (read in settle mode only)
    waiting: int = 0  # submitted, not running, not done (pending or suspended)
    gpu_running_milli: int = 0
    events_published: int = 0
    actions_seen: int = 0
    done: bool = False
    stopped_because: str = ""  # why the run ended (set with done)
    skipped_wall_s: float = 0.0  # wall time saved by skipping quiet stretches (skip_quiet_wall_s)
    skips: int = 0

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


ProgressCallback = Callable[[SimStats], Awaitable[None] | None]


def load_trace(trace: str | Path | Sequence[TracePod] | None, *, seed: int = 2023, count: int = 2000) -> list[TracePod]:
    """A trace path (Alibaba openb pod-list CSV), pods, or None → the synthetic look-alike."""
    if trace is None or trace == "":
        return synthetic_pods(count, seed=seed)
    if isinstance(trace, (str, Path)):
        return read_pods(trace)
    return list(trace)


# Verdicts after which a workload never runs (settle mode): the cluster stops waiting for it.
_NOT_TO_RUN_TYPES = ("workload.rejected.v1", "workload.deactivated.v1")
_NOT_TO_RUN = tuple(f'"{t}"'.encode() for t in _NOT_TO_RUN_TYPES)


@dataclass(slots=True)
class _State:
    w: SimWorkload
    status: str = "new"  # new | waiting | starting | running | suspended | done | not-to-run
    attempt: int = 0
    remaining_s: float | None = None
    started_s: float = 0.0
    node: str | None = None
    admit: Envelope | None = None
    evicting: bool = False  # an eviction is under way (its grace period runs)
    readmit: Envelope | None = None  # an admit that came while it still ran (before its eviction completed)


@dataclass(slots=True)
class _Item:
    """One scheduled event, ordered by (due_wall, sim_s, seq)."""

    due_wall: float
    sim_s: float
    seq: int
    kind: str
    uid: str = ""
    attempt: int = 0
    cause: Envelope | None = None
    phase: str = ""

    def __lt__(self, other: _Item) -> bool:
        # By hand: the dataclass's generated order built two tuples per comparison, and the
        # heap compares ~17 times per push and pop (4% of the Kueue runner's samples).
        if self.due_wall != other.due_wall:
            return self.due_wall < other.due_wall
        if self.sim_s != other.sim_s:
            return self.sim_s < other.sim_s
        return self.seq < other.seq


class Simulator:
    """One run. Use :func:`run_simulation` unless you need the pieces (tests do)."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        workloads: Sequence[SimWorkload],
        *,
        speed: float = 60.0,
        duration_s: float | None = None,
        tick_every_s: float = 60.0,
        start_delay_s: float = 2.0,
        nodes: Sequence[TraceNode] = (),
        namespaces: Sequence[str] = TEAM_NAMESPACES,
        on_progress: ProgressCallback | None = None,
        progress_every_s: float = 0.5,
        tick_holdback_wall_s: float = 1.0,
        settle_wall_s: float | None = None,
        close_books_s: float = 0.0,
        skip_quiet_wall_s: float | None = None,
        fact_router: FactRouter | None = None,
    ) -> None:
        self.bootstrap, self.prefix = bootstrap, prefix
        # As the watcher does: the pod and workload facts of a workload in a configured queue
        # go straight onto its cohort's stream (ADR 0075); without a router, onto qm.cluster
        self.fact_router = fact_router
        self._routed: dict[str, list[Envelope]] = {}  # cohort key -> facts not yet sent
        self.workloads = {w.uid: _State(w, remaining_s=w.run_s) for w in workloads}
        self.speed = speed
        last = max((w.submit_s for w in workloads), default=0.0)
        self.end_s = duration_s if duration_s is not None else last + tick_every_s
        self.tick_every_s = tick_every_s
        self.start_delay_s = start_delay_s
        self.nodes = list(nodes)
        self.namespaces = list(namespaces)
        self.nodes_by_flavor: dict[str, list[str]] = {}
        for node in self.nodes:
            self.nodes_by_flavor.setdefault(node.flavor, []).append(node.name)
        self.on_progress = on_progress
        self.progress_every_s = progress_every_s
        self.holdback = tick_holdback_wall_s
        self.settle_wall_s = settle_wall_s
        self.close_books_s = close_books_s
        self.skip_quiet_wall_s = skip_quiet_wall_s
        self.stats = SimStats()
        self._heap: list[_Item] = []
        self._scheduled = 0  # items in the heap other than ticks: what will happen without new commands
        self._last_activity = 0.0  # wall time of the last command or workload event (settle mode)
        self._sim_now = 0.0  # event time of the last item handled
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._seen_actions: set[str] = set()
        self._clock: Compression | None = None
        self._bus: RdkafkaPublisher | None = None

    # ------------------------------------------------------------------ scheduling

    def _push(self, kind: str, sim_s: float, *, uid: str = "", attempt: int = 0, cause: Envelope | None = None,
              phase: str = "", extra_wall: float = 0.0) -> None:
        assert self._clock is not None
        due = max(self._clock.wall_for(sim_s) + extra_wall, 0.0)
        if kind != "tick":
            self._scheduled += 1
        heapq.heappush(self._heap, _Item(due, sim_s, next(self._seq), kind, uid, attempt, cause, phase))
        self._wake.set()

    def on_action(self, envelope: Envelope) -> None:
        """Apply one qm.actions command (idempotent on event id)."""
        if envelope.event_id in self._seen_actions:
            return
        self._seen_actions.add(envelope.event_id)
        self._last_activity = time.monotonic()
        payload = envelope.payload
        st = self.workloads.get(getattr(payload, "workload_uid", ""))
        if st is None:
            return
        self.stats.actions_seen += 1
        at = (parse_utc(envelope.occurred_at) - SIM_EPOCH).total_seconds()
        if isinstance(payload, ActionAdmit):
            if st.status in ("starting", "running"):
                # A new admission of a workload that still runs: the queue-manager requeued and
                # readmitted it after an eviction whose pods still stop (the grace period), or
                # whose command has not even arrived (evictions come from the preemption
                # service, admissions from the queue-manager: no order between the two). As in
                # Kubernetes, it starts again once the eviction is done.
                st.readmit = envelope
                return
            if st.status not in ("waiting", "suspended", "new"):
                return  # already admitted or gone: a duplicate
            self._admit(st, envelope, at)
        elif isinstance(payload, ActionEvict):
            if st.status not in ("starting", "running"):
                return
            st.evicting = True
            self._push("evicted", at + max(payload.grace_period_s, 0), uid=st.w.uid, attempt=st.attempt,
                       cause=envelope)
        elif isinstance(payload, ActionCleanup):
            if st.status == "done":
                return
            self._push("delete", at, uid=st.w.uid, attempt=st.attempt, cause=envelope, phase="Deleted")

    def _admit(self, st: _State, envelope: Envelope, at: float) -> None:
        payload = envelope.payload
        st.attempt += 1
        st.status = "starting"
        st.admit = envelope
        st.node = node_for(st.w, payload.flavors, self.nodes_by_flavor)
        self.stats.admitted += 1
        self._push("start", at + self.start_delay_s, uid=st.w.uid, attempt=st.attempt, cause=envelope)

    # ------------------------------------------------------------------ event handling

    async def _emit(self, topic: str, key: str, envelope: Envelope) -> None:
        assert self._bus is not None
        routed = self.fact_router.outputs(envelope) if self.fact_router and topic == "qm.cluster" else None
        if routed:  # sent by _send_routed, with the other facts of this burst under the same key
            for output in routed:
                self._routed.setdefault(output.key, []).append(output.envelope)
        else:
            await self._bus.publish(topic, key, envelope)
        self.stats.events_published += 1

    async def _send_routed(self) -> None:
        """The facts routed since the last call, one bundle record per cohort key (ADR 0034),
        as admission's fact lane sends a round's: called whenever the run loop is about to wait
        or flush, so a fact waits no longer than the burst of events it came in."""
        routed, self._routed = self._routed, {}
        assert self._bus is not None
        for key, envelopes in routed.items():
            for value, _count in encode_bundle(envelopes):
                await self._bus.publish_raw("qm.workloads", key.encode(), value)

    async def _handle(self, item: _Item) -> None:
        self._sim_now = max(self._sim_now, item.sim_s)
        if item.kind == "tick":
            await self._emit("qm.clock", "cluster-sim", tick_event(item.sim_s))
            if self.settle_wall_s is not None and item.sim_s + self.tick_every_s > self.end_s:
                # past the trace's end time goes on while anything may still happen
                self._push("tick", item.sim_s + self.tick_every_s, extra_wall=self.holdback)
            return
        self._scheduled -= 1
        self._last_activity = time.monotonic()
        st = self.workloads[item.uid]
        w = st.w
        if item.kind == "submit":
            st.status = "waiting"
            self.stats.submitted += 1
            await self._emit("qm.cluster", w.uid, submitted_event(w))
            if w.deadline_s is not None:
                self._push("delete", w.deadline_s, uid=w.uid, phase="Deleted")
            return
        if item.kind == "delete":
            if st.status == "done":
                return
            if st.status == "running":
                await self._emit("qm.cluster", w.uid, pod_finished(w, st.attempt, item.sim_s, "Deleted", st.node,
                                                                   item.cause))
                self._note_stopped(w)
            st.status = "done"
            self.stats.deleted += 1
            await self._emit("qm.cluster", w.uid, workload_finished(w, item.sim_s, False, item.cause))
            return
        if item.attempt != st.attempt:
            return  # scheduled for an earlier admission
        if item.kind == "start" and st.status == "starting":
            st.status = "running"
            st.started_s = item.sim_s
            self.stats.running += 1
            self.stats.gpu_running_milli += w.gpu_milli
            await self._emit("qm.cluster", w.uid, pod_running(w, st.attempt, item.sim_s, st.node or "", item.cause))
            if st.remaining_s is not None:
                self._push("finish", item.sim_s + st.remaining_s, uid=w.uid, attempt=st.attempt, cause=item.cause)
        elif item.kind == "finish" and st.status == "running":
            st.status = "done"
            self._note_stopped(w)
            self.stats.finished += 1
            phase = "Succeeded" if w.succeeds else "Failed"
            await self._emit("qm.cluster", w.uid, pod_finished(w, st.attempt, item.sim_s, phase, st.node, item.cause))
            await self._emit("qm.cluster", w.uid, workload_finished(w, item.sim_s, w.succeeds, item.cause))
        elif item.kind == "evicted" and st.status in ("starting", "running"):
            if st.status == "running":
                if st.remaining_s is not None:
                    st.remaining_s = max(st.remaining_s - (item.sim_s - st.started_s), 0.0)
                self._note_stopped(w)
                await self._emit("qm.cluster", w.uid,
                                 pod_finished(w, st.attempt, item.sim_s, "Failed", st.node, item.cause))
            st.status = "suspended"
            st.evicting = False
            self.stats.evicted += 1
            if st.readmit is not None:
                readmit, st.readmit = st.readmit, None
                self._admit(st, readmit, item.sim_s)

    def _skip_quiet_stretch(self, now: float) -> bool:
        """With ``skip_quiet_wall_s``: when the cluster waits on nothing, move the clock on to
        the next scheduled event other than a tick (which is then due now) and say so.

        Waiting on nothing: no command or workload event for ``skip_quiet_wall_s`` wall
        seconds, and no workload submitted and not yet admitted, suspended, or admitted and not
        yet started. Then no decision can be on its way, and the services see the same events,
        at the same event times, as at the steady pace, only sooner. The ticks in between
        become due at once and are published in order, each still after the events that
        come before it in event time. A trace with long quiet stretches (the Alibaba trace's
        first 2,700 hours hold 17 of its 8,152 pods) then takes as long as its events take."""
        if self.skip_quiet_wall_s is None or now - self._last_activity < self.skip_quiet_wall_s:
            return False
        if any(s.status in ("waiting", "suspended", "starting") for s in self.workloads.values()):
            return False
        upcoming = min((item.due_wall for item in self._heap if item.kind != "tick"), default=None)
        if upcoming is None or upcoming <= now:
            return False  # only ticks left: they keep their pace (settle mode stops on quiet)
        assert self._clock is not None
        shift = upcoming - now
        for item in self._heap:  # the same shift for all: still a heap
            item.due_wall -= shift
        self._clock = Compression(self._clock.speed, self._clock.wall0 - shift, self._clock.sim0)
        self.stats.skipped_wall_s += shift
        self.stats.skips += 1
        return True

    def _note_stopped(self, w: SimWorkload) -> None:
        self.stats.running -= 1
        self.stats.gpu_running_milli -= w.gpu_milli

    # ------------------------------------------------------------------ loop

    async def _consume_actions(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    try:
                        envelope = decode(record.value)
                    except ContractError:
                        continue  # not ours to dead-letter; the watcher's consumer does that
                    self.on_action(envelope)

    def _unfinished(self) -> int:
        """Workloads submitted and not done: waiting, suspended, starting or running."""
        return sum(1 for s in self.workloads.values() if s.status not in ("new", "done", "not-to-run"))

    def _settled(self, now: float) -> str:
        """Why a run in settle mode may stop now ("" if it may not): nothing is scheduled past
        the trace's end, and every workload is done or nothing has happened for a while."""
        if self._scheduled or self._clock is None or self._clock.sim_at(now) < self.end_s:
            return ""
        unfinished = self._unfinished()
        if not unfinished:
            return "every workload done"
        quiet = now - self._last_activity
        if quiet >= self.settle_wall_s:
            return f"nothing happened for {quiet:.1f} s; {unfinished} workloads not done (never admitted, or waiting)"
        return ""

    async def _consume_verdicts(self, consumer: AIOKafkaConsumer) -> None:
        """Settle mode: note the workloads that will never run (rejected, deactivated). Every
        other record of qm.workloads is passed over unparsed."""
        while True:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    if not any(marker in record.value for marker in _NOT_TO_RUN):
                        continue
                    try:
                        envelopes = decode_all(record.value)  # a bundle: each of its verdicts (ADR 0034)
                    except ContractError:
                        continue  # the services' consumers dead-letter it
                    for envelope in envelopes:
                        st = self.workloads.get(getattr(envelope.payload, "uid", ""))
                        if st is not None and envelope.event_type in _NOT_TO_RUN_TYPES \
                                and st.status in ("new", "waiting", "suspended"):
                            st.status = "not-to-run"
                            self.stats.not_to_run += 1
                            self._last_activity = time.monotonic()

    async def _progress(self, now_sim: float, *, done: bool = False) -> None:
        self.stats.sim_seconds = now_sim
        self.stats.sim_time = tick_event(now_sim).occurred_at
        self.stats.waiting = sum(1 for s in self.workloads.values() if s.status in ("waiting", "suspended", "starting"))
        self.stats.done = done
        if self.on_progress is not None:
            result = self.on_progress(replace(self.stats))
            if asyncio.iscoroutine(result):
                await result

    async def _reader_from_now(self, topic: str) -> AIOKafkaConsumer:
        """A consumer of every partition of one topic, from its end (earlier runs' records are
        not ours), positioned before anything is published."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                    auto_offset_reset="earliest")
        await consumer.start()
        topic = self.prefix + topic
        partitions = consumer.partitions_for_topic(topic)
        if partitions is None:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        if tps:
            await consumer.seek_to_end(*tps)
            for tp in tps:
                await consumer.position(tp)
        return consumer

    async def run(self) -> SimStats:
        consumers = [await self._reader_from_now("qm.actions")]
        readers = [asyncio.create_task(self._consume_actions(consumers[0]))]
        if self.settle_wall_s is not None:
            consumers.append(await self._reader_from_now("qm.workloads"))
            readers.append(asyncio.create_task(self._consume_verdicts(consumers[1])))
        try:
            async with RdkafkaPublisher(self.bootstrap, self.prefix) as bus:
                self._bus = bus
                self._clock = Compression(self.speed, time.monotonic())
                for envelope in namespace_events(self.namespaces):
                    await self._emit("qm.cluster", envelope.payload.namespace, envelope)
                for envelope in node_events(self.nodes):
                    await self._emit("qm.cluster", envelope.payload.node, envelope)
                for st in self.workloads.values():
                    if st.w.submit_s < self.end_s:
                        self._push("submit", st.w.submit_s, uid=st.w.uid)
                tick = 0.0
                while tick <= self.end_s:
                    self._push("tick", tick, extra_wall=self.holdback)
                    tick += self.tick_every_s
                await bus.flush()
                last_progress = 0.0
                settling = self.settle_wall_s is not None
                self._last_activity = time.monotonic()
                self.stats.stopped_because = "the trace's end"
                while self._heap:
                    now = time.monotonic()
                    if now - last_progress >= self.progress_every_s:
                        last_progress = now
                        await self._send_routed()
                        await bus.flush()
                        now_sim = max(self._clock.sim_at(now), 0.0)
                        await self._progress(now_sim if settling else min(now_sim, self.end_s))
                    if settling and (why := self._settled(now)):
                        self.stats.stopped_because = why
                        if self.close_books_s > 0:  # on the tick grid, past every event
                            last = self._sim_now + self.close_books_s
                            self._sim_now = -(-last // self.tick_every_s) * self.tick_every_s
                            await self._emit("qm.clock", "cluster-sim", tick_event(self._sim_now))
                        break
                    head = self._heap[0]
                    if head.sim_s > self.end_s and not settling:
                        heapq.heappop(self._heap)
                        self._scheduled -= head.kind != "tick"
                        continue
                    if head.due_wall > now and self._skip_quiet_stretch(now):
                        continue
                    if head.due_wall > now:
                        await self._send_routed()
                        self._wake.clear()
                        try:
                            await asyncio.wait_for(self._wake.wait(), min(head.due_wall - now, 0.2))
                        except TimeoutError:
                            pass
                        for reader in readers:
                            if reader.done():
                                reader.result()  # surface a consumer failure
                        continue
                    heapq.heappop(self._heap)
                    await self._handle(head)
                await self._send_routed()
                await bus.flush()
                await self._progress(max(self.end_s, self._sim_now) if settling else self.end_s, done=True)
        finally:
            for reader in readers:
                reader.cancel()
                try:
                    await reader
                except (asyncio.CancelledError, Exception):
                    pass
            for consumer in consumers:
                await consumer.stop()
        return self.stats


async def run_simulation(
    bootstrap: str,
    prefix: str = "",
    trace: str | Path | Sequence[TracePod] | None = None,
    speed: float = 60.0,
    duration_s: float | None = None,
    *,
    start_s: int = 0,
    tick_every_s: float = 60.0,
    start_delay_s: float = 2.0,
    nodes: Sequence[TraceNode] | None = None,
    namespaces: Sequence[str] = TEAM_NAMESPACES,
    on_progress: ProgressCallback | None = None,
    progress_every_s: float = 0.5,
    tick_holdback_wall_s: float = 1.0,
    settle_wall_s: float | None = None,
    close_books_s: float = 0.0,
    seed: int = 2023,
    count: int = 2000,
    config_dir: str | Path | None = None,
) -> SimStats:
    """Run the simulator until ``duration_s`` simulated seconds have passed (default: the last
    submission). ``trace``: an Alibaba pod-list CSV path, pods, or None for the synthetic trace
    (``count`` pods, ``seed``). ``nodes`` default to the synthetic fleet (use
    services.trace.read_nodes for the real node list). ``on_progress`` (sync or async) gets a
    copy of the counters every ``progress_every_s`` wall seconds and once at the end.
    ``settle_wall_s``, ``close_books_s``: go on past the end until the cluster settles, then
    tick once more that far ahead (see the module's text). ``config_dir``: the Kueue objects the
    services run with; given, the pod and workload facts of workloads in its queues go straight
    onto their cohort's stream, as the watcher sends them (ADR 0075)."""
    pods = load_trace(trace, seed=seed, count=count)
    workloads = workloads_from_trace(pods, start_s=start_s, duration_s=duration_s)
    simulator = Simulator(
        bootstrap, prefix, workloads, speed=speed, duration_s=duration_s, tick_every_s=tick_every_s,
        start_delay_s=start_delay_s, nodes=synthetic_nodes() if nodes is None else nodes, namespaces=namespaces,
        on_progress=on_progress, progress_every_s=progress_every_s, tick_holdback_wall_s=tick_holdback_wall_s,
        settle_wall_s=settle_wall_s, close_books_s=close_books_s, fact_router=fact_router_for(config_dir),
    )
    return await simulator.run()


def fact_router_for(config_dir: str | Path | None) -> FactRouter | None:
    """The router a simulated cluster sends its facts through, as the watcher does with the
    services' QM_CONFIG_DIR (ADR 0075); None without a directory."""
    return FactRouter(KueueConfig.load(config_dir), PRODUCER) if config_dir else None
