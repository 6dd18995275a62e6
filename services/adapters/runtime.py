"""The thin shell every service shares: one faust App per service, its own consumer group,
/metrics, /healthz, /readyz, JSON logs, decode-or-dead-letter, and idempotent folds.

A service module builds a `ServiceRuntime`, registers handlers with `consume()`, keeps its
state in `table()`s and stores it with `apply_once()`; it never talks to aiokafka directly.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
from faust.streams import _current_event as _faust_current_event
from faust.streams import current_event
from faust.transport.drivers.aiokafka import Consumer as _KafkaConsumer
from faust.transport.drivers.aiokafka import ensure_aiokafka_TP
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest

from services.adapters import logs
from services.adapters.bus import dlq_headers
from services.adapters.gc_tuning import tune_gc
from services.adapters.settings import Settings
from services.contracts.codec import ContractError, Envelope, decode, encode
from services.contracts.schemas import topic_specs

MESSAGES_CONSUMED = Counter("qm_messages_consumed_total", "Messages read from the bus", ["service", "topic"])
MESSAGES_DEAD_LETTERED = Counter(
    "qm_messages_dead_lettered_total", "Messages sent to a dead-letter topic", ["service", "topic", "kind"]
)
DUPLICATES_SKIPPED = Counter("qm_duplicate_events_skipped_total", "Redelivered events ignored", ["service", "table"])
REWINDS = Counter(
    "qm_partition_rewinds_total",
    "Partitions read again from their last applied offset because the consumer skipped events",
    ["service", "topic"],
)
REFETCHED_AFTER_REBALANCE = Counter(
    "qm_events_left_for_refetch_total",
    "Events fetched before a rebalance and left unprocessed (or their results discarded); "
    "they are read again from the committed offset",
    ["service", "topic"],
)

# How many recent event ids each table key remembers. Redelivery after a crash only replays
# what was consumed since the last offset commit (a few seconds), far fewer than this per key.
SEEN_WINDOW = 4096
# How long a partition read again from its cursor may keep delivering older fetches before
# the runtime seeks once more.
REWIND_RETRY_S = 1.0
# How far a partition's stored cursor may trail events that changed no state.
CURSOR_LAG_MAX = 1000
# Largest record a service may write. A table value holds one cohort's whole queue state, which
# passed Kafka's 1 MB default for a 100-queue cohort with thousands pending (the queue-manager
# crashed with MessageSizeTooLargeError in the large-scale benchmark). Changelog topics are
# created with the same limit.
MAX_RECORD_BYTES = int(os.environ.get("QM_MAX_RECORD_BYTES", 16 * 1024 * 1024))


class _Batch:
    """What one batch of events has staged: output acknowledgements to wait for, and table
    values to store once they have arrived."""

    def __init__(self, cursors: Any = None) -> None:
        self.acks: list[Any] = []
        self.writes: dict[tuple[int, str], tuple[Any, str, Any, Any]] = {}
        self.cursors = cursors  # the agent's applied-offset table
        self.next_offsets: dict[Any, tuple[int, Any]] = {}  # tp -> (next offset, last event)

    def staged(self, table: Any, key: str) -> Any:
        hit = self.writes.get((id(table), key))
        return hit[2] if hit else None

    async def commit(self) -> None:
        """Outputs acknowledged, then states written to their changelogs *and acknowledged*,
        before the stream may move past (and later commit) these events. faust's own
        `table[key] = value` only buffers the changelog record, and its flush before an offset
        commit gives up after 100 ms, so a SIGKILL could commit offsets whose state was never
        written: we wait for the changelog acks ourselves."""
        for ack in self.acks:
            await ack
        changelog_acks = [_store(table, key, value, event) for table, key, value, event in self.writes.values()]
        for ack in changelog_acks:
            await ack
        # Only once the states are stored may the cursor say their events are applied. A
        # batch that stored nothing need not move the stored cursor (the worker checks with
        # its own in memory); re-applying it after a restart stores nothing and re-sends outputs
        # with the same ids. Bounded so a
        # restart does not re-read a long run of such events.
        cursor_acks = []
        for tp, (offset, event) in self.next_offsets.items():
            stored = self.cursors.data.get(str(tp.partition))
            if self.writes or stored is None or offset - stored >= CURSOR_LAG_MAX:
                cursor_acks.append(_store(self.cursors, str(tp.partition), offset, event))
        for ack in cursor_acks:
            await ack


def _store(table: Any, key: str, value: Any, event: Any) -> Any:
    """Write one table value and send its changelog record to the event's partition."""
    # faust keys a table's changelog partition and its store on "the current event".
    token = _faust_current_event.set(weakref.ref(event))
    try:
        ack = table.send_changelog(event.message.partition, key, value)
        table.data[key] = value
        return ack
    finally:
        _faust_current_event.reset(token)


_current_batch: ContextVar[_Batch | None] = ContextVar("qm_batch", default=None)


class _HandledOnlyConsumer(_KafkaConsumer):
    """faust's consumer, acknowledging a message of a `consume()`d topic only once the runtime
    has handled it and stored the result.

    faust itself acknowledges messages it never processed: one fetched before a rebalance and
    skipped after it, and the rest of a `take()` buffer when the agent stops. An offset commit
    could then pass events whose state was never stored, and the next owner of the partition
    would never see them (seen in CI: a window of a cohort's events lost after two rebalances
    in a row). Dropping those acks keeps Kafka's committed offsets honest; where reading
    resumes is decided by the runtime's applied-offset cursors (`seek_to_committed`)."""

    def ack(self, message: Any) -> bool:
        app = self.app
        guarded = getattr(app, "qm_guarded_topics", ())
        if message.topic in guarded and message not in app.qm_handled:
            message.acked = True
            self._unacked_messages.discard(message)
            return False
        return super().ack(message)

    async def seek_to_committed(self) -> Any:
        """Position every assigned partition where its agent's applied-offset cursor says
        (see `ServiceRuntime.positions_after_assignment`), and report those positions to faust
        as the committed offsets, so that its commit bookkeeping starts there too."""
        committed = await super().seek_to_committed()
        runtime = getattr(self.app, "qm_runtime", None)
        if runtime is None:
            return committed
        thread = self._thread
        consumer = thread._ensure_consumer()
        unstarted = runtime.unstarted(committed)
        starts = await thread.call_thread(consumer.beginning_offsets, unstarted) if unstarted else {}
        positions = runtime.positions_after_assignment(committed, starts)
        for tp, offset in positions.items():
            if offset != committed.get(tp):
                await thread.call_thread(self._seek_now, consumer, tp, offset)
        return {**committed, **positions}

    @staticmethod
    async def _seek_now(consumer: Any, tp: Any, offset: int) -> None:
        consumer.seek(ensure_aiokafka_TP(tp), offset)

    async def seek_safely(self, tp: Any, offset: int) -> bool:
        """Seek one partition on the consumer's own thread. faust's `seek` touches aiokafka's
        fetcher from the event loop's thread and races a fetch in progress (seen in CI: the
        worker crashed with KeyError in `fetched_records`). False if the partition is no
        longer ours; the next assignment positions it anyway."""
        thread = self._thread
        try:
            await thread.call_thread(self._seek_now, thread._ensure_consumer(), tp, offset)
        except Exception as error:  # noqa: BLE001 - e.g. IllegalStateError after a revocation
            logging.getLogger("qm.runtime").warning("seek of %s to %s refused: %r", tp, offset, error)
            return False
        self._read_offset[tp] = offset if offset else None
        return True


class _App(faust.App):
    """A faust App whose consumer acknowledges only what the runtime handled (see above)."""

    qm_guarded_topics: set[str]
    qm_handled: weakref.WeakSet
    qm_runtime: ServiceRuntime

    def _new_transport(self):
        transport = super()._new_transport()
        transport.Consumer = _HandledOnlyConsumer
        return transport


class TemporaryError(Exception):
    """A handler failure worth retrying (a dependency is briefly away); the message is redelivered."""


@dataclass(frozen=True, slots=True)
class Output:
    """One message a fold wants published: topic name (from topics.yaml), key, envelope."""

    topic: str
    key: str
    envelope: Envelope


Handler = Callable[[Envelope, Any], Awaitable[None]]


class ServiceRuntime:
    def __init__(self, settings: Settings, **faust_options: Any) -> None:
        self.settings = settings
        logs.configure(settings.service, settings.log_level)
        Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
        self.log = logs.bind(logging.getLogger(f"qm.{settings.service}"), service=settings.service)
        self.app = _App(
            settings.app_id,
            broker=f"kafka://{settings.kafka_bootstrap}",
            store=settings.store,
            datadir=f"{settings.data_dir}/{settings.app_id}",
            web_host=settings.web_host,
            web_port=settings.web_port,
            web_bind=settings.web_host,
            topic_replication_factor=1,
            topic_allow_declare=True,
            consumer_auto_offset_reset="earliest",
            producer_acks=-1,
            table_standby_replicas=0,
            # Handlers are idempotent folds (same event, same state, same outputs), so a rebalance
            # need not wait for an event in flight; waiting could deadlock with an agent that is
            # itself waiting for the acknowledgement of its outputs (seen after SIGKILL restarts).
            stream_wait_empty=False,
            producer_max_request_size=MAX_RECORD_BYTES,
            # A crashed worker's partitions move on within seconds, not faust's default minute.
            broker_session_timeout=float(os.environ.get("QM_SESSION_TIMEOUT_S", 10)),
            broker_heartbeat_interval=float(os.environ.get("QM_HEARTBEAT_INTERVAL_S", 2)),
            broker_rebalance_timeout=float(os.environ.get("QM_REBALANCE_TIMEOUT_S", 20)),
            **faust_options,
        )
        self.app.qm_guarded_topics = set()
        self.app.qm_handled = weakref.WeakSet()
        self.app.qm_runtime = self
        # Per consumed topic: the table of applied offsets, and this worker's cursors for the
        # partitions it owns now (the next offset each expects; reset at every assignment).
        self._cursor_tables: dict[str, faust.Table] = {}
        self._next_offset: dict[Any, int] = {}
        self._rewinding: dict[Any, tuple[int, float]] = {}  # tp -> (offset sought, when)
        self.app.timer(REWIND_RETRY_S, name="retry_rewinds")(self._retry_rewinds)
        self._topics: dict[str, faust.TopicT] = {}
        self._seen_index: dict[tuple[int, str], tuple[list[str], set[str]]] = {}
        self.batch_size = int(os.environ.get("QM_BATCH_SIZE", 500))
        self.batch_within_s = float(os.environ.get("QM_BATCH_WITHIN_S", 0.02))
        self._register_pages()

    # -- topics -------------------------------------------------------------------------

    def topic(self, name: str) -> faust.TopicT:
        """A topic of topics.yaml (or its .dlq) with raw bytes in and out: the codec is ours."""
        if name not in self._topics:
            base = name.removesuffix(".dlq")
            spec = topic_specs()[base]
            self._topics[name] = self.app.topic(
                self.settings.topic(name),
                key_serializer="raw",
                value_serializer="raw",
                partitions=1 if name.endswith(".dlq") else spec.partitions,
                internal=False,
            )
        return self._topics[name]

    def consume(
        self, topic_name: str, handler: Handler, *, agent_name: str | None = None, batched: bool = False
    ) -> None:
        """Run `handler(envelope, event)` for every readable message of a topic.

        `batched=True` stages table writes per batch of up to QM_BATCH_SIZE events: only for
        an agent that is the sole writer of its tables (another agent would not see the
        staged values).

        Unreadable or invalid messages go to `<topic>.dlq` with the reason in headers, and
        the stream goes on. A handler's unexpected exception dead-letters that message too
        (with the exception named), so one bad event cannot stop a service."""
        source = self.topic(topic_name)
        runtime = self

        async def handle(event) -> None:
            MESSAGES_CONSUMED.labels(runtime.settings.service, topic_name).inc()
            token = _faust_current_event.set(weakref.ref(event))
            try:
                await handle_current(event)
            finally:
                _faust_current_event.reset(token)

        async def handle_current(event) -> None:
            try:
                envelope = decode(event.value)
            except ContractError as error:
                await runtime.dead_letter(topic_name, event, f"contract: {error}", kind="contract")
                return
            try:
                await handler(envelope, event)
            except TemporaryError:
                raise  # let faust crash and restart the agent: the message is redelivered
            except Exception as error:  # noqa: BLE001 - a handler bug must not stop the stream
                runtime.log.exception(
                    "handler failed; message dead-lettered",
                    event_id=envelope.event_id,
                    event_type=envelope.event_type,
                    topic=topic_name,
                )
                await runtime.dead_letter(
                    topic_name, event, f"handler: {type(error).__name__}: {error}", kind="handler"
                )

        async def batches(stream):
            if not batched:
                async for event in stream.events():
                    yield [event]
            else:
                async for events in stream.take_events(runtime.batch_size, within=runtime.batch_within_s):
                    yield events

        async def agent(stream):
            async for events in batches(stream):
                await runtime.process(events, handle, topic_name)

        agent.__name__ = agent_name or f"consume_{topic_name.replace('.', '_')}"
        self.app.agent(source, name=agent.__name__)(agent)
        self.guard(source, agent.__name__)

    def guard(self, source: faust.TopicT, agent_name: str) -> None:
        """Acknowledge messages of this topic only once `process()` has handled them, and keep
        the offset up to which its partitions are applied in a table of their own."""
        name = source.get_topic_name()
        self.app.qm_guarded_topics.add(name)
        self._cursor_tables[name] = self.table(
            f"{agent_name}-applied", partitions=source.partitions or 1,
            help=f"next offset of {name} to apply, per partition",
        )

    async def process(self, events: list[Any], handle: Callable[[Any], Awaitable[None]], label: str) -> None:
        """Apply a batch of events in offset order, then store what it staged, then let faust
        acknowledge it (ADR 0011).

        Each partition's cursor (the next offset to apply) decides what is applied: an event
        below it was applied already and is passed over; one above it means events in between
        were never applied here (faust can skip and still acknowledge them around a rebalance),
        so the partition is read again from the cursor. Outputs of a batch are awaited
        together, then its states stored, then the cursors. A batch that a rebalance overtook
        stores nothing: its events are read again by whoever owns the partition now."""
        cursors = self._cursor_tables.get(events[0].message.topic) if events else None
        batch = _Batch(cursors)
        token = _current_batch.set(batch)
        try:
            handled = []
            for event in events:
                if not self.is_current(event):
                    continue  # fetched before a rebalance: read again after it
                tp, offset = event.message.tp, event.message.offset
                expected = batch.next_offsets[tp][0] if tp in batch.next_offsets else self._next_offset.get(tp)
                if expected is not None and offset < expected:
                    handled.append(event)  # applied before
                    continue
                if expected is not None and offset > expected:
                    await self._rewind(tp, expected, offset, label)
                    continue
                self._rewinding.pop(tp, None)
                await handle(event)
                handled.append(event)
                batch.next_offsets[tp] = (offset + 1, event)
            if not all(self.is_current(event) for event in handled):
                # Its partitions may have moved and their tables been recovered anew. The
                # outputs already sent are the ones the fold sends again, with the same ids.
                REFETCHED_AFTER_REBALANCE.labels(self.settings.service, label).inc(len(handled))
                return
            await batch.commit()
            # A rebalance during the commit resets the cursors from the stored ones, which this
            # batch has just written: the same values.
            self._next_offset.update({tp: offset for tp, (offset, _) in batch.next_offsets.items()})
            self.app.qm_handled.update(event.message for event in handled)
        finally:
            _current_batch.reset(token)

    async def _rewind(self, tp: Any, expected: int, got: int, label: str) -> None:
        """Read a partition again from the first offset not yet applied (once per gap; see
        `_retry_rewinds` for when the re-read does not come)."""
        if tp in self._rewinding and self._rewinding[tp][0] == expected:
            return
        self._rewinding[tp] = (expected, time.monotonic())
        REWINDS.labels(self.settings.service, label).inc()
        self.log.warning("events skipped by the consumer; reading the partition again from the first not applied",
                         topic=tp.topic, partition=tp.partition, offset=got,
                         detail=f"first offset not applied: {expected}")
        await self.app.consumer.seek_safely(tp, expected)

    async def _retry_rewinds(self, *_app: Any) -> None:
        """Seek again where a re-read has not begun within REWIND_RETRY_S: faust drops re-read
        messages below the offset of a fetch that was still being delivered at the seek, and
        at the end of a partition no later event would notice."""
        if self.app.rebalancing:
            return
        now = time.monotonic()
        for tp, (expected, since) in list(self._rewinding.items()):
            if now - since >= REWIND_RETRY_S:
                self._rewinding[tp] = (expected, now)
                await self.app.consumer.seek_safely(tp, expected)

    def unstarted(self, committed: dict[Any, int | None]) -> list[Any]:
        """Assigned partitions with neither a stored cursor nor a committed offset."""
        return [tp for tp, offset in committed.items()
                if tp.topic in self._cursor_tables and not offset
                and self._cursor_tables[tp.topic].data.get(str(tp.partition)) is None]

    def positions_after_assignment(self, committed: dict[Any, int | None], starts: dict[Any, int]) -> dict[Any, int]:
        """Where each assigned partition of a consumed topic is read from, and the cursor
        that checks it: the stored cursor when there is one (whatever Kafka's committed offset
        says), else the committed offset, else the partition's first offset (`starts`).
        Called by the consumer after every assignment, once the tables are recovered."""
        self._next_offset.clear()
        self._rewinding.clear()
        positions = {}
        for tp, offset in committed.items():
            cursors = self._cursor_tables.get(tp.topic)
            if cursors is None:
                continue
            stored = cursors.data.get(str(tp.partition))
            position = stored if stored is not None else offset if offset else starts.get(tp)
            if position is not None:
                self._next_offset[tp] = positions[tp] = position
        return positions

    def is_current(self, event: Any) -> bool:
        """Whether an event was fetched in the consumer group's current generation and no
        rebalance is under way: only then do this worker's tables hold its partition's state."""
        app = self.app
        return (not app.rebalancing and app.flow_control.is_active()
                and event.message.generation_id == app.consumer_generation_id)

    async def dead_letter(self, topic_name: str, event: Any, error: str, *, kind: str) -> None:
        message = event.message
        self.log.warning(
            "message dead-lettered",
            topic=topic_name,
            partition=message.partition,
            offset=message.offset,
            reason=kind,
            error=error,
        )
        MESSAGES_DEAD_LETTERED.labels(self.settings.service, topic_name, kind).inc()
        fut = await self.topic(f"{topic_name}.dlq").send(
            key=message.key,
            value=message.value,
            headers=dlq_headers(error, message.topic, message.partition, message.offset, self.settings.app_id),
        )
        await fut

    async def publish(self, outputs: Iterable[Output]) -> None:
        """Send outputs; they are acknowledged by the broker before any state of the same
        batch is stored (see apply_once for why). Outside a batch, wait right here."""
        pending = [
            await self.topic(o.topic).send(key=o.key.encode(), value=encode(o.envelope)) for o in outputs
        ]
        batch = _current_batch.get()
        if batch is not None:
            batch.acks.extend(pending)
            return
        for fut in pending:
            await fut

    # -- state --------------------------------------------------------------------------

    def table(self, name: str, *, partitions: int, help: str = "") -> faust.Table:
        """A changelog-backed table; values are JSON-able dicts managed by apply_once."""
        return self.app.Table(name, default=None, partitions=partitions, value_type=None, help=help,
                              extra_topic_configs={"max.message.bytes": str(MAX_RECORD_BYTES)})

    async def apply_once(
        self,
        table: faust.Table,
        key: str,
        envelope: Envelope,
        fold: Callable[[Any, Envelope], tuple[Any, list[Output]]],
    ) -> bool:
        """Apply `fold(state, envelope) -> (state, outputs)` to one key, at most once per event id.

        Outputs are acknowledged by the broker *before* the new state is stored, so a crash
        can never leave a stored state whose outputs were lost: either the state (and the
        seen id) was written after its outputs, or the event is redelivered and recomputed,
        and its outputs carry the same deterministic ids for downstream dedupe.
        Returns False for a duplicate."""
        batch = _current_batch.get()
        entry = self.entry(table, key)
        seen_ids = self._seen_ids(table, key, entry["seen"])
        if envelope.event_id in seen_ids:
            DUPLICATES_SKIPPED.labels(self.settings.service, table.name).inc()
            return False
        state, outputs = fold(entry["state"], envelope)
        await self.publish(outputs)
        seen = entry["seen"][-(SEEN_WINDOW - 1) :]
        seen.append(envelope.event_id)
        self._seen_index[(id(table), key)] = (seen, seen_ids)
        for dropped in entry["seen"][: len(entry["seen"]) - len(seen) + 1]:
            seen_ids.discard(dropped)
        seen_ids.add(envelope.event_id)
        new_entry = {"state": state, "seen": seen}
        if batch is not None:
            batch.writes[(id(table), key)] = (table, key, new_entry, current_event())
        else:
            table[key] = new_entry
        return True

    def _seen_ids(self, table: faust.Table, key: str, seen: list[str]) -> set[str]:
        """The ids of a key's seen list as a set: scanning the list (up to SEEN_WINDOW ids) on
        every event took ~2% of the queue-manager's CPU in bench_queue. The set is kept for the
        very list object it was built from; any other list (recovered, or the stored one after
        a batch that stored nothing) is indexed anew."""
        hit = self._seen_index.get((id(table), key))
        if hit is not None and hit[0] is seen and len(hit[1]) == len(seen):
            return hit[1]
        return set(seen)

    def entry(self, table: faust.Table, key: str) -> dict:
        """A key's {"state", "seen"} as this batch sees it (staged writes first)."""
        batch = _current_batch.get()
        staged = batch.staged(table, key) if batch is not None else None
        return staged or table.get(key) or {"state": None, "seen": []}

    # -- http ---------------------------------------------------------------------------

    def _register_pages(self) -> None:
        app = self.app

        @app.page("/healthz")
        async def healthz(web, request):
            return web.json({"status": "ok", "service": self.settings.service})

        @app.page("/readyz")
        async def readyz(web, request):
            recovering = app.tables.recovery.in_recovery if app.tables else False
            # Joined its consumer group at least once: before that nothing is consumed, and on a
            # fresh broker the first join waits for the group coordinator to load.
            joined = app.consumer_generation_id > 0
            ready = joined and not app.rebalancing and not recovering
            return web.json(
                {"ready": ready, "joined": joined, "rebalancing": app.rebalancing, "recovering": recovering},
                status=200 if ready else 503,
            )

        @app.page("/metrics")
        async def metrics(web, request):
            return web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    def main(self) -> None:
        """Run as a faust worker: `python -m services.<name> worker`."""
        tune_gc()
        self.app.main()
