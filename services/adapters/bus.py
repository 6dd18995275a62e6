"""Kafka plumbing shared by the services, the CLI and the tests (aiokafka).

Topic names, partitions and cleanup policies come from schemas/topics.yaml; nothing here
hard-codes a topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError
from aiokafka.partitioner import DefaultPartitioner, murmur2

from services.contracts.codec import (
    RECORD_TYPES,
    ContractError,
    Envelope,
    documents_of,
    encode,
    envelope_of,
    envelopes_in,
    parse,
)
from services.contracts.schemas import TopicSpec, dlq_retention_ms, topic_specs

# Headers on a dead-lettered message: why it was refused and where it came from.
log = logging.getLogger("qm.bus")

DLQ_ERROR = "qm-error"
DLQ_SOURCE_TOPIC = "qm-source-topic"
DLQ_SOURCE_PARTITION = "qm-source-partition"
DLQ_SOURCE_OFFSET = "qm-source-offset"
DLQ_CONSUMER = "qm-consumer"


class BrokerUnavailable(RuntimeError):
    pass


def dlq_headers(error: str, topic: str, partition: int, offset: int, consumer: str) -> list[tuple[str, bytes]]:
    return [
        (DLQ_ERROR, error.encode()),
        (DLQ_SOURCE_TOPIC, topic.encode()),
        (DLQ_SOURCE_PARTITION, str(partition).encode()),
        (DLQ_SOURCE_OFFSET, str(offset).encode()),
        (DLQ_CONSUMER, consumer.encode()),
    ]


async def wait_for_broker(bootstrap: str, timeout_s: float = 60.0) -> None:
    """Return once the broker answers a metadata request; raise BrokerUnavailable with what to do."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            await admin.start()
            await admin.list_topics()
            return
        except (TimeoutError, KafkaConnectionError, OSError) as exc:
            last = exc
            await asyncio.sleep(0.5)
        finally:
            await admin.close()
    raise BrokerUnavailable(
        f"no Kafka broker answers at {bootstrap} ({last}); start one with `make up` "
        "or set QM_KAFKA_BOOTSTRAP"
    )


@dataclass(frozen=True, slots=True)
class TopicCreation:
    name: str
    created: bool
    partitions: int
    cleanup_policy: str


def _new_topics(specs: Iterable[TopicSpec], prefix: str) -> list[NewTopic]:
    topics = []
    for spec in specs:
        config = {"cleanup.policy": spec.cleanup_policy}
        if spec.retention_ms is not None:
            config["retention.ms"] = str(spec.retention_ms)
        if spec.cleanup_policy == "compact":
            # Compact soon enough that a restarted reader does not replay a long history.
            config["min.cleanable.dirty.ratio"] = "0.1"
            config["segment.ms"] = "600000"
        topics.append(NewTopic(prefix + spec.name, spec.partitions, spec.replication_factor, topic_configs=config))
        topics.append(
            NewTopic(
                prefix + spec.dlq,
                1,
                spec.replication_factor,
                topic_configs={"cleanup.policy": "delete", "retention.ms": str(dlq_retention_ms())},
            )
        )
    return topics


async def create_topics(bootstrap: str, prefix: str = "") -> list[TopicCreation]:
    """Create every topic of topics.yaml (and its DLQ) that does not exist yet. Idempotent."""
    await wait_for_broker(bootstrap)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = _new_topics(topic_specs().values(), prefix)
        missing = [t for t in wanted if t.name not in existing]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another process created them between list and create
        return [
            TopicCreation(t.name, t in missing, t.num_partitions, t.topic_configs["cleanup.policy"]) for t in wanted
        ]
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, mine: Callable[[str], bool], batch: int = 100) -> list[str]:
    """Delete the topics whose name ``mine`` accepts, nothing else; returns their names.
    In batches: one request naming a thousand topics can outlast the admin client's timeout."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = sorted(t for t in await admin.list_topics() if mine(t))
        for start in range(0, len(names), batch):
            await admin.delete_topics(names[start : start + batch])
        return names
    finally:
        await admin.close()


class KeyPartitioner:
    """aiokafka's DefaultPartitioner (murmur2 of the key, as the Java client: the same partition
    for the same key), remembering each key's hash. Keys are cohorts and namespaces, a few dozen;
    murmur2 in pure Python was ~6% of the Kueue runner's CPU, hashing the same keys again."""

    __slots__ = ("_hashes",)
    MAX_KEYS = 65_536  # forgets them all beyond this (uid keys do not repeat)

    def __init__(self) -> None:
        self._hashes: dict[bytes, int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return DefaultPartitioner()(key, all_partitions, available)  # any partition
        hashed = self._hashes.get(key)
        if hashed is None:
            if len(self._hashes) >= self.MAX_KEYS:
                self._hashes.clear()
            hashed = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[hashed % len(all_partitions)]


class Publisher:
    """Encodes (strictly validating) and sends envelopes; used by the CLI, drivers and tests."""

    def __init__(self, bootstrap: str, prefix: str = "") -> None:
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                          partitioner=KeyPartitioner())
        self._prefix = prefix

    async def __aenter__(self) -> Publisher:
        await self._producer.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._producer.stop()

    async def publish(self, topic: str, key: str, envelope: Envelope) -> None:
        await self._producer.send(self._prefix + topic, key=key.encode(), value=encode(envelope))

    async def publish_raw(self, topic: str, key: bytes | None, value: bytes, headers=None) -> None:
        await self._producer.send(self._prefix + topic, key=key, value=value, headers=headers)

    async def flush(self) -> None:
        await self._producer.flush()


@dataclass(frozen=True, slots=True)
class RawRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int = 0  # the record's timestamp (its producer's send time, Kafka's CreateTime)


async def read_topic(bootstrap: str, topic: str, *, idle_timeout_s: float = 1.0) -> AsyncIterator[RawRecord]:
    """Every record currently in a topic, from the beginning to the end offsets seen at start.

    Reads without a consumer group (nothing committed), for tools and tests."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        if partitions is None:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if end[tp] > 0}
        idle_rounds = 0
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=int(idle_timeout_s * 1000))
            if not batch:
                for tp in list(remaining):
                    if await consumer.position(tp) >= end[tp]:
                        remaining.discard(tp)
                idle_rounds += 1
                if idle_rounds >= 3:
                    # Compaction or transaction markers can leave the end offset beyond the
                    # last readable record: after three quiet rounds everything readable is read.
                    return
                continue
            idle_rounds = 0
            for tp, records in batch.items():
                for r in records:
                    if r.offset < end[tp]:
                        yield RawRecord(r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers or ()), r.timestamp)
                if records and records[-1].offset + 1 >= end[tp]:
                    remaining.discard(tp)
    finally:
        await consumer.stop()


async def read_envelopes(bootstrap: str, topic: str) -> AsyncIterator[tuple[RawRecord, Envelope | ContractError]]:
    """Like read_topic, decoding each value; an unreadable one comes back as its ContractError."""
    async for record in read_topic(bootstrap, topic):
        try:
            documents = documents_of(record.value)
        except ContractError as error:
            yield record, error
            continue
        for _, _, envelope in envelopes_in(documents):  # a bundle's envelopes one by one (ADR 0034)
            yield record, envelope  # type: ignore[misc]


def read_envelope(value: bytes, wanted: frozenset[str] | None) -> Envelope | None:
    """The envelope of a message, or None for a well-formed one of a known event type that is
    not `wanted` (passed over unvalidated). Raises ContractError for anything unreadable,
    including an unknown event type."""
    return envelope_of(parse(value), wanted)


class TypeMarkers:
    """The event types a reader wants, as the bytes that name them in a record. A record whose
    bytes name none of them cannot be one of them, so it can be passed over before any parse
    (ADR 0028, 0030): the replicas, the faust agents' sieve and admission's fact lane do."""

    __slots__ = ("_markers",)

    def __init__(self, wanted: Iterable[str]) -> None:
        self._markers = tuple(event_type.encode() for event_type in sorted(wanted))

    def named_in(self, value: bytes | None) -> bool:
        return bool(value) and any(marker in value for marker in self._markers)  # type: ignore[operator]


class TypeSieve:
    """Tells which records a reader would pass over: exactly those `read_envelope` answers None
    for (well-formed JSON naming a known event type the reader does not read). The consumer
    drops them before faust builds a message and an event for each (ADR 0030); what cannot be
    read is still delivered, to be dead-lettered as before.

    A record that mentions a wanted type anywhere is delivered without a parse (it is parsed
    once, by the handler); the rest are parsed here, as `read_envelope` would have."""

    __slots__ = ("_unread", "_wanted")

    def __init__(self, wanted: frozenset[str]) -> None:
        self._wanted = TypeMarkers(wanted)
        self._unread = frozenset(RECORD_TYPES) - wanted

    def unread(self, value: bytes | None) -> bool:
        if not value or self._wanted.named_in(value):
            return False
        try:
            document = parse(value)
        except ContractError:
            return False
        if isinstance(document, list):  # a bundle (ADR 0034): unread when every envelope is
            return bool(document) and all(isinstance(d, dict) and d.get("event_type") in self._unread
                                          for d in document)
        return isinstance(document, dict) and document.get("event_type") in self._unread


async def assign_from_the_beginning(consumer: AIOKafkaConsumer, topics: Iterable[str],
                                    retry_s: float = 0.5) -> list[TopicPartition]:
    """Assign every partition of `topics` (waiting until the broker knows each topic) and seek
    to the beginning: how a reader without a consumer group starts."""
    tps = []
    for topic in topics:
        partitions = consumer.partitions_for_topic(topic)
        while partitions is None:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic)
            if partitions is None:
                await asyncio.sleep(retry_s)
        tps += [TopicPartition(topic, p) for p in partitions]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return tps


async def follow(
    bootstrap: str,
    topics: list[str],
    on_payload: Callable[[Any], None],
    caught_up: asyncio.Event | None = None,
    wanted: frozenset[str] | None = None,
    *,
    fetch_max_wait_ms: int = 500,
    fetch_min_bytes: int = 1,
) -> None:
    """Apply every record's payload of `topics` from the beginning, then keep following (see
    Follower, which this runs)."""
    await Follower(bootstrap, topics, on_payload, caught_up, wanted, fetch_max_wait_ms=fetch_max_wait_ms,
                   fetch_min_bytes=fetch_min_bytes).run()


class Follower:
    """Applies every record's payload of `topics` from the beginning, then keeps following, with
    no consumer group: every process that follows sees every partition (read-only replicas,
    configuration). `caught_up` is set once the end offsets seen at start are reached.

    `wanted`: the event types applied. A record whose bytes name none of them is passed over
    unparsed (a replica of qm.cluster wants a few fact types among hundreds of thousands of pod
    facts); one that names one but is another known type is passed over unvalidated (see
    read_envelope). Unreadable records that name a wanted type are logged and skipped (their
    producer dead-letters nothing here; the services that read the topic dead-letter them).

    `fetch_min_bytes` / `fetch_max_wait_ms`: how much the broker gathers, and for how long at
    most, before it answers a fetch. The defaults answer as soon as anything is there; on a
    busy topic that is a fetch per handful of records (see LiveReplica).

    `read_past()` waits until everything appended before a given record is applied: a reader
    of another consumer can be sure the replica is not behind what it just read."""

    def __init__(self, bootstrap: str, topics: list[str], on_payload: Callable[[Any], None],
                 caught_up: asyncio.Event | None = None, wanted: frozenset[str] | None = None, *,
                 fetch_max_wait_ms: int = 500, fetch_min_bytes: int = 1) -> None:
        self._bootstrap, self._topics, self._on_payload = bootstrap, topics, on_payload
        self._caught_up, self._wanted = caught_up, wanted
        self._fetch = {"fetch_max_wait_ms": fetch_max_wait_ms, "fetch_min_bytes": fetch_min_bytes}
        self._consumer: AIOKafkaConsumer | None = None  # set once its partitions are assigned
        self._tps: list[TopicPartition] = []
        self._applied = asyncio.Condition()  # notified after every batch of records is applied
        self._reached: dict[TopicPartition, int] = {}  # end offsets a read_past has seen applied

    async def run(self) -> None:
        wanted = self._wanted
        markers = None if wanted is None else TypeMarkers(wanted)
        consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, enable_auto_commit=False,
                                    auto_offset_reset="earliest", **self._fetch)
        await consumer.start()
        try:
            tps = await assign_from_the_beginning(consumer, self._topics)
            self._consumer, self._tps = consumer, tps
            end = await consumer.end_offsets(tps)
            behind = {tp for tp in tps if end[tp] > 0}
            caught_up = self._caught_up
            if caught_up is not None and not behind:
                caught_up.set()
            while True:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for record in records:
                        if markers is not None and not markers.named_in(record.value):
                            continue
                        try:
                            documents = documents_of(record.value)
                        except ContractError as error:
                            log.warning("unreadable record on %s skipped: %s", record.topic, error)
                            continue
                        for _, _, envelope in envelopes_in(documents, wanted):
                            if isinstance(envelope, ContractError):
                                log.warning("unreadable record on %s skipped: %s", record.topic, envelope)
                            elif envelope is not None:
                                self._on_payload(envelope.payload)
                if batch:
                    async with self._applied:
                        self._applied.notify_all()
                if caught_up is not None and not caught_up.is_set():
                    for tp in list(behind):
                        if await consumer.position(tp) >= end[tp]:
                            behind.discard(tp)
                    if not behind:
                        caught_up.set()
        finally:
            self._consumer = None
            await consumer.stop()

    async def read_past(self, topic: str, partition: int, offset: int, timeout_s: float) -> bool:
        """Wait until every record appended to the followed topics before the record at (topic,
        partition, offset) is applied. False if that did not happen within `timeout_s`, or the
        follower is not running.

        It asks the broker for the end offsets and waits until they are applied. Those end
        offsets are remembered: a record below one of them was appended before that question,
        so it needs no second one (a burst of such records waits once)."""
        if self._reached.get(TopicPartition(topic, partition), 0) > offset:
            return True
        consumer = self._consumer
        if consumer is None:
            return False
        try:
            async with asyncio.timeout(timeout_s):
                end = await consumer.end_offsets(self._tps)

                async def applied() -> bool:
                    return all([await consumer.position(tp) >= at for tp, at in end.items()])

                async with self._applied:
                    while not await applied():
                        await self._applied.wait()
        except TimeoutError:
            return False
        for tp, at in end.items():
            self._reached[tp] = max(at, self._reached.get(tp, 0))
        return True
