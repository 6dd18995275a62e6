"""The thin shell every service shares: one faust App per service, its own consumer group,
/metrics, /healthz, /readyz, JSON logs, decode-or-dead-letter, and idempotent folds.

A service module builds a `ServiceRuntime`, registers handlers with `consume()`, keeps its
state in `table()`s and stores it with `apply_once()`; it never talks to aiokafka directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
import orjson
from faust.streams import _current_event as _faust_current_event
from faust.streams import current_event
from faust.transport.consumer import ack_lock
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread as _KafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as _KafkaConsumer
from faust.transport.drivers.aiokafka import ensure_aiokafka_TP
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, Info, generate_latest

from services.adapters import (
    logs,
    worker_command,  # noqa: F401 - defines the services' `worker` command
)
from services.adapters.bus import KeyPartitioner, TypeSieve, dlq_headers
from services.adapters.gc_tuning import freeze_startup_objects, tune_gc
from services.adapters.recovered_tables import RecoveredTable
from services.adapters.settings import Settings
from services.adapters.take_batches import take_batches
from services.contracts.codec import (
    BUNDLE_MAX,
    ContractError,
    Envelope,
    documents_of,
    encode,
    encode_bundle,
    envelopes_in,
    in_bundle,
)
from services.contracts.schemas import topic_specs
from services.core.frozen import quick_init

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
PASSED_OVER = Counter(
    "qm_messages_passed_over_total",
    "Messages of event types the service does not read, dropped before faust delivers them (ADR 0030)",
    ["service", "topic"],
)
APPLIED_RECORD_AGE = Gauge(
    "qm_applied_record_age_seconds",
    "How long ago (wall clock minus the record's Kafka timestamp) the last record of a service's "
    "latest applied batch was written, per source topic: how far behind its stream the service is",
    ["service", "topic"],
)
BATCH_SECONDS = Histogram(
    "qm_batch_seconds",
    "Wall time of each batch a consuming agent applies, by step: handle (the folds, outputs "
    "staged), acks (waiting for the broker to acknowledge the batch's outputs) and commit (the "
    "cursors and the stores that fell due). An agent applies one batch at a time, so the rate of "
    "the sum over the steps is how busy its loop is: near 1, records wait for the batch under way",
    ["service", "topic", "step"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
EVENT_LOOP = Info("qm_event_loop", "The asyncio event loop this worker runs on (QM_EVENT_LOOP, ADR 0019)")

# Drop, on arrival, records of event types no handler of the topic reads (ADR 0030); 0 hands
# every record to faust, as before.
PASS_OVER_UNREAD = os.environ.get("QM_PASS_OVER_UNREAD", "1") != "0"
# How many recent event ids each table key remembers. Redelivery after a crash only replays
# what was consumed since the last offset commit (a few seconds), far fewer than this per key.
SEEN_WINDOW = 4096
# How long a partition read again from its cursor may keep delivering older fetches before
# the runtime seeks once more.
REWIND_RETRY_S = 1.0
_NOT_SOUGHT = float("-inf")  # a partition marked to be read again, not yet sought
# How far a partition's stored cursor may trail events that changed no state.
CURSOR_LAG_MAX = 1000
# How long a batched agent's table value may be applied in memory before it is written to its
# changelog, and how many events it may take in meanwhile (well inside SEEN_WINDOW, so that a
# replay of them onto a newer state is recognised as duplicates). ADR 0014.
STORE_INTERVAL_S = float(os.environ.get("QM_STORE_INTERVAL_S", 4.0))  # ADR 0014 (1 s until stop 21)
STORE_EVENTS_MAX = 1000
# Most event ids one batch may add to a key (QM_BATCH_SIZE events, or the budgets' bundles of
# rows), and most a value may take by apply_once between two stores: together within the seen
# window, so a replay onto the stored value is always recognised (ADR 0033). STORE_EVENTS_MAX
# counts batches, and one batch of the cost service's row bundles carries many ids per key.
# (Half the window made the queue-manager store its cohorts early in kueue-large-scale.)
BATCH_IDS_MAX = 1024
STORE_IDS_MAX = SEEN_WINDOW - BATCH_IDS_MAX
# How long a revocation waits for the batch under way to finish and store.
REVOKE_WAIT_S = float(os.environ.get("QM_REVOKE_WAIT_S", 5.0))
# Largest record a service may write. A table value holds one cohort's whole queue state, which
# passed Kafka's 1 MB default for a 100-queue cohort with thousands pending (the queue-manager
# crashed with MessageSizeTooLargeError in the large-scale benchmark). Changelog topics are
# created with the same limit.
MAX_RECORD_BYTES = int(os.environ.get("QM_MAX_RECORD_BYTES", 16 * 1024 * 1024))


def changelog_topic_configs(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Topic configs of a table's changelog, as faust creates it. Its segments roll every 64 MiB
    (the broker's default is 1 GiB): the broker compacts only rolled segments, and a restart
    with the memory store replays whatever is not compacted yet (ADR 0042)."""
    segment = environ.get("QM_CHANGELOG_SEGMENT_BYTES", str(64 * 1024 * 1024))
    if not segment.isdigit():
        raise SystemExit(f"QM_CHANGELOG_SEGMENT_BYTES={segment!r}: expected bytes, e.g. 67108864 "
                         "(0: the broker's log.segment.bytes)")
    configs = {"max.message.bytes": str(MAX_RECORD_BYTES)}
    if int(segment):
        configs["segment.bytes"] = segment
    return configs

# Changelog records a table's recovery holds before applying them (see table()).
RECOVERY_BUFFER_SIZE = max(2, int(os.environ.get("QM_RECOVERY_BUFFER", 32)))
#: Topics that keep the latest value per key (topics.yaml cleanup_policy: compact): the only
#: ones an Output may mark `latest_only` (ServiceRuntime._hold_latest).
COMPACTED_TOPICS = frozenset(name for name, spec in topic_specs().items() if spec.cleanup_policy == "compact")


class _Batch:
    """What one batch of events has staged: output acknowledgements to wait for, and table
    values to hand to the runtime once they have arrived."""

    def __init__(self, owner: int = 0) -> None:
        self.acks: list[Any] = []
        self.latest: dict[tuple[str, str], Output] = {}  # (compacted topic, key) -> last output
        # sends a handler gathered over the batch (e.g. one record per key): run at its commit,
        # before the acknowledgements are awaited; each returns the acks of what it sent
        self.flushes: list[Callable[[], Awaitable[list[Any]]]] = []
        # outputs held for bundles (ADR 0034): sent at the commit, or once held HOLD_MAX_S
        self.held: list[Output] = []
        self.held_since = 0.0
        self.bundling = False  # a batch of BUNDLE_FROM_EVENTS events or more: outputs held
        self.applied: dict[tuple[int, str], int] = {}  # (table id, key) -> event ids apply_once took
        self.writes: dict[tuple[int, str], tuple[Any, str, Any, Any]] = {}
        self.owner = owner  # the agent (the id of its first applied-offset table)
        self.next_offsets: dict[Any, tuple[int, Any]] = {}  # tp -> (next offset, last event)
        self.first_offsets: dict[Any, int] = {}  # tp -> offset of the first event applied
        self.acks_s = 0.0  # how long the commit waited for the acknowledgements

    def staged(self, table: Any, key: str) -> Any:
        hit = self.writes.get((id(table), key))
        return hit[2] if hit else None


class _Unstored:
    """A table value applied in memory whose changelog record is not written yet (ADR 0014)."""

    __slots__ = ("table", "key", "value", "event", "owner", "tp", "holds", "since", "events", "ids", "version")

    def __init__(self, table: Any, key: str, value: Any, event: Any, owner: int, holds: dict[Any, int],
                 since: float, ids: int = 0) -> None:
        self.table, self.key, self.value, self.event = table, key, value, event
        self.owner = owner  # the agent that writes it (id of its first applied-offset table)
        self.tp = event.message.tp  # the partition whose store interval it keeps
        # per source partition, the first event applied to it after its last store: an agent
        # of two co-partitioned topics (the preemption service) folds both into one value
        self.holds = holds
        self.since = since
        self.events = 1  # batches applied since its last store
        self.ids = ids  # event ids apply_once added to its seen list since its last store
        self.version = 0


class _UnstoredPartition:
    """The unstored values of one partition, which are written together, with the figures
    the store decision reads kept up to date as values come and go. A commit then
    looks at each partition once instead of at every value: the cost service keeps thousands
    unstored (a book per workload), and two scans over them per batch were 15% of its py-spy
    samples in the full Alibaba replay (ADR 0031)."""

    __slots__ = ("tp", "owner", "values", "since", "events", "ids", "holds")

    def __init__(self, first: _Unstored) -> None:
        self.tp = first.tp
        self.owner = first.owner  # one agent consumes a partition's topic, and writes its values
        self.values: dict[tuple[int, str], _Unstored] = {}  # in the order last applied
        self.since = first.since  # the earliest `since` of its values
        self.events = 0  # the most batches any one of its values has applied
        self.ids = 0  # the most event ids any one of its values has taken
        self.holds: dict[Any, int] = {}  # per source partition, the earliest first offset held

    def note(self, slot: tuple[int, str], value: _Unstored) -> None:
        """A value applied (again): it moves to the end."""
        self.values.pop(slot, None)
        self.values[slot] = value
        self.since = min(self.since, value.since)
        self.events = max(self.events, value.events)
        self.ids = max(self.ids, value.ids)
        for tp, first in value.holds.items():
            held = self.holds.get(tp)
            if held is None or first < held:
                self.holds[tp] = first

    def recount(self) -> None:
        """After some values were stored: the figures of those left, noted again in order."""
        left = list(self.values.items())
        self.values, self.since, self.events, self.ids, self.holds = {}, math.inf, 0, 0, {}
        for slot, value in left:
            self.note(slot, value)


def _stagger(tp: Any) -> float:
    """Partitions' store intervals differ (0.75x to 1.125x), so their writes drift apart instead
    of all falling in the same event-loop turn: each pause holds one partition's values, not
    every partition's (bench-queue at 500/s: the store pause is most of the p99)."""
    return 0.75 + 0.125 * (tp.partition % 4)


@contextlib.contextmanager
def _as_current_event(event: Any) -> Iterator[None]:
    """faust routes a table write (its store and its changelog partition) by "the current
    event", and the rocksdb store refuses a write without one. (The per-event loop in
    `process` sets it inline: a generator per event there is measurable.)"""
    token = _faust_current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _faust_current_event.reset(token)


def _store(table: Any, key: str, value: Any, event: Any) -> Any:
    """Write one table value and send its changelog record to the event's partition."""
    with _as_current_event(event):
        ack = table.send_changelog(event.message.partition, key, value)
        table.data[key] = value
        return ack


_current_batch: ContextVar[_Batch | None] = ContextVar("qm_batch", default=None)
# Which envelope of the record under way a handler is applying (0 but in a bundle, ADR 0034).
_bundle_index: ContextVar[int] = ContextVar("qm_bundle_index", default=0)
# The smallest batch whose outputs are held for bundles. A light stream's batches hold two or
# three events: their outputs go out one by one, as soon as decided (bench-queue at 500/s: p99
# 41-47 ms sent at once, 59-64 ms held to the commit).
BUNDLE_FROM_EVENTS = 8
# How long a batch holds outputs for bundles before it sends them (a long batch would otherwise
# hold its first decisions for all of its fold).
HOLD_MAX_S = 0.01
# A bundle record's envelope count, in a header, so a batch can be cut before it takes more
# event ids than BATCH_IDS_MAX without parsing its records first.
BUNDLE_HEADER = "qm-envelopes"


def record_position(event: Any) -> tuple[int, int, int]:
    """(partition, offset, envelope index) of the envelope being handled: the place of one
    envelope on its topic, also inside a bundle (ADR 0034)."""
    return event.message.partition, event.message.offset, _bundle_index.get()


def _envelopes_in(event: Any) -> int:
    value = event.value
    if not value or value[:1] != b"[":
        return 1
    headers = event.message.headers or ()
    for name, raw in headers.items() if isinstance(headers, dict) else headers:
        if name == BUNDLE_HEADER:
            try:
                return max(1, int(raw))
            except ValueError:
                break
    return BUNDLE_MAX  # a bundle without its count: the most a bundle carries


def metrics_text(names: Iterable[str] = ()) -> bytes:
    """/metrics: every series, or with `name[]` parameters only the samples so named, as
    prometheus_client's own HTTP handler does (a sampler that wants one series every second,
    such as the benchmarks' batch loops, then does not make a queue-manager with a thousand
    ClusterQueues render all of theirs)."""
    names = list(names)
    return generate_latest(REGISTRY.restricted_registry(names) if names else REGISTRY)


def within_batch_ids(events: list[Any]) -> list[list[Any]]:
    """A batch cut into batches that carry at most BATCH_IDS_MAX envelopes each (bundles carry
    several), so that no batch adds more event ids to a key than ADR 0033 allows."""
    chunks: list[list[Any]] = []
    carried = 0
    for event in events:
        n = _envelopes_in(event)
        if not chunks or carried + n > BATCH_IDS_MAX:
            chunks.append([])
            carried = 0
        chunks[-1].append(event)
        carried += n
    return chunks


def mirror_pause(thread: Any, tps: list[Any], *, pause: bool) -> None:
    """Pause (resume) partitions in aiokafka's consumer too, on the consumer's own thread
    (ADR 0015); `thread` is faust's consumer thread (its `_consumer` and `thread_loop`).

    faust pauses a partition only in its own bookkeeping (it stops asking aiokafka for its
    records), and it keeps an active table's changelog partitions paused once recovered.
    aiokafka still fetched them, so the first record this worker wrote to each changelog
    partition came back and stayed unconsumed, and aiokafka's fetcher sends no fetch to a
    broker while a partition of it holds unconsumed records, for up to 100 ms
    (prefetch_backoff). Every input partition stalled 100 ms per changelog partition:
    bench-queue's decisions in the first 1.3 s of a run took ~110 ms instead of ~10."""
    consumer = getattr(thread, "_consumer", None)
    loop = getattr(thread, "thread_loop", None)
    if consumer is None or loop is None or loop.is_closed() or not tps:
        return
    aiokafka_tps = [ensure_aiokafka_TP(tp) for tp in tps]

    def apply() -> None:
        for tp in aiokafka_tps:
            try:
                consumer.pause(tp) if pause else consumer.resume(tp)
            except Exception:  # noqa: BLE001, S110 - not assigned (any more): a new assignment starts unpaused and faust pauses it again
                pass

    loop.call_soon_threadsafe(apply)


# How often a worker's consumer asks the broker for cluster metadata, which is when it finds a topic
# created after it joined its group (then the group rebalances onto it). faust's default, 5 minutes,
# left a ready service reading nothing that long when it started before `qm topics create`.
METADATA_MAX_AGE_MS = int(os.environ.get("QM_METADATA_MAX_AGE_MS", 30_000))


# How long the broker may hold a worker's fetch for data (faust fixes 1,500 ms). aiokafka
# keeps one fetch in flight per broker, and a partition whose records were still buffered when
# it was sent is not in it: that partition's next records wait for the fetch to come back.
# ADR 0018: baseline at scale 0.2, 1,500 -> 100 ms: wall 31-34 -> 25-27 s.
FETCH_MAX_WAIT_MS = int(os.environ.get("QM_FETCH_MAX_WAIT_MS", 100))


# How much data the broker should gather for a fetch before it answers (at most
# FETCH_MAX_WAIT_MS later). 1: answer as soon as anything is there, for the lowest latency.
# Raising it trades latency for CPU on a busy stack: kueue-baseline at full scale, 16384 took
# 24% less CPU across the services and the same wall time (ADR 0018 addendum).
FETCH_MIN_BYTES = int(os.environ.get("QM_FETCH_MIN_BYTES", 1))


# How long the producer waits to gather more records into one request (faust's default, and
# ours: 0, send at once). A short wait shares a socket write and a broker round among records a
# fold sends close together. ADR 0037: at 2 ms the Kueue scenarios took 4-6% less services' CPU
# and 1-4 s less wall, but the Alibaba replay ran slower in three of four interleaved pairs.
def producer_linger_ms(raw: str | None) -> int:
    text = "0" if raw is None else raw
    if not text.strip().isdigit() or int(text) > 1000:
        raise SystemExit(f"QM_PRODUCER_LINGER_MS={text!r}: expected whole milliseconds from 0 to 1000 "
                         "(0: send every record at once)")
    return int(text)


PRODUCER_LINGER_MS = producer_linger_ms(os.environ.get("QM_PRODUCER_LINGER_MS"))


class _ShortFetchConsumerThread(_KafkaConsumerThread):
    """faust's consumer thread, building aiokafka's consumer with FETCH_MAX_WAIT_MS and
    FETCH_MIN_BYTES (or the runtime's own `agent_fetch_max_wait_ms`, `agent_fetch_min_bytes`)."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        runtime = getattr(self.app, "qm_runtime", None)
        gather = runtime.agent_fetch_min_bytes if runtime is not None else None
        wait = runtime.agent_fetch_max_wait_ms if runtime is not None else None
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS if wait is None else wait  # both read when its fetcher starts
        consumer._fetch_min_bytes = FETCH_MIN_BYTES if gather is None else max(gather, 1)
        return consumer


class _HandledOnlyConsumer(_KafkaConsumer):
    """faust's consumer, acknowledging a message of a `consume()`d topic only once the runtime
    has handled it and stored the result.

    faust itself acknowledges messages it never processed: one fetched before a rebalance and
    skipped after it, and the rest of a `take()` buffer when the agent stops. An offset commit
    could then pass events whose state was never stored, and the next owner of the partition
    would never see them (seen in CI: a window of a cohort's events lost after two rebalances
    in a row). Dropping those acks keeps Kafka's committed offsets honest; where reading
    resumes is decided by the runtime's applied-offset cursors (`seek_to_committed`)."""

    def _new_consumer_thread(self) -> Any:
        return _ShortFetchConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _getmany(self, active_partitions: Any, timeout: float) -> Any:
        records = await super()._getmany(active_partitions, timeout)
        runtime = getattr(self.app, "qm_runtime", None)
        return runtime.pass_over_unread(records) if runtime is not None and records else records

    async def _add_gap(self, tp: Any, offset_from: int, offset_to: int) -> None:
        """faust calls this when a fetch's records skip offsets, and counts them acknowledged
        at once (the record that follows them too). On a `consume()`d topic the skipped
        records are ones `ServiceRuntime.pass_over_unread` dropped: they are acknowledged with
        the record that follows them, once that one is handled (see `ack`)."""
        if tp.topic not in getattr(self.app, "qm_guarded_topics", ()):
            await super()._add_gap(tp, offset_from, offset_to)

    def ack(self, message: Any) -> bool:
        app = self.app
        guarded = getattr(app, "qm_guarded_topics", ())
        if message.topic not in guarded:
            return super().ack(message)
        if message not in app.qm_handled:
            message.acked = True
            self._unacked_messages.discard(message)
            return False
        acked = super().ack(message)
        dropped_from = app.qm_runtime.dropped_before(message.tp, message.offset)
        if acked and dropped_from is not None:
            with ack_lock:  # the records dropped right before it: as faust's ack() books one
                committed = self._committed_offset[message.tp]
                index, offsets = self._acked_index[message.tp], self._acked[message.tp]
                for offset in range(dropped_from, message.offset):
                    if (committed is None or offset >= committed) and offset not in index:
                        index.add(offset)
                        offsets.append(offset)
        return acked

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

    def pause_partitions(self, tps: Iterable[Any]) -> None:
        tps = list(tps)
        super().pause_partitions(tps)
        mirror_pause(self._thread, tps, pause=True)

    def resume_partitions(self, tps: Iterable[Any]) -> None:
        tps = list(tps)
        super().resume_partitions(tps)
        mirror_pause(self._thread, tps, pause=False)

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


class _Worker(faust.Worker):
    """faust's worker, keeping the service's JSON log lines. Its logging setup replaces the root
    handlers with a text format that drops every field (a rewind's topic, partition and offset,
    a dead letter's event id), and its terminal spinner wrote escape codes into the log."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spinner = None

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        super().on_setup_root_logger(logger, level)
        logs.format_as_json(logger, self.app.qm_runtime.settings.service)


EVENT_LOOPS = ("uvloop", "aio")


def choose_event_loop(service: str, choice: str) -> None:
    """Install the event loop a worker runs on, before faust creates it. uvloop (the default)
    runs the same services with 5-8% less CPU, measured against the bench runner's own CPU
    (ADR 0019); `aio` is asyncio's own loop."""
    if choice not in EVENT_LOOPS:
        raise SystemExit(f"{service}: QM_EVENT_LOOP={choice!r} is not one of {', '.join(EVENT_LOOPS)}")
    if choice == "uvloop":  # what mode.loop.use("uvloop") does, but on every call, not at first import
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


class TemporaryError(Exception):
    """A handler failure worth retrying (a dependency is briefly away); the message is redelivered."""


@quick_init
@dataclass(frozen=True, slots=True)
class Output:
    """One message a fold wants published: topic name (from topics.yaml), key, envelope.

    `latest_only`: the value supersedes every earlier one of its key (a compacted topic's
    latest value, e.g. a namespace's usage), so a batch sends only its last such output per
    topic and key (ADR 0024).

    `value`: the envelope already encoded, when the fold keeps the record for itself too (the
    cost service bundles its ledger rows for the budgets); sent as is, not encoded again."""

    topic: str
    key: str
    envelope: Envelope
    latest_only: bool = False
    value: bytes | None = None

    def __post_init__(self) -> None:
        if self.latest_only and self.topic not in COMPACTED_TOPICS:
            raise ValueError(f"latest_only output to {self.topic}, which keeps every record "
                             f"(latest-value topics: {', '.join(sorted(COMPACTED_TOPICS))})")


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
            producer_linger=PRODUCER_LINGER_MS / 1000,
            producer_partitioner=KeyPartitioner(),  # murmur2 once per key, not per record
            Table=RecoveredTable,  # recovery decodes each key's last changelog record only
            Worker=_Worker,  # JSON log lines under `python -m <service> worker` too
            # How often the consumer refreshes cluster metadata (faust: 5 min). A service started
            # before its topics exist, or before partitions are added, reads nothing until then.
            consumer_metadata_max_age_ms=METADATA_MAX_AGE_MS,
            # A crashed worker's partitions move on within seconds, not faust's default minute.
            broker_session_timeout=float(os.environ.get("QM_SESSION_TIMEOUT_S", 10)),
            broker_heartbeat_interval=float(os.environ.get("QM_HEARTBEAT_INTERVAL_S", 2)),
            broker_rebalance_timeout=float(os.environ.get("QM_REBALANCE_TIMEOUT_S", 20)),
            **faust_options,
        )
        self.app.qm_guarded_topics = set()
        self.app.qm_handled = weakref.WeakSet()
        self.app.qm_runtime = self
        # How much the broker gathers (for at most FETCH_MAX_WAIT_MS, or agent_fetch_max_wait_ms)
        # before it answers this worker's faust agents: None, FETCH_MIN_BYTES. Set before the
        # worker starts (ADR 0053, ADR 0061).
        self.agent_fetch_min_bytes: int | None = None
        self.agent_fetch_max_wait_ms: int | None = None
        # Per consumed topic: the table of applied offsets, and this worker's cursors for the
        # partitions it owns now (the next offset each expects; reset at every assignment).
        self._cursor_tables: dict[str, faust.Table] = {}
        self._next_offset: dict[Any, int] = {}
        self._rewinding: dict[Any, tuple[int, float]] = {}  # tp -> (offset sought, when)
        self._reported_missing: set[str] = set()  # consumed topics said to be missing (readyz)
        self.app.timer(REWIND_RETRY_S, name="retry_rewinds")(self._retry_rewinds)
        self._topics: dict[str, faust.TopicT] = {}
        self._seen_index: dict[tuple[int, str], tuple[list[str], set[str]]] = {}
        self._unstored: dict[tuple[int, str], _Unstored] = {}  # every unstored value, by slot
        self._unstored_parts: dict[Any, _UnstoredPartition] = {}  # the same values, by partition
        self._last_event: dict[Any, Any] = {}  # tp -> the last event applied (to route a cursor store)
        self._in_flight: dict[int, int] = {}  # agent (id of its first cursor table) -> batches under way
        self._owners: dict[str, int] = {}  # consumed topic -> the agent that applies it
        self._base_names: dict[str, str] = {}  # consumed topic -> its topics.yaml name
        self._sieves: dict[str, TypeSieve] = {}  # consumed topic -> what its handler does not read
        # tp -> {offset of a delivered record: first offset of the records dropped right before it}
        self._passed_over: dict[Any, dict[int, int]] = {}
        # (tp, offset) of a handled record -> first offset of the dropped run before it (to ack)
        self._dropped_before: dict[tuple[Any, int], int] = {}
        self.store_interval_s = STORE_INTERVAL_S
        # checked every second at most: a value on a quiet stream is stored within a second of
        # falling due, not a whole interval later
        self.app.timer(min(max(STORE_INTERVAL_S, 0.1), 1.0), name="store_idle")(self._store_idle)
        self.app.on_partitions_revoked.connect(self._on_revoked)
        raw_batch_size = os.environ.get("QM_BATCH_SIZE", "500")
        if not raw_batch_size.strip().isdigit() or not 1 <= int(raw_batch_size) <= BATCH_IDS_MAX:
            raise SystemExit(f"{settings.service}: QM_BATCH_SIZE={raw_batch_size!r}: expected 1 to {BATCH_IDS_MAX} "
                             "events (a batch's event ids must fit the dedupe window with room to spare)")
        self.batch_size = int(raw_batch_size)
        # How long a batched agent waits to fill a batch. A backlog fills it at once; at a steady
        # 500 events/s the wait is most of an event's latency (bench-queue p50 24 -> 10 ms, p99
        # 129 -> 84 ms going from 20 to 5 ms, throughput unchanged).
        self.batch_within_s = float(os.environ.get("QM_BATCH_WITHIN_S", 0.005))
        self._batch_steps: dict[str, tuple[Any, Any, Any]] = {}  # agent label -> qm_batch_seconds children
        # Topics whose outputs a batch sends as bundles, one record per key (ADR 0034). Empty:
        # every output is one record, sent as soon as it is published.
        self.bundled_topics: frozenset[str] = frozenset()
        # More conditions for /readyz, by name (shown in its answer): a service's other consumers.
        self.ready_checks: dict[str, Callable[[], bool]] = {}
        self._register_pages()
        self.app.task(self._on_started)

    # -- topics -------------------------------------------------------------------------

    def topic(self, name: str) -> faust.TopicT:
        """A topic of topics.yaml (or its .dlq) with raw bytes in and out: the codec is ours."""
        if name not in self._topics:
            base = name.removesuffix(".dlq")
            spec = topic_specs()[base]
            self._base_names[self.settings.topic(name)] = name
            self._topics[name] = self.app.topic(
                self.settings.topic(name),
                key_serializer="raw",
                value_serializer="raw",
                partitions=1 if name.endswith(".dlq") else spec.partitions,
                internal=False,
            )
        return self._topics[name]

    def co_partitioned(self, names: Sequence[str]) -> faust.TopicT:
        """One source over several topics.yaml topics with the same partition count: an agent
        that reads them all is the only writer of the tables it keys by partition."""
        topics = [self.topic(name) for name in names]
        partitions = {topic.partitions for topic in topics}
        if len(partitions) != 1:
            raise RuntimeError(f"{', '.join(names)} must have the same partition count to be read by one agent")
        return self.app.topic(*(t.get_topic_name() for t in topics), key_serializer="raw", value_serializer="raw",
                              partitions=partitions.pop(), internal=False)  # fmt: skip

    def consume(
        self, topic_name: str | Sequence[str], handler: Handler, *, agent_name: str | None = None,
        batched: bool = False, reads: Iterable[type] | None = None,
    ) -> None:
        """Run `handler(envelope, event)` for every readable message of a topic (or of several
        co-partitioned topics, in one agent: see `co_partitioned`).

        `batched=True` stages table writes per batch of up to QM_BATCH_SIZE events: only for
        an agent that is the sole writer of its tables (another agent would not see the
        staged values). It also awaits the batch's output acknowledgements once, at its end:
        use it for agents that publish and write no table (forwarders, admission), which
        otherwise wait one broker round trip per event.

        `reads`: the payload types the handler acts on. Messages of any other known event
        type are passed over once parsed, without schema validation or a payload object (a
        service reads every record of a shared topic such as qm.workloads, most of them
        written for someone else; their validation was a tenth of a service's time). What
        cannot be parsed, or names an unknown event type, is still dead-lettered.

        Unreadable or invalid messages go to `<topic>.dlq` with the reason in headers, and
        the stream goes on. A handler's unexpected exception dead-letters that message too
        (with the exception named), so one bad event cannot stop a service."""
        names = [topic_name] if isinstance(topic_name, str) else list(topic_name)
        source = self.topic(names[0]) if len(names) == 1 else self.co_partitioned(names)
        label = "+".join(names)
        runtime = self

        wanted = None if reads is None else frozenset(record.EVENT_TYPE for record in reads)
        if wanted is not None and PASS_OVER_UNREAD:
            for name in names:
                self._sieves[self.settings.topic(name)] = TypeSieve(wanted)

        consumed: dict[str, Any] = {}  # topic -> its counter (`labels()` looks it up anew each call)

        async def handle(event) -> None:
            topic_name = runtime._base_names.get(event.message.topic, label)
            counter = consumed.get(topic_name)
            if counter is None:
                counter = consumed[topic_name] = MESSAGES_CONSUMED.labels(runtime.settings.service, topic_name)
            counter.inc()
            # A record holds one envelope, or a bundle's in order (ADR 0034), each applied on its
            # own; one of a bundle that cannot be read or handled is dead-lettered alone, named
            # by its place in the record.
            try:
                documents = documents_of(event.value)
            except ContractError as error:
                await runtime.dead_letter(topic_name, event, f"contract: {error}", kind="contract")
                return
            alone = len(documents) == 1
            for index, document, envelope in envelopes_in(documents, wanted):
                if envelope is None:
                    continue  # a known event this handler does not read
                if isinstance(envelope, ContractError):
                    await runtime.dead_letter(topic_name, event, f"contract: {envelope}", kind="contract",
                                              value=None if alone else orjson.dumps(document))
                    continue
                if alone:
                    await handle_one(envelope, event, topic_name, None)
                    continue
                token = _bundle_index.set(index)
                try:
                    await handle_one(envelope, event, topic_name, (index, len(documents), document))
                finally:
                    _bundle_index.reset(token)

        async def handle_one(envelope: Envelope, event, topic_name: str, place: tuple[int, int, Any] | None) -> None:
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
                where = "" if place is None else in_bundle(place[0], place[1])
                await runtime.dead_letter(
                    topic_name, event, f"handler: {where}{type(error).__name__}: {error}", kind="handler",
                    value=None if place is None else orjson.dumps(place[2]),
                )

        async def batches(stream):
            if not batched:
                async for event in stream.events():
                    yield [event]
            else:
                async for events in take_batches(stream, runtime.batch_size, runtime.batch_within_s):
                    for chunk in within_batch_ids(events):
                        yield chunk

        async def agent(stream):
            async for events in batches(stream):
                await runtime.process(events, handle, label, defer=batched)

        agent.__name__ = agent_name or f"consume_{'_'.join(names).replace('.', '_')}"
        self.app.agent(source, name=agent.__name__)(agent)
        self.guard(source, agent.__name__)

    def guard(self, source: faust.TopicT, agent_name: str) -> None:
        """Acknowledge messages of this topic only once `process()` has handled them, and keep
        the offset up to which its partitions are applied in a table of their own (one per
        topic when the agent reads several)."""
        names = list(source.topics)
        owner = None
        for name in names:
            self.app.qm_guarded_topics.add(name)
            table_name = f"{agent_name}-applied" if len(names) == 1 else f"{agent_name}-{self._base_names[name]}-applied"
            self._cursor_tables[name] = self.table(
                table_name, partitions=source.partitions or 1, help=f"next offset of {name} to apply, per partition",
            )
            owner = owner or id(self._cursor_tables[name])
            self._owners[name] = owner

    async def process(
        self, events: list[Any], handle: Callable[[Any], Awaitable[None]], label: str, *, defer: bool = False
    ) -> None:
        """Apply a batch of events in offset order, then store what it staged, then let faust
        acknowledge it (ADR 0011).

        Each partition's cursor (the next offset to apply) decides what is applied: an event
        below it was applied already and is passed over; one above it means events in between
        were never applied here (faust can skip and still acknowledge them around a rebalance),
        so the partition is read again from the cursor. Outputs of a batch are awaited
        together, then its states stored, then the cursors. A batch that a rebalance overtook
        stores nothing: its events are read again by whoever owns the partition now."""
        owner = self._owners.get(events[0].message.topic, 0) if events else 0
        started = time.perf_counter()
        batch = _Batch(owner)
        batch.bundling = len(events) >= BUNDLE_FROM_EVENTS
        token = _current_batch.set(batch)
        self._in_flight[owner] = self._in_flight.get(owner, 0) + 1
        try:
            handled = []
            for event in events:
                if not self.is_current(event):
                    self._read_again_after_rebalance(event, batch, label)
                    continue
                tp, offset = event.message.tp, event.message.offset
                expected = self._cursor(batch, tp)
                dropped = self._passed_over.get(tp)
                follows = dropped.pop(offset, offset) if dropped else offset  # records nobody reads
                if expected is not None and offset < expected:
                    handled.append(event)  # applied before
                    continue
                if expected is not None and follows > expected:
                    await self._rewind(tp, expected, offset, label)
                    continue
                self._rewinding.pop(tp, None)
                # faust keys a table's changelog partition on "the current event": in a batch
                # (take_events) that must be this one, not what faust left set (_as_current_event,
                # inline: this runs per event)
                current = _faust_current_event.set(weakref.ref(event))
                try:
                    await handle(event)
                finally:
                    _faust_current_event.reset(current)
                handled.append(event)
                if follows < offset:
                    self._dropped_before[(tp, offset)] = follows
                batch.next_offsets[tp] = (offset + 1, event)
                batch.first_offsets.setdefault(tp, offset)
            if not all(self._still_owned(event) for event in handled):
                # Its partitions may have moved and their tables been recovered anew. The
                # outputs already sent are the ones the fold sends again, with the same ids
                # (outputs held for bundles are not sent: the new owner sends them).
                # (Its in-place changes stay in memory: rare, since a revocation waits for the
                # batch under way, see _store_before_revocation.)
                REFETCHED_AFTER_REBALANCE.labels(self.settings.service, label).inc(len(handled))
                return
            handled_at = time.perf_counter()
            await self._commit(batch, defer)
            self.app.qm_handled.update(event.message for event in handled)
            self._note_record_age(batch)
            self._note_batch_time(label, handled_at - started, batch.acks_s,
                                  time.perf_counter() - handled_at - batch.acks_s)
        finally:
            self._in_flight[owner] -= 1
            _current_batch.reset(token)

    def _note_batch_time(self, label: str, handle_s: float, acks_s: float, commit_s: float) -> None:
        """qm_batch_seconds: where an agent's loop spends a batch (stop 62: the queue-manager's
        was busy 90% of kueue-baseline's last phase, and a finish waited for the batch under way
        and then its own)."""
        steps = self._batch_steps.get(label)
        if steps is None:  # `labels()` looks the child up anew each call: once per agent here
            service = self.settings.service
            steps = self._batch_steps[label] = tuple(
                BATCH_SECONDS.labels(service, label, step) for step in ("handle", "acks", "commit"))
        steps[0].observe(handle_s)
        steps[1].observe(acks_s)
        steps[2].observe(max(commit_s, 0.0))

    def _note_record_age(self, batch: _Batch) -> None:
        """Set qm_applied_record_age_seconds per topic from the batch's last event of each
        partition. A queue-manager far behind its stream decides on a stale view (with two
        admissions in kueue-large-scale, 2,350 of its 2,824 evictions named workloads that had
        finished 6 s earlier, p50): this is what an operator would watch for that."""
        now = time.time()
        oldest: dict[str, float] = {}
        for tp, (_, last) in batch.next_offsets.items():
            written = getattr(last.message, "timestamp", None)  # seconds; Kafka's CreateTime
            if written:
                topic = self._base_names.get(tp.topic, tp.topic)
                oldest[topic] = max(oldest.get(topic, 0.0), now - written)
        for topic, age in oldest.items():
            APPLIED_RECORD_AGE.labels(self.settings.service, topic).set(max(0.0, age))

    async def _commit(self, batch: _Batch, defer: bool) -> None:
        """Outputs acknowledged first; then the batch's table values are applied in memory and
        each written to its changelog once it is due (STORE_INTERVAL_S or STORE_EVENTS_MAX);
        then the cursors, which never pass the first event of a value not yet stored.

        faust's own `table[key] = value` only buffers the changelog record, and its flush before
        an offset commit gives up after 100 ms, so a SIGKILL could commit offsets whose state
        was never written: we write and wait for the changelog acks ourselves. A value that
        was not stored when the worker died is rebuilt by replaying its events from the held
        cursor: the fold sends the same outputs with the same ids again (ADR 0001)."""
        if batch.held:
            batch.acks.extend(await self._send_held(batch.held))
        for flush in batch.flushes:
            batch.acks.extend(await flush())
        if batch.latest:
            batch.acks.extend(await self._send(batch.latest.values()))
        waited_from = time.perf_counter()
        for ack in batch.acks:
            await ack
        batch.acks_s = time.perf_counter() - waited_from
        now = time.monotonic()
        owner = batch.owner
        # per partition number, the batch's first event of each source partition: the key's own
        # first write in the batch is not kept, and these are no later (a key lives in one
        # partition number; an agent of two co-partitioned topics reads it from both)
        holds_by_partition: dict[int, dict[Any, int]] = {}
        for tp, first in batch.first_offsets.items():
            holds_by_partition.setdefault(tp.partition, {})[tp] = first
        for table, key, value, event in batch.writes.values():
            message = event.message
            holds = holds_by_partition.get(message.partition) or {message.tp: message.offset}
            self._note_unstored(table, key, value, event, owner, holds, now, batch.applied.get((id(table), key), 0))
        for tp, (offset, last) in batch.next_offsets.items():
            self._next_offset[tp] = offset
            self._last_event[tp] = last
        # only an agent that is its tables' sole writer (`batched`) may leave values unstored
        stored_tps = await self._store_due(now, owner, everything=not defer or self.store_interval_s <= 0)
        await self._store_cursors(batch.next_offsets, stored_tps)
        await self._store_tps(stored_tps - batch.next_offsets.keys())  # values of other partitions

    def _note_unstored(
        self, table: Any, key: str, value: Any, event: Any, owner: int, holds: dict[Any, int], now: float,
        ids: int = 0,
    ) -> None:
        with _as_current_event(event):  # a batch's values are noted after its last handler ran
            table.data[key] = value
        slot = (id(table), key)
        # A value applied again moves to the end: values are written in the order they were
        # last applied, so a fold's own bookkeeping record, staged last, is written last.
        hit = self._unstored.get(slot)
        if hit is None:
            hit = self._unstored[slot] = _Unstored(table, key, value, event, owner, dict(holds), now, ids)
        else:
            hit.value, hit.event = value, event
            for tp, first in holds.items():
                hit.holds.setdefault(tp, first)  # the earlier first event stays held
            hit.events += 1
            hit.ids += ids
            hit.version += 1
        part = self._unstored_parts.get(hit.tp)
        if part is None:
            part = self._unstored_parts[hit.tp] = _UnstoredPartition(hit)
        part.note(slot, hit)

    async def _store_due(self, now: float, owner: int | None = None, *, everything: bool = False) -> set[Any]:
        """Write the values that are due to their changelogs (all of `owner`'s with
        `everything`) and wait for the acks. Returns the partitions whose values were written.

        Once one value of a partition is due, every unstored value of that partition is
        written with it, in the order they were last applied: the changelog then holds the
        partition's state as of one batch boundary. A fold that tells applied events by one
        record (the cost ledger's cohort record, `pos`) would otherwise skip, on replay, events
        whose effect was only in a value not yet written (seen in CI: a SIGKILLed cost service
        lost the rows of every workload whose book missed the replayed events).

        `owner` is the agent committing a batch (its folds are done). Another agent's values
        are written only while it has no batch under way: a fold changes its state in place,
        and a value must not be written half-way through an event that is not yet applied.
        (A partition's values all belong to the one agent that consumes its topic.)"""
        in_flight = self._in_flight
        interval = self.store_interval_s
        due_parts = [p for p in self._unstored_parts.values()
                     if (p.owner == owner or not in_flight.get(p.owner))
                     and ((everything and p.owner == owner) or now - p.since >= interval * _stagger(p.tp)
                          or p.events >= STORE_EVENTS_MAX or p.ids >= STORE_IDS_MAX)]
        if not due_parts:
            return set()
        due = [u for p in due_parts for u in p.values.values()]
        due_tps = {tp for p in due_parts for tp in p.holds}  # the cursors they held may move on
        # What the table holds now: the value noted, unless a rebalance's recovery put the
        # stored one back (then the held cursor replays onto it)
        sent = [(u, u.version, _store(u.table, u.key, u.table.data.get(u.key, u.value), u.event)) for u in due]
        for _, _, ack in sent:
            await ack
        for u, version, _ in sent:
            # A batch that took the key on meanwhile keeps it unstored (from its old first
            # offset: conservative, the next store catches up).
            slot = (id(u.table), u.key)
            if u.version == version and self._unstored.get(slot) is u:
                del self._unstored[slot]
                part = self._unstored_parts.get(u.tp)
                if part is not None:
                    part.values.pop(slot, None)
        for part in due_parts:
            if part.values:
                part.recount()
            elif self._unstored_parts.get(part.tp) is part:
                del self._unstored_parts[part.tp]
        return due_tps

    def _held_at(self, tps: Iterable[Any]) -> dict[Any, int]:
        """Per partition of `tps`, the first offset whose effect is not in a stored value (none:
        not held), from each partition's earliest holds (`_UnstoredPartition`)."""
        wanted = set(tps)
        held: dict[Any, int] = {}
        for part in self._unstored_parts.values():
            for tp, first in part.holds.items():
                if tp in wanted and (tp not in held or first < held[tp]):
                    held[tp] = first
        return held

    async def _store_cursors(self, next_offsets: dict[Any, tuple[int, Any]], stored_tps: set[Any]) -> None:
        """Store each partition's cursor: the next offset to apply, held back to the first
        event of a value not yet stored. Stored after values were written (so a restart does
        not replay them), else only when it trails by CURSOR_LAG_MAX: re-applying events that
        stored nothing after a restart stores nothing and re-sends outputs with the same ids."""
        acks = []
        held_at = self._held_at(next_offsets)
        for tp, (offset, event) in next_offsets.items():
            cursors = self._cursor_tables[tp.topic]
            held = held_at.get(tp)
            target = offset if held is None else min(offset, held)
            stored = cursors.data.get(str(tp.partition))
            if stored is not None and target <= stored:
                continue
            if tp in stored_tps or stored is None or target - stored >= CURSOR_LAG_MAX:
                acks.append(_store(cursors, str(tp.partition), target, event))
        for ack in acks:
            await ack

    async def _store_idle(self, *_app: Any) -> None:
        """Write values that became due while no batch came (a quiet stream), and their cursors."""
        if self.app.rebalancing or not self._unstored:
            return
        tps = await self._store_due(time.monotonic())  # decides what is due (staggered per partition)
        await self._store_tps(tps)

    async def _store_tps(self, tps: set[Any]) -> None:
        for tp in tps:
            cursors = self._cursor_tables.get(tp.topic)
            offset = self._next_offset.get(tp)
            event = self._last_event.get(tp)
            if cursors is not None and offset is not None and event is not None:
                await self._store_cursors({tp: (offset, event)}, {tp})

    async def _on_started(self, *_app: Any) -> None:
        loop = type(asyncio.get_running_loop())
        EVENT_LOOP.info({"implementation": loop.__module__.split(".")[0]})
        frozen = freeze_startup_objects()
        self.log.info("start-up objects frozen out of the collector's scans", detail=f"{frozen} objects (ADR 0013)")

    async def _on_revoked(self, _app: Any, revoked: Any = None, **_kwargs: Any) -> None:
        await self._store_before_revocation(revoked)

    async def _store_before_revocation(self, revoked: Any) -> None:
        """Before partitions leave (faust's on_partitions_revoked), let the batch under way
        finish and store (it applies no further event once the rebalance began), then write
        everything unstored, so that the next owner of a partition (this worker again, maybe)
        starts from stored values and cursors that agree.

        Why wait: a fold changes its state in place, and a batch dropped half-way would leave
        those changes in memory with their events unmarked; faust's recovery restores only
        keys written since its last recovery, so a replay could apply them twice. If the batch
        does not finish within REVOKE_WAIT_S the values of its agent are left unstored, and
        the next owner replays from the held cursors."""
        deadline = time.monotonic() + REVOKE_WAIT_S
        while any(self._in_flight.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if any(self._in_flight.values()):
            self.log.warning("a batch was still under way when partitions were revoked; its values stay unstored",
                             detail=f"waited {REVOKE_WAIT_S:g} s")
        if not self._unstored:
            return
        tps = await self._store_due(float("inf"))  # every value whose agent is between batches
        await self._store_tps(tps)

    def _cursor(self, batch: _Batch, tp: Any) -> int | None:
        """The next offset of `tp` to apply, as a batch under way sees it (None: not known)."""
        return batch.next_offsets[tp][0] if tp in batch.next_offsets else self._next_offset.get(tp)

    def _read_again_after_rebalance(self, event: Any, batch: _Batch, label: str) -> None:
        """An event not applied because a rebalance is under way. Fetched in an earlier
        generation, it is read again from where the next assignment positions its partition.
        Fetched in the current one (faust delivers records between its seek to the cursors
        and the end of the rebalance), nothing would read it again: no seek comes, and if it
        was the partition's last record, no later one shows the gap (seen in CI: a restarted
        worker never applied one topic of each co-partitioned pair). Its partition is read
        again from its cursor once the rebalance is over (`_retry_rewinds`)."""
        if not self._still_owned(event):
            return
        tp, offset = event.message.tp, event.message.offset
        expected = self._cursor(batch, tp)
        if expected is None or offset < expected:
            return
        REFETCHED_AFTER_REBALANCE.labels(self.settings.service, label).inc()
        if tp not in self._rewinding:
            self._rewinding[tp] = (expected, _NOT_SOUGHT)

    async def _rewind(self, tp: Any, expected: int, got: int, label: str) -> None:
        """Read a partition again from the first offset not yet applied (once per gap; see
        `_retry_rewinds` for when the re-read does not come)."""
        sought = self._rewinding.get(tp)
        if sought is not None and sought[0] == expected:
            if sought[1] == _NOT_SOUGHT:
                await self._read_again(tp, expected)  # passed over at a rebalance's end, not skipped
            return
        REWINDS.labels(self.settings.service, label).inc()
        self.log.warning("events skipped by the consumer; reading the partition again from the first not applied",
                         topic=tp.topic, partition=tp.partition, offset=got,
                         detail=f"first offset not applied: {expected}")
        await self._seek_back(tp, expected)

    async def _read_again(self, tp: Any, expected: int) -> None:
        """Seek a partition marked by `_read_again_after_rebalance` back to its cursor."""
        self.log.info("events passed over while a rebalance finished; reading the partition again",
                      topic=tp.topic, partition=tp.partition, detail=f"first offset not applied: {expected}")
        await self._seek_back(tp, expected)

    async def _seek_back(self, tp: Any, expected: int) -> None:
        """Seek a partition to its cursor, noting when (`_retry_rewinds` seeks again if the
        re-read does not begin)."""
        self._rewinding[tp] = (expected, time.monotonic())
        await self.app.consumer.seek_safely(tp, expected)

    async def _retry_rewinds(self, *_app: Any) -> None:
        """Seek again where a re-read has not begun within REWIND_RETRY_S: faust drops re-read
        messages below the offset of a fetch that was still being delivered at the seek, and
        at the end of a partition no later event would notice."""
        if self.app.rebalancing:
            return
        now = time.monotonic()
        for tp, (expected, since) in list(self._rewinding.items()):
            if since == _NOT_SOUGHT:
                await self._read_again(tp, expected)
            elif now - since >= REWIND_RETRY_S:
                await self._seek_back(tp, expected)

    def pass_over_unread(self, records: dict[Any, list[Any]]) -> dict[Any, list[Any]]:
        """A fetch's records without those no handler reads (see TypeSieve), noting for the
        record after each dropped run where the run began, so that `process` knows the gap was
        read. The last record of each partition is always kept: the cursor and the committed
        offset then reach the end of what was fetched."""
        for tp, fetched in records.items():
            sieve = self._sieves.get(tp.topic)
            if sieve is None or len(fetched) < 2:
                continue
            kept, run_from, last = [], None, fetched[-1]
            dropped = self._passed_over.setdefault(tp, {})
            for record in fetched:
                if record is not last and sieve.unread(record.value):
                    if run_from is None:
                        run_from = record.offset
                    continue
                if run_from is not None:
                    dropped[record.offset] = run_from
                    run_from = None
                kept.append(record)
            if len(kept) < len(fetched):
                records[tp] = kept
                topic = self._base_names.get(tp.topic, tp.topic)
                MESSAGES_CONSUMED.labels(self.settings.service, topic).inc(len(fetched) - len(kept))
                PASSED_OVER.labels(self.settings.service, topic).inc(len(fetched) - len(kept))
            if len(dropped) > 100_000:  # left behind by batches a rebalance overtook
                dropped.clear()  # at worst, a partition is read again from its cursor
        return records

    def dropped_before(self, tp: Any, offset: int) -> int | None:
        """The first offset of the dropped records a handled record follows (None: none), once."""
        return self._dropped_before.pop((tp, offset), None) if self._dropped_before else None

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
        self._passed_over.clear()
        self._dropped_before.clear()
        # Unstored values of partitions gone elsewhere are their new owner's to rebuild.
        self._unstored = {k: u for k, u in self._unstored.items() if u.tp in committed}
        self._unstored_parts = {tp: p for tp, p in self._unstored_parts.items() if tp in committed}
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

    def _still_owned(self, event: Any) -> bool:
        """Whether the event's partition is still this worker's: fetched in the current
        generation. A revocation under way still counts (the partitions are ours until the
        revocation returns, and it waits for the batch under way to be stored)."""
        return event.message.generation_id == self.app.consumer_generation_id

    def is_current(self, event: Any) -> bool:
        """Whether an event was fetched in the consumer group's current generation and no
        rebalance is under way: only then do this worker's tables hold its partition's state."""
        app = self.app
        return (not app.rebalancing and app.flow_control.is_active()
                and event.message.generation_id == app.consumer_generation_id)

    async def dead_letter(self, topic_name: str, event: Any, error: str, *, kind: str, value: bytes | None = None) -> None:
        await self.dead_letter_record(topic_name, event.message, error, kind=kind, value=value)

    async def dead_letter_record(self, topic_name: str, message: Any, error: str, *, kind: str,
                                 consumer: str | None = None, value: bytes | None = None) -> None:
        """`message`: anything with key, value, topic, partition and offset (a faust message or
        an aiokafka record); `consumer` names the reader in the headers (default: the app id).
        `value`: what to dead-letter instead of the whole record (one envelope of a bundle)."""
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
            value=message.value if value is None else value,
            headers=dlq_headers(error, message.topic, message.partition, message.offset,
                                consumer or self.settings.app_id),
        )
        await fut

    async def publish(self, outputs: Iterable[Output]) -> None:
        """Send outputs; they are acknowledged by the broker before any state of the same
        batch is stored (see apply_once for why). Outside a batch, wait right here.

        Straight to the producer (aiokafka's partitioner by key, as faust's Topic.send would
        choose): faust's Topic and Channel layers only add sensor calls and a callback future
        per message. bench-queue, back to back: 949 -> 1,716 decisions/s, and at 500/s p99
        523 -> 107 ms."""
        batch = _current_batch.get()
        if batch is not None:
            outputs = self._hold_latest(batch, outputs)
            if self.bundled_topics and batch.bundling:  # all held: none overtakes the bundles it follows
                if not batch.held:
                    batch.held_since = time.monotonic()
                batch.held.extend(outputs)
                if time.monotonic() - batch.held_since >= HOLD_MAX_S:
                    # a long batch: what it decided so far goes out now, not at its end
                    held, batch.held = batch.held, []
                    batch.acks.extend(await self._send_held(held))
                    await asyncio.sleep(0)  # the producer's sender runs only when this task yields
                return
        await self._acknowledged(batch, await self._send(outputs))

    @staticmethod
    async def _acknowledged(batch: _Batch | None, pending: list[Any]) -> None:
        """In a batch, its commit awaits the acknowledgements; outside one, here."""
        if batch is not None:
            batch.acks.extend(pending)
            return
        for fut in pending:
            await fut

    async def _send_held(self, held: list[Output]) -> list[Any]:
        """A batch's held outputs: those of bundled topics first, one bundle per topic and key
        in their order, then the rest in theirs. Every record still follows what caused it."""
        bundled = [o for o in held if o.topic in self.bundled_topics]
        return await self._send_bundles(bundled) + await self._send([o for o in held if o.topic not in self.bundled_topics])

    async def _send_bundles(self, outputs: list[Output]) -> list[Any]:
        groups: dict[tuple[str, str], list[Envelope]] = {}
        for output in outputs:
            groups.setdefault((output.topic, output.key), []).append(output.envelope)
        producer = self.app.producer
        topic = self.settings.topic
        pending = []
        for (name, key), envelopes in groups.items():
            for value, count in encode_bundle(envelopes):
                headers = [(BUNDLE_HEADER, str(count).encode())] if count > 1 else None
                pending.append(await producer.send(topic(name), key.encode(), value, None, None, headers))
        return pending

    async def publish_bundled(self, outputs: Iterable[Output]) -> None:
        """publish, with the outputs bound for one topic and key sent together as one bundle
        record (ADR 0034), in their order. Only for outputs whose readers all read bundles
        (the runtime's consume does). Outside a batch, wait right here."""
        batch = _current_batch.get()
        outputs = list(outputs) if batch is None else self._hold_latest(batch, outputs)
        await self._acknowledged(batch, await self._send_bundles(outputs))

    async def _send(self, outputs: Iterable[Output]) -> list[Any]:
        producer = self.app.producer
        topic = self.settings.topic
        return [
            await producer.send(topic(o.topic), o.key.encode(), o.value or encode(o.envelope), None, None, None)
            for o in outputs
        ]

    @staticmethod
    def _hold_latest(batch: _Batch, outputs: Iterable[Output]) -> list[Output]:
        """Keep a batch's `latest_only` outputs (a compacted topic's latest value per key, e.g.
        a namespace's usage) until its end, and send only the last one per key: its readers
        want the latest value, and the ones before it in the same batch were superseded before
        they were sent. A queue-manager batch changes a namespace's usage many times."""
        now = []
        for output in outputs:
            if output.latest_only:
                batch.latest.pop((output.topic, output.key), None)  # the last one goes last
                batch.latest[(output.topic, output.key)] = output
            else:
                now.append(output)
        return now

    # -- state --------------------------------------------------------------------------

    def table(self, name: str, *, partitions: int, help: str = "") -> faust.Table:
        """A changelog-backed table; values are JSON-able dicts managed by apply_once."""
        # faust buffers up to recovery_buffer_size changelog records per table before applying
        # them (default 1,000). A queue-manager record is a whole cohort (megabytes), so a
        # restart after 100,000 workloads peaked at 4.4 GB; a small buffer bounds that.
        # Not 1: faust then resumes the changelog partitions after recovery (ADR 0015).
        return self.app.Table(name, default=None, partitions=partitions, value_type=None, help=help,
                              recovery_buffer_size=RECOVERY_BUFFER_SIZE,
                              extra_topic_configs=changelog_topic_configs())

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
        Returns False for a duplicate. Only apply_once may stage values of `table` in a batch
        (it grows a staged value's seen list in place)."""
        batch = _current_batch.get()
        staged = batch.staged(table, key) if batch is not None else None
        entry = staged or self.entry(table, key)
        seen_ids = self._seen_ids(table, key, entry["seen"])
        if envelope.event_id in seen_ids:
            DUPLICATES_SKIPPED.labels(self.settings.service, table.name).inc()
            return False
        state, outputs = fold(entry["state"], envelope)
        await self.publish(outputs)
        if staged is not None:
            # The list is this batch's own copy (made at the key's first event of the batch),
            # so it grows in place: copying up to SEEN_WINDOW ids for every event was 2.7% of
            # the queue-manager's CPU in kueue-large-scale.
            seen = entry["seen"]
            seen.append(envelope.event_id)
            dropped = seen[: max(0, len(seen) - SEEN_WINDOW)]
            del seen[: len(dropped)]
        else:  # the stored list stays as it is until this batch's value is stored
            seen = entry["seen"][-(SEEN_WINDOW - 1) :]
            seen.append(envelope.event_id)
            dropped = entry["seen"][: len(entry["seen"]) - len(seen) + 1]
        self._seen_index[(id(table), key)] = (seen, seen_ids)
        seen_ids.difference_update(dropped)
        seen_ids.add(envelope.event_id)
        new_entry = {"state": state, "seen": seen}
        if batch is not None:
            batch.writes[(id(table), key)] = (table, key, new_entry, current_event())
            batch.applied[(id(table), key)] = batch.applied.get((id(table), key), 0) + 1
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

    def missing_topics(self) -> list[str]:
        """Consumed topics the consumer's metadata does not hold: not created yet. The group's
        assignment leaves them out until the next metadata refresh finds them (ADR 0057), so a
        service without them reads nothing; each is logged once, with what to do."""
        # aiokafka's cluster metadata, which every member refreshes (faust's `topic_partitions`
        # reads the coordinator's snapshot, which only the group's leader keeps)
        kafka_consumer = getattr(getattr(self.app.consumer, "_thread", None), "_consumer", None)
        if kafka_consumer is None:
            return []
        cluster = kafka_consumer._client.cluster
        missing = sorted(t for t in self.app.qm_guarded_topics if not cluster.partitions_for_topic(t))
        for topic in set(missing) - self._reported_missing:
            self.log.error("a consumed topic does not exist; create it (`qm topics create`), and this service "
                           "reads it within QM_METADATA_MAX_AGE_MS", topic=topic)
        self._reported_missing = set(missing)
        return missing

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
            also = {name: bool(check()) for name, check in self.ready_checks.items()}
            missing = self.missing_topics() if joined else []
            ready = joined and not app.rebalancing and not recovering and not missing and all(also.values())
            return web.json(
                {"ready": ready, "joined": joined, "rebalancing": app.rebalancing, "recovering": recovering,
                 "missing_topics": missing, **also},
                status=200 if ready else 503,
            )

        @app.page("/metrics")
        async def metrics(web, request):
            return web.bytes(metrics_text(request.query.getall("name[]", [])),
                             content_type=CONTENT_TYPE_LATEST.split(";")[0])

    def main(self) -> None:
        """Run as a faust worker: `python -m services.<name> worker`."""
        tune_gc()
        choose_event_loop(self.settings.service, os.environ.get("QM_EVENT_LOOP", "uvloop"))
        self.app.main()
