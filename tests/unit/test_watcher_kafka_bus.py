"""The watcher's Kafka shell puts a queued Job's pod and workload facts straight onto its
cohort's stream (ADR 0075), and everything else on qm.cluster as before; a configuration
published on qm.config routes from then on, as admission applies it. (The watcher against a
real API server and a real broker: tests/k8s/test_watcher_kafka.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from services.adapters import config_set
from services.adapters.settings import Settings
from services.contracts.codec import decode_all, envelope_to_dict, make_envelope
from services.contracts.events import PodRunning, WorkloadFinished, WorkloadSubmitted
from services.watcher.__main__ import KafkaBus, fact_router

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed"
AT = "2026-11-29T10:00:00Z"


class Producer:
    """Stands in for aiokafka's producer: what was sent, per topic."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    async def send_and_wait(self, topic: str, key: bytes, value: bytes, **_: object) -> None:
        self.sent.append((topic, key, value))


def observed(payload) -> dict:
    return envelope_to_dict(make_envelope(payload, producer="watcher", occurred_at=AT, identity=("obs",)))


def running(namespace: str = "ml-team", queue: str = "team-ml") -> dict:
    return observed(PodRunning(uid="pod-1", workload_uid="uid-1", namespace=namespace, name="train-0",
                               queue_name=queue, workload_name="train", started_at=AT))


async def sink_all(bus: KafkaBus, *events: dict) -> list[tuple[str, str, list[str]]]:
    if not isinstance(bus.producer, Producer):
        await bus.producer.stop()  # never started; closed so it is not reported as leaked
        bus.producer = Producer()
    bus.producer.sent.clear()
    for event in events:
        await bus.sink("qm.cluster", event["payload"].get("workload_uid") or event["payload"]["uid"], event)
    return [(topic, key.decode(), [e.event_type for e in decode_all(value)]) for topic, key, value in bus.producer.sent]


def test_a_queued_jobs_facts_go_onto_its_cohorts_stream_and_the_rest_onto_qm_cluster():
    async def scenario():
        bus = KafkaBus(Settings(service="watcher", topic_prefix="t."), fact_router(str(SEED)))
        submitted = observed(WorkloadSubmitted(uid="uid-1", namespace="ml-team", name="train", kind="Job",
                                               queue_name="team-ml", priority=0, created_at=AT,
                                               pod_sets=[{"name": "main", "count": 1, "requests": {"cpu": 1000}}]))
        finished = observed(WorkloadFinished(uid="uid-1", namespace="ml-team", name="train", queue_name="team-ml",
                                             succeeded=True, finished_at=AT))
        return await sink_all(bus, submitted, running(), finished, running(queue="not-configured"))

    key = fact_router(str(SEED)).config.routing_key("ml-team", "team-ml")
    assert asyncio.run(scenario()) == [
        ("t.qm.cluster", "uid-1", ["workload.submitted.v1"]),
        ("t.qm.workloads", key, ["pod.running.v1", "workload.running.v1"]),  # one record
        ("t.qm.workloads", key, ["workload.finished.v1"]),
        ("t.qm.cluster", "uid-1", ["pod.running.v1"]),  # admission forwards it, or stops the Job (ADR 0065)
    ]


def test_without_a_config_dir_every_fact_goes_to_qm_cluster():
    async def scenario():
        return await sink_all(KafkaBus(Settings(service="watcher"), fact_router(None)), running())

    assert asyncio.run(scenario()) == [("qm.cluster", "uid-1", ["pod.running.v1"])]


def test_a_set_published_on_qm_config_routes_from_then_on_and_a_refused_one_changes_nothing(tmp_path):
    docs = list(yaml.safe_load_all((SEED / "kueue.yaml").read_text()))
    for doc in docs:  # the same queues, and one more LocalQueue in another namespace
        if doc.get("kind") == "LocalQueue":
            docs.append({**doc, "metadata": {**doc["metadata"], "namespace": "vision-team"}})
            break
    (tmp_path / "kueue.yaml").write_text(yaml.safe_dump_all(docs))
    newer = config_set.snapshot(config_set.collect([tmp_path]), version=2, source="test")
    broken = config_set.snapshot(config_set.collect([tmp_path]), version=3, source="test")
    broken.objects[-1]["spec"] = {"clusterQueue": 7}

    async def scenario():
        bus = KafkaBus(Settings(service="watcher"), fact_router(str(SEED)))
        before = await sink_all(bus, running(namespace="vision-team"))
        bus.apply_config(newer)
        after = await sink_all(bus, running(namespace="vision-team"))
        bus.apply_config(broken)  # refused: the newer set stays
        still = await sink_all(bus, running(namespace="vision-team"))
        return before, after, still

    before, after, still = asyncio.run(scenario())
    assert [topic for topic, _, _ in before] == ["qm.cluster"]
    assert [topic for topic, _, _ in after] == ["qm.workloads"] and after == still
