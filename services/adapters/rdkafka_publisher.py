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
import logging

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
