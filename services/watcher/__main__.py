"""The watcher process: the Kubernetes side (services/watcher/main.run) wired to Kafka.

    python -m services.watcher        # QM_K8S_SERVER, QM_K8S_TOKEN_FILE, QM_K8S_CA, QM_KAFKA_BOOTSTRAP

Observations go to qm.cluster / qm.clock (validated strictly, as every producer does), except
the pod and workload facts of a Job in a LocalQueue of QM_CONFIG_DIR (or of the set last
published on qm.config): those go straight onto their cohort's stream on qm.workloads, as
admission's fact lane would have sent them (ADR 0075).
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

from services.adapters import config_set, logs
from services.adapters.bus import KeyPartitioner, dlq_headers, follow
from services.adapters.cohort_stream import ROUTED_AT_SOURCE, FactRouter
from services.adapters.gc_tuning import tune_gc
from services.adapters.kueue_config import KueueConfig
from services.adapters.settings import Settings
from services.contracts.codec import ContractError, encode_bundle, from_document, validate_document
from services.contracts.events import ConfigSnapshot
from services.core.quota import ConfigError
from services.policy import PolicyError
from services.watcher.main import ActionRunner, WatcherSettings, run
from services.watcher.normalize import PRODUCER as WATCHER

log = logging.getLogger("qm.watcher")


class KafkaBus:
    def __init__(self, settings: Settings, router: FactRouter | None = None) -> None:
        self.settings = settings
        self.router = router
        self.producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=5,
                                         partitioner=KeyPartitioner())
        self.consumer = AIOKafkaConsumer(
            settings.topic("qm.actions"), bootstrap_servers=settings.kafka_bootstrap, group_id=settings.app_id,
            enable_auto_commit=False, auto_offset_reset="earliest",
        )
        self.in_flight: dict[TopicPartition, list[tuple[int, asyncio.Task[Any]]]] = {}

    async def sink(self, topic: str, key: str, event: dict[str, Any]) -> None:
        validate_document(event, strict=True)
        if self.router is not None and event["event_type"] in ROUTED_AT_SOURCE:
            routed = self.router.outputs(from_document(event))
            if routed:  # one cohort key: the fact, and for a running pod the workload.running with it
                for value, _count in encode_bundle([output.envelope for output in routed]):
                    await self.producer.send_and_wait(self.settings.topic("qm.workloads"), key=routed[0].key.encode(),
                                                      value=value)
                return
        await self.producer.send_and_wait(self.settings.topic(topic), key=key.encode(), value=orjson.dumps(event))

    def apply_config(self, payload: Any) -> None:
        """A new active set from qm.config routes the facts from now on, as admission applies it:
        the whole set or, if it is refused, none of it."""
        if self.router is None or not isinstance(payload, ConfigSnapshot):
            return
        try:
            objects, _policies = config_set.validate(config_set.documents(payload))
        except (ConfigError, PolicyError) as error:
            log.warning("config %s refused; facts are still routed with the previous set: %s", payload.digest, error)
            return
        if objects.cluster_queues:
            self.router.config = KueueConfig.from_objects(objects)
            log.info("facts routed with config version %s (%s)", payload.version, payload.digest)

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


def fact_router(config_dir: str | None) -> FactRouter | None:
    """Routes facts with the Kueue objects of QM_CONFIG_DIR; None without one (every fact then
    goes to qm.cluster, and admission forwards it)."""
    if not config_dir:
        log.info("no QM_CONFIG_DIR: pod facts go to qm.cluster, for admission to forward (ADR 0075)")
        return None
    return FactRouter(KueueConfig.load(config_dir), WATCHER)


def _done() -> asyncio.Task[Any]:
    async def nothing() -> None:
        return None

    return asyncio.ensure_future(nothing())


async def main() -> None:
    settings = Settings.from_env("watcher")
    logs.configure("watcher", settings.log_level)
    tune_gc()
    watcher_settings = WatcherSettings.from_env()
    bus = KafkaBus(settings, fact_router(watcher_settings.config_dir))
    await bus.producer.start()
    await bus.consumer.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    committer = asyncio.create_task(bus.commit_applied())
    configs = asyncio.create_task(follow(settings.kafka_bootstrap, [settings.topic("qm.config")], bus.apply_config))
    watcher = asyncio.create_task(run(watcher_settings, bus.sink, None, action_source=bus.actions))
    try:
        await asyncio.wait([watcher, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        if watcher.done() and watcher.exception():
            raise watcher.exception()  # type: ignore[misc]
    finally:
        watcher.cancel()
        committer.cancel()
        configs.cancel()
        await bus.consumer.stop()
        await bus.producer.stop()


if __name__ == "__main__":
    asyncio.run(main())
