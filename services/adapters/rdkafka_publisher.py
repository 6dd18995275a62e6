"""A Publisher that sends from librdkafka's own thread (confluent-kafka), for the simulated cluster.

The simulator stands in for a whole cluster's watcher and shares the two cores with the five
services it drives. Through aiokafka every record cost it ~25 µs of Python (a future, the
accumulator, the partitioner, the sender's request encoding); through librdkafka ~2.5 µs, the
rest done in C on a thread of its own (ADR 0052). The services keep faust's aiokafka producer.

Same interface and guarantees as services.adapters.bus.Publisher: envelopes are encoded with
strict validation, a key always lands on the partition the Java client and aiokafka's default
partitioner pick (murmur2), records of one key keep their order (idempotent producer), and
``flush()`` returns once everything sent so far is acknowledged, raising if any was refused.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading

from confluent_kafka import KafkaError, KafkaException, Producer

from services.adapters.bus import BrokerUnavailable
from services.contracts.codec import Envelope, encode

log = logging.getLogger("qm.sim.publisher")

#: How long entering waits for the broker's first answer (librdkafka itself would queue records
#: for minutes before it gave up on a broker that is not there).
CONNECT_TIMEOUT_S = 10.0
#: How long flush() sleeps between two looks at librdkafka's queue (the event loop runs meanwhile).
FLUSH_POLL_S = 0.005


class DeliveryFailed(RuntimeError):
    """The broker refused, or librdkafka gave up on, records this publisher sent."""


class RdkafkaPublisher:
    """``async with RdkafkaPublisher(bootstrap, prefix) as bus: await bus.publish(topic, key, envelope)``."""

    def __init__(self, bootstrap: str, prefix: str = "", *, linger_ms: int = 5) -> None:
        self._config = {
            "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms,  # as Publisher's aiokafka producer
            "enable.idempotence": True,  # acks=all, and no reordering of a key's records on a retry
            "partitioner": "murmur2_random",  # the Java client's (and aiokafka's) partition for a key
            "on_delivery": self._delivered,
            "error_cb": self._client_error,
            "logger": log,  # librdkafka's own log lines, through ours rather than straight to stderr
        }
        self._prefix = prefix
        self._producer: Producer | None = None
        self._failures: list[str] = []

    async def __aenter__(self) -> RdkafkaPublisher:
        producer = Producer(self._config)
        try:  # a metadata request, off the event loop: fail now, with what to do, if nobody answers
            await asyncio.to_thread(producer.list_topics, timeout=CONNECT_TIMEOUT_S)
        except KafkaException as error:
            raise BrokerUnavailable(
                f"no Kafka broker answers at {self._config['bootstrap.servers']} within {CONNECT_TIMEOUT_S:.0f} s "
                f"({error.args[0].str()}); start one with `make up` or set QM_KAFKA_BOOTSTRAP") from None
        self._producer = producer
        return self

    async def __aexit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            await self.flush()
        elif self._producer is not None:
            self._producer.purge()  # failing anyway: drop what is queued rather than wait for it
            self._producer.flush(0)

    async def publish(self, topic: str, key: str, envelope: Envelope) -> None:
        self._send(topic, key.encode(), encode(envelope), None)

    async def publish_raw(self, topic: str, key: bytes | None, value: bytes, headers=None) -> None:
        self._send(topic, key, value, headers)

    async def flush(self) -> None:
        """Wait (without blocking the event loop) until every record sent is acknowledged."""
        producer = self._running()
        while producer.flush(0):
            await asyncio.sleep(FLUSH_POLL_S)
        if self._failures:
            failures, self._failures = self._failures, []
            more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
            raise DeliveryFailed(f"{len(failures)} records not delivered: {'; '.join(failures[:3])}{more}")

    def _send(self, topic: str, key: bytes | None, value: bytes, headers) -> None:
        producer = self._running()
        while True:
            try:
                producer.produce(self._prefix + topic, value, key, headers=headers)
                break
            except BufferError:  # librdkafka's local queue is full: let it drain, then retry
                producer.poll(0.01)
        # No poll here: librdkafka sends from its own thread, and flush() (the simulator's, at
        # every progress report) serves the delivery reports; polling after every record was a
        # third of this method's cost.

    def _running(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("RdkafkaPublisher used outside `async with`")
        return self._producer

    def _delivered(self, error: KafkaError | None, message) -> None:
        if error is not None:
            self._failures.append(f"{message.topic()}[{message.partition()}]: {error.str()}")

    def _client_error(self, error: KafkaError) -> None:
        # A broker that cannot be reached is retried by librdkafka (said here, so an outage is
        # seen before the records time out); only a fatal error ends the run.
        if error.fatal():
            self._failures.append(f"fatal producer error: {error.str()}")
            raise KafkaException(error)
        log.warning("Kafka producer: %s (librdkafka retries)", error.str())


class OutputProducer:
    """A service's outputs through librdkafka (ADR 0054): ``await send(...)`` queues a record and
    returns a future that the broker's acknowledgement settles, as aiokafka's producer does, so
    the runtime's commit (outputs acknowledged before any state or cursor is stored) is unchanged.

    librdkafka encodes, batches and sends from its own threads. Its delivery reports are served
    on a thread of this class: each poll's reports settle their futures with one hand-over to the
    event loop, not one per record. Idempotent (acks=all; a retry cannot reorder a key's records),
    and a key lands on the partition aiokafka's and the Java client's murmur2 pick."""

    def __init__(self, bootstrap: str, *, client_id: str, linger_ms: int, max_record_bytes: int) -> None:
        self._producer = Producer({
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": linger_ms,
            "socket.nagle.disable": True,  # as asyncio's sockets: a small request leaves at once
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "message.max.bytes": max_record_bytes,
            "error_cb": self._client_error,
            "logger": log,
        })  # fmt: skip
        self._loop: asyncio.AbstractEventLoop | None = None
        self._settled: list[tuple[asyncio.Future, KafkaError | None, str]] = []
        self._closing = False
        self._reports = threading.Thread(target=self._serve_reports, name=f"{client_id}-delivery", daemon=True)

    async def send(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None,
                   timestamp: float | None = None, headers: list[tuple[str, bytes]] | None = None) -> asyncio.Future:
        """The signature of faust's producer.send; `partition` and `timestamp` must be None
        (the key picks the partition, the broker's clock the time)."""
        if partition is not None or timestamp is not None:
            raise ValueError("OutputProducer picks partitions by key and leaves timestamps to the broker")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._reports.start()
        future = self._loop.create_future()
        report = functools.partial(self._delivered, future)
        while True:
            try:
                self._producer.produce(topic, value, key, headers=headers, on_delivery=report)
                return future
            except BufferError:  # librdkafka's local queue is full: let its threads drain it
                await asyncio.sleep(0.005)

    def close(self, timeout_s: float = 5.0) -> int:
        """Wait up to `timeout_s` for what is queued; returns how many records were left undelivered
        (their batches were never committed: whoever consumes next reads them again)."""
        self._closing = True
        left = self._producer.flush(timeout_s)
        if self._reports.is_alive():
            self._reports.join(1.0)
        return left

    def _serve_reports(self) -> None:
        loop = self._loop
        assert loop is not None
        while not self._closing:
            self._producer.poll(0.05)  # runs _delivered for each report, on this thread
            if self._settled:
                settled, self._settled = self._settled, []
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:  # the loop is closed: the service is stopping
                    return

    def _delivered(self, future: asyncio.Future, error: KafkaError | None, message) -> None:
        where = f"{message.topic()}[{message.partition()}]" if error is not None else ""
        self._settled.append((future, error, where))

    def _client_error(self, error: KafkaError) -> None:
        if error.fatal():  # e.g. the idempotent producer's sequence broke: nothing more is sent
            log.error("Kafka output producer failed: %s", error.str())
        else:
            log.warning("Kafka output producer: %s (librdkafka retries)", error.str())


def _settle(settled: list[tuple[asyncio.Future, KafkaError | None, str]]) -> None:
    for future, error, where in settled:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(DeliveryFailed(f"{where}: {error.str()}"))
