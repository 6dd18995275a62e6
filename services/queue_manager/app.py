"""The queue-manager service: the single writer of quota.

Wiring only; the decisions are in state.apply (a pure fold over the quota core).
    qm.workloads (keyed by cohort)  -> fold per cohort -> QuotaReserved, Pending, Released, ...
                                       (pod and node facts from qm.cluster arrive on it already,
                                       re-keyed by admission: ADR 0023; the preemption
                                       service writes its answers onto it: ADR 0025)
    qm.clock     (one partition)    -> one tick per cohort onto qm.workloads
    QuotaRules configured: qm.usage + node capacity (read whole) -> cluster.signals.v1 per ruled
    cohort at each tick, so the fold chooses effective borrowingLimits from facts on its stream
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from services.adapters import config_set
from services.adapters.bus import follow
from services.adapters.kueue_config import KueueConfig
from services.adapters.live_replica import LiveReplica
from services.adapters.runtime import Output, ServiceRuntime
from services.adapters.settings import Settings
from services.contracts.codec import Envelope, make_envelope
from services.contracts.events import (
    ClockTick,
    ClusterSignals,
    ConfigSnapshot,
    WorkloadRejected,
)
from services.contracts.schemas import topic_specs
from services.core.quota import ConfigError, load_objects
from services.policy.errors import PolicyError
from services.policy.loader import read_documents
from services.policy.quota_rules import load_quota_rules
from services.queue_manager import state as fold

PENDING = Gauge("kueue_pending_workloads", "Pending workloads per ClusterQueue", ["cluster_queue"])
ADMITTED_TOTAL = Counter("kueue_admitted_workloads_total", "Workloads admitted", ["cluster_queue"])
RESOURCE_USAGE = Gauge(
    "kueue_cluster_queue_resource_usage", "Reserved quota", ["cluster_queue", "flavor", "resource"]
)
NOMINAL_QUOTA = Gauge("kueue_cluster_queue_nominal_quota", "Nominal quota", ["cluster_queue", "flavor", "resource"])
DECISION_SECONDS = Histogram(
    "qm_queue_decision_seconds",
    "From a workload.validated record's append to qm.workloads until the queue-manager has applied it "
    "(its QuotaReserved or Pending acknowledged by the broker): queueing delay included",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
OBSERVE_EVERY_S = 1.0  # gauges walk a cohort's whole state: once a second for the cohorts that changed

settings = Settings.from_env("queue-manager")
# Its committed offsets on qm.workloads are how far behind it is, and admission waits while that
# is too far (ADR 0049): committed every 0.25 s, not faust's 2.8 s, the reading is that fresh.
COMMIT_INTERVAL_S = 0.25
runtime = ServiceRuntime(settings, broker_commit_interval=COMMIT_INTERVAL_S)
config_dir = Path(os.environ.get("QM_CONFIG_DIR", "examples/seed"))
config = KueueConfig.load(config_dir)
objects = config.objects
try:  # the same files KueueConfig read: the directory's own, not its subdirectories
    quota_rules = load_quota_rules(read_documents(sorted(config_dir.glob("*.y*ml")))[0], objects)
except PolicyError as error:
    raise SystemExit(f"queue-manager: cannot load the QuotaRules in {config_dir}: {error}") from None
try:
    requeue_by_creation = fold.by_creation_timestamp(os.environ.get("QM_REQUEUE_TIMESTAMP", "Eviction"))
except ValueError as error:
    raise SystemExit(f"queue-manager: {error}") from None
context = fold.Context(
    objects=objects,
    pods_ready_timeout_s=float(os.environ.get("QM_PODS_READY_TIMEOUT_S", 300)),
    backoff_base_s=float(os.environ.get("QM_BACKOFF_BASE_S", 60)),
    backoff_max_s=float(os.environ.get("QM_BACKOFF_MAX_S", 3600)),
    max_expiries=int(os.environ.get("QM_MAX_EXPIRIES", 3)),
    requeue_after_expiry_by_creation=requeue_by_creation,  # ADR 0074
    zombie_ttl_s=float(os.environ.get("QM_ZOMBIE_TTL_S", 600)),
    preemption_answer_timeout_s=float(os.environ.get("QM_PREEMPTION_ANSWER_TIMEOUT_S", 60)),
    coalesce_drains=os.environ.get("QM_COALESCE_DRAINS", "1") != "0",  # ADR 0016
    node_labels=config.node_labels(),
    quota_rules=quota_rules,
)
# Dynamic quota needs the whole cluster's usage and nodes; read only while some rule exists.
live = LiveReplica(settings.kafka_bootstrap, {name: settings.topic(name) for name in ("qm.usage", "qm.cluster")})
live.objects = objects
rules_exist = asyncio.Event()
signals_said: dict[str, dict] = {}  # cohort key -> the signals last published (no repeats)
if quota_rules:
    rules_exist.set()
cohorts = runtime.table("cohorts", partitions=topic_specs()["qm.workloads"].partitions, help="queues per cohort")

for cq_name, cq in objects.cluster_queues.items():
    for group in cq.resource_groups:
        for flavor in group.flavors:
            for quota in flavor.resources:
                NOMINAL_QUOTA.labels(cq_name, flavor.flavor, quota.resource).set(quota.nominal / 1000)


changed_cohorts: set[str] = set()  # cohorts whose state moved since their gauges were last set


@runtime.app.timer(OBSERVE_EVERY_S)
async def observe_changed_cohorts() -> None:
    for key in sorted(changed_cohorts):
        entry = cohorts.get(key)
        if entry is not None and entry.get("state") is not None:
            _observe(key, entry["state"])
    changed_cohorts.clear()


def _observe(key: str, state: dict) -> None:
    """Pending workloads and reserved quota per ClusterQueue of this cohort (zero included, so a
    queue that emptied does not keep showing its last figure)."""
    queues = [cq for cq, root in config.root_of.items() if root == key]
    pending = dict.fromkeys(queues, 0)
    for w in state["pending"].values():
        pending[w["cluster_queue"]] = pending.get(w["cluster_queue"], 0) + 1
    for cq, n in pending.items():
        PENDING.labels(cq).set(n)
    usage = {(cq, quota_flavor.flavor, quota.resource): 0
             for cq in queues for group in objects_of(cq) for quota_flavor in group.flavors
             for quota in quota_flavor.resources}
    for entry in state["admitted"].values():
        for flavor, by_resource in entry["usage"].items():
            for resource, milli in by_resource.items():
                usage[(entry["cluster_queue"], flavor, resource)] = usage.get(
                    (entry["cluster_queue"], flavor, resource), 0) + milli
    for (cq, flavor, resource), milli in usage.items():
        RESOURCE_USAGE.labels(cq, flavor, resource).set(milli / 1000)


def objects_of(cluster_queue: str):
    spec = config.objects.cluster_queues.get(cluster_queue)
    return spec.resource_groups if spec else ()


keyed_contexts = fold.KeyedContexts()


async def on_workload_event(envelope: Envelope, event) -> None:
    if not isinstance(envelope.payload, fold.FOLDED):
        return  # our own decisions coming back: nothing to fold, no state to store
    key = event.key.decode() if event.key else envelope.payload.uid
    if isinstance(envelope.payload, WorkloadRejected) and key not in config.root_of.values():
        return  # rejected in no LocalQueue (keyed by namespace): admission's fact lane stops its Job (ADR 0065)
    applied = await runtime.apply_once(cohorts, key, envelope, lambda s, e: fold.apply(s, e, keyed_contexts.of(context, key)))
    if not applied:
        return
    if envelope.event_type == "workload.validated.v1":
        state = runtime.entry(cohorts, key)["state"]
        appended = getattr(getattr(event, "message", None), "timestamp", None)
        if appended:
            DECISION_SECONDS.observe(max(0.0, time.time() - appended))
        if envelope.payload.uid in state["admitted"]:
            ADMITTED_TOTAL.labels(state["admitted"][envelope.payload.uid]["cluster_queue"]).inc()
    changed_cohorts.add(key)


async def on_clock_tick(envelope: Envelope, event) -> None:
    """Ticks arrive on one partition; every cohort owner needs them to expire reservations.
    With QuotaRules, the cluster's live figures follow the tick onto each ruled cohort's stream
    (when they changed since last said)."""
    outputs = [
        Output("qm.workloads", key, make_envelope(
            ClockTick(at=envelope.payload.at, source=envelope.payload.source), producer=fold.PRODUCER,
            occurred_at=envelope.occurred_at, identity=(envelope.event_id, key), cause=envelope))
        for key in config.cohort_keys()
    ]
    if context.quota_rules and live.ready():
        signals = live.cluster()
        for key in sorted({config.root_of[r.cluster_queue] for r in context.quota_rules
                           if r.cluster_queue in config.root_of}):
            if signals_said.get(key) == signals:
                continue
            signals_said[key] = signals
            outputs.append(Output("qm.workloads", key, make_envelope(
                ClusterSignals(at=envelope.payload.at, signals=signals), producer=fold.PRODUCER,
                occurred_at=envelope.occurred_at, identity=(envelope.event_id, key, "signals"), cause=envelope)))
    await runtime.publish(outputs)


def apply_config(payload) -> None:
    """A new active set from qm.config: queues and quotas switch for the next decision."""
    global config, context
    if not isinstance(payload, ConfigSnapshot):
        return
    kueue = [(d.file, d.body) for d in config_set.documents(payload)
             if str(d.body.get("apiVersion", "")).startswith("kueue.x-k8s.io/")]
    if not kueue:
        return
    try:
        new_config = KueueConfig.from_objects(load_objects(kueue))
        rules = load_quota_rules(config_set.documents(payload), new_config.objects)
    except (ConfigError, PolicyError) as error:
        runtime.log.error("config refused; the previous set stays active", error=str(error), detail=payload.digest)
        return
    config = new_config
    context = dataclasses.replace(context, objects=config.objects, node_labels=config.node_labels(), quota_rules=rules)
    live.objects = config.objects
    signals_said.clear()  # new rules judge the current figures at the next tick
    if rules:
        rules_exist.set()
    runtime.log.info("config applied", detail=f"version {payload.version} {payload.digest}")


@runtime.app.task
async def follow_config() -> None:
    await follow(settings.kafka_bootstrap, [settings.topic("qm.config")], apply_config)


@runtime.app.task
async def follow_live_state() -> None:
    """Node capacity and every namespace's usage, for the `cluster` signals of QuotaRules."""
    await rules_exist.wait()
    await live.run()


# A batch's decisions reach the cohort's stream as one bundle per cohort (ADR 0034): read back
# by this fold and the cost service, one record each instead of one per decision.
runtime.bundled_topics = frozenset({"qm.workloads"})
runtime.consume("qm.workloads", on_workload_event, batched=True, reads=fold.FOLDED)  # the cohort table's only writer
runtime.consume("qm.clock", on_clock_tick)


@runtime.app.page("/queues")
async def queues_view(web, request):
    view = {}
    for key, entry in cohorts.items():
        state = entry["state"]
        view[key] = {
            "pending": sorted(f"{w['namespace']}/{w['name']}" for w in state["pending"].values()),
            "admitted": sorted(f"{e['namespace']}/{e['name']}" for e in state["admitted"].values()),
            # borrowingLimits QuotaRules set now ("cq|flavor|resource" -> milli, null: no limit)
            "dynamic_borrowing_limits": state.get("limits", {}),
        }
    return web.json(view)


@runtime.app.page("/usage/{namespace}")
async def usage_view(web, request, namespace):
    admitted = [a for entry in cohorts.values() for a in entry["state"]["admitted"].values()]
    reserved, running, total = fold.namespace_usage(admitted, namespace)
    return web.json({"namespace": namespace, "reserved": reserved, "running": running, "total": total})
