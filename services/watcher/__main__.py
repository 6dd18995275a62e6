"""The watcher process: the Kubernetes side (services/watcher/main.run) wired to Kafka.

    python -m services.watcher        # QM_K8S_SERVER, QM_K8S_TOKEN_FILE, QM_K8S_CA, QM_KAFKA_BOOTSTRAP

Observations go to qm.cluster / qm.clock (validated strictly, as every producer does).
Actions come from qm.actions in the consumer group qm-watcher; an action's offset is
committed only once it and every action before it in its partition has been applied, so a
crash replays unapplied actions (they are idempotent) and never skips one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from services.adapters import logs
from services.adapters.bus import KeyPartitioner, dlq_headers
from services.adapters.gc_tuning import tune_gc
from services.adapters.settings import Settings
from services.contracts.codec import ContractError, validate_document
from services.watcher.main import ActionRunner, WatcherSettings, run

log = logging.getLogger("qm.watcher")


class KafkaBus:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=5,
                                         partitioner=KeyPartitioner())
        self.consumer = AIOKafkaConsumer(
            settings.topic("qm.actions"), bootstrap_servers=settings.kafka_bootstrap, group_id=settings.app_id,
            enable_auto_commit=False, auto_offset_reset="earliest",
        )
        self.in_flight: dict[TopicPartition, list[tuple[int, asyncio.Task[Any]]]] = {}

    async def sink(self, topic: str, key: str, event: dict[str, Any]) -> None:
        validate_document(event, strict=True)
        await self.producer.send_and_wait(self.settings.topic(topic), key=key.encode(), value=orjson.dumps(event))

    async def actions(self, runner: ActionRunner) -> AsyncIterator[Mapping[str, Any]]:
        """Feeds the runner itself (to track each action's task); yields nothing."""
        async for record in self.consumer:
            tp = TopicPartition(record.topic, record.partition)
            try:
                document = orjson.loads(record.value)
                validate_document(document, strict=False)
            except (orjson.JSONDecodeError, ContractError) as error:
                await self.producer.send_and_wait(
                    self.settings.topic("qm.actions.dlq"), key=record.key, value=record.value,
                    headers=dlq_headers(f"contract: {error}", record.topic, record.partition, record.offset,
                                        self.settings.app_id))
                self.in_flight.setdefault(tp, []).append((record.offset, _done()))
                continue
            self.in_flight.setdefault(tp, []).append((record.offset, runner.submit(document)))
        if False:  # pragma: no cover - makes this an async generator for run()'s signature
            yield {}

    async def commit_applied(self) -> None:
        while True:
            await asyncio.sleep(1)
            offsets = {}
            for tp, entries in self.in_flight.items():
                while entries and entries[0][1].done():
                    offsets[tp] = entries.pop(0)[0] + 1
            if offsets:
                await self.consumer.commit(offsets)


def _done() -> asyncio.Task[Any]:
    async def nothing() -> None:
        return None

    return asyncio.ensure_future(nothing())


async def main() -> None:
    settings = Settings.from_env("watcher")
    logs.configure("watcher", settings.log_level)
    tune_gc()
    bus = KafkaBus(settings)
    await bus.producer.start()
    await bus.consumer.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    committer = asyncio.create_task(bus.commit_applied())
    watcher = asyncio.create_task(run(WatcherSettings.from_env(), bus.sink, None, action_source=bus.actions))
    try:
        await asyncio.wait([watcher, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        if watcher.done() and watcher.exception():
            raise watcher.exception()  # type: ignore[misc]
    finally:
        watcher.cancel()
        committer.cancel()
        await bus.consumer.stop()
        await bus.producer.stop()


if __name__ == "__main__":
    asyncio.run(main())
