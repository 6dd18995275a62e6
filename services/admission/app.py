"""The admission service: policy as code on the bus, and the Kubernetes webhook.

    qm.cluster (workload.submitted.v1) -> evaluate policies against the live replica ->
        qm.workloads: workload.validated.v1 keyed by cohort (for the queue-manager), or
                      workload.rejected.v1 with every violated rule, or
                      workload.pending.v1 (Inadmissible) when the LocalQueue does not exist.
    qm.cluster (node capacity; pod running / finished and workload finished that their source
        did not route itself, ADR 0075) -> re-keyed by cohort onto qm.workloads (cohort_stream;
        ADR 0023) by the fact lane, a consumer group of its own, so that facts do not wait behind
        a burst of submissions (fact_lane; ADR 0026).
    QM_WEBHOOK_PORT set -> the same evaluator also serves /validate and /mutate (HTTPS when
    QM_WEBHOOK_CERT and QM_WEBHOOK_KEY are given).
Policies load from QM_POLICY_DIR at start; a new set published on qm.config (`qm config publish`)
replaces policies and queues together; `kill -HUP` reloads the directory. An invalid set is
refused and the last good one stays active.
"""

from __future__ import annotations

import dataclasses
import os
import signal

from prometheus_client import Counter, Gauge

from services.adapters import config_set
from services.adapters.bus import follow
from services.adapters.cohort_stream import cohort_stream_outputs
from services.adapters.downstream_lag import GroupLag, Pace, follow_lag
from services.adapters.kueue_config import KueueConfig
from services.adapters.live_replica import LiveReplica
from services.adapters.runtime import FETCH_MAX_WAIT_MS, FETCH_MIN_BYTES, Output, ServiceRuntime
from services.adapters.settings import Settings, milliseconds_env, whole_number_env
from services.admission import placement, translate
from services.admission.fact_lane import FactLane, run_forever
from services.contracts.codec import Envelope, make_envelope
from services.contracts.events import ConfigSnapshot, WorkloadSubmitted
from services.core.quota import ConfigError
from services.policy import AdmissionDecision, EnforcementPoint, evaluate
from services.policy.errors import PolicyError
from services.policy.store import PolicyStore
from services.policy.views import cost_center_of

DECISIONS = Counter("qm_admission_decisions_total", "Bus admission decisions", ["decision"])
REJECTED, NOT_IN_A_QUEUE, VALIDATED = (DECISIONS.labels(d) for d in ("rejected", "no-queue", "validated"))
PRODUCER = "admission"

settings = Settings.from_env("admission")
runtime = ServiceRuntime(settings)
config = KueueConfig.load(os.environ.get("QM_CONFIG_DIR", "examples/seed"))
policy_dir = os.environ.get("QM_POLICY_DIR", "policies/library")
policies = PolicyStore()
first = policies.reload(policy_dir)
if not first.ok:
    raise SystemExit(f"admission: cannot load policies from {policy_dir}: {first.error}")
replica = LiveReplica(
    settings.kafka_bootstrap,
    {name: settings.topic(name) for name in ("qm.usage", "qm.budgets", "qm.cluster")},
    # The broker gathers for up to 100 ms before it answers (ADR 0046): eager, a fetch per handful
    # of pod facts cost admission and the broker ~9 CPU-s in kueue-large-scale. It may lag since
    # a namespace it has not read yet is waited for (ADR 0040).
    behind_by_ms=milliseconds_env("QM_ADMISSION_REPLICA_BEHIND_MS", 100, "admission",
                                  "fetch as soon as anything is there") or None,
)
# How long a submission in a namespace the replica does not know waits for the replica to read
# what came before it (the watcher publishes a namespace before its workloads).
NAMESPACE_WAIT_S = 10.0
replica.objects = config.objects  # `cluster` capacity of flavors whose nodes are not known


def decide(submitted: WorkloadSubmitted, cause: Envelope) -> list[Output]:
    """Pure apart from reading the replica: one submission -> its admission events."""
    def out(payload, key: str) -> Output:
        return Output("qm.workloads", key, make_envelope(payload, producer=PRODUCER, occurred_at=cause.occurred_at,
                                                         identity=(cause.event_id, "admission"), cause=cause))

    cluster_queue = config.cluster_queue_of(submitted.namespace, submitted.queue_name)
    key = config.routing_key(submitted.namespace, submitted.queue_name)
    obj = translate.kubernetes_object(submitted)
    namespace_object = replica.namespace(submitted.namespace)
    policy_set, usage = policies.current(), replica.usage(submitted.namespace)
    budget = replica.budget(cost_center_of(obj, namespace_object))

    def judge(o: dict, only: frozenset[int] | None = None) -> AdmissionDecision:
        return evaluate(policy_set, o, namespace_object, usage=usage, budget=budget,
                        cluster=replica.cluster,  # computed only if a policy reads it
                        enforcement_point=EnforcementPoint.BUS, only=only)

    decision = judge(obj)
    if not decision.allowed:
        REJECTED.inc()
        return [out(translate.rejected(submitted, decision.violations), key or submitted.namespace)]
    if cluster_queue is None or key is None:
        NOT_IN_A_QUEUE.inc()
        return [out(translate.not_in_a_queue(submitted), submitted.namespace)]
    # and where it would run: each flavor its queue could give it (ADR 0070)
    placements = placement.judge(judge, policy_set, obj, config.objects, cluster_queue, submitted.pod_sets)
    if placements.dead_ends:
        REJECTED.inc()
        return [out(translate.rejected(submitted, placement.dead_end_violations(placements, cluster_queue)), key)]
    VALIDATED.inc()
    cohort = config.objects.cluster_queues[cluster_queue].cohort
    return [out(translate.validated(submitted, cluster_queue, cohort, decision.warnings,
                                    config.objects.priority_classes, placements.refused_flavors()), key)]


# Submissions wait while the queue-manager is more than this many records behind on qm.workloads
# (ADR 0049): a burst judged faster than it can decide waits in its pending sets, ahead of the
# finishes that free quota, and it falls further behind. 0 never waits.
MAX_QUEUE_MANAGER_LAG = whole_number_env("QM_ADMISSION_MAX_QM_LAG", 300, "admission",
                                         "judge as fast as submissions come")
LAG_READ_EVERY_S = 0.25
QUEUE_MANAGER_GROUP = dataclasses.replace(settings, service="queue-manager").app_id
pace = Pace(MAX_QUEUE_MANAGER_LAG)
PACED = Gauge("qm_admission_paced", "1 while admission waits for the queue-manager to catch up (ADR 0049)")
PACED.set_function(lambda: int(pace.paused))
Gauge("qm_admission_queue_manager_lag_records",
      "Records of qm.workloads the queue-manager has not committed, as admission last read them "
      "(-1: not known)").set_function(lambda: -1 if pace.behind is None else pace.behind)


def _pace_changed(p: Pace) -> None:
    if p.paused:
        runtime.log.info("waiting for the queue-manager to catch up",
                         detail=f"{p.behind} records behind on qm.workloads (QM_ADMISSION_MAX_QM_LAG={p.max_behind})")
    else:
        runtime.log.info("queue-manager caught up; judging again",
                         detail=f"{'unknown' if p.behind is None else p.behind} records behind")


@runtime.app.task
async def pace_by_the_queue_manager() -> None:
    if MAX_QUEUE_MANAGER_LAG == 0:
        return
    lag = GroupLag(settings.kafka_bootstrap, QUEUE_MANAGER_GROUP, settings.topic("qm.workloads"))
    await lag.start()
    try:
        await follow_lag(lag.records_behind, pace, LAG_READ_EVERY_S, _pace_changed)
    finally:
        await lag.stop()


async def on_submitted(envelope: Envelope, event) -> None:
    await replica.caught_up.wait()  # never judge against an empty replica
    await pace.wait()  # nor add to a queue-manager that is behind (ADR 0049)
    if replica.namespace(envelope.payload.namespace) is None:
        # Its Namespace, published before it on another partition, may not have reached the
        # replica yet: without this wait a workload in a namespace created a moment before was
        # refused as "not known" (ADR 0040).
        message = event.message
        if not await replica.read_past(message.topic, message.partition, message.offset, NAMESPACE_WAIT_S):
            runtime.log.warning("live replica did not catch up; judging against what it has",
                                event_id=envelope.event_id, detail=f"namespace {envelope.payload.namespace}")
    await runtime.publish(decide(envelope.payload, envelope))


# Batched: a batch's decisions are sent together and their acknowledgements awaited once, at its
# end. One at a time, each submission waited for its decision's broker round trip and the agent
# spent ~75% of the baseline bench's submission burst waiting (p50 submitted -> validated 7 s).
# It reads only submissions (and dead-letters what nobody can read); the fact lane the rest.
runtime.bundled_topics = frozenset({"qm.workloads"})  # a batch's verdicts, one bundle per cohort (ADR 0034)
# Most of qm.cluster is pod facts this agent passes over: answered as soon as anything was there,
# it fetched them a handful at a time through faust's consumer thread, after the submissions had
# stopped too (ADR 0053). The broker gathers 16 KiB, or waits QM_FETCH_MAX_WAIT_MS, first.
runtime.agent_fetch_min_bytes = whole_number_env(
    "QM_ADMISSION_SUBMISSIONS_FETCH_MIN_BYTES", 16384, "admission",
    "as QM_FETCH_MIN_BYTES says, by default answered as soon as anything is there", unit="a number of bytes") or None
runtime.consume("qm.cluster", on_submitted, batched=True, reads=[WorkloadSubmitted])
FACT_LANE_GROUP = f"{settings.app_id}-facts"
async def send_facts(outputs: list[Output]) -> None:
    """The facts bound for the cohorts' streams as bundles (ADR 0034); the lane's stops of Jobs
    in no LocalQueue (ADR 0065) one record each, since the watcher reads no bundles."""
    stops = [o for o in outputs if o.topic == "qm.actions"]
    if stops:
        await runtime.publish(stops)
    if len(stops) < len(outputs):
        await runtime.publish_bundled([o for o in outputs if o.topic != "qm.actions"])


fact_lane = FactLane(
    settings.kafka_bootstrap, settings.topic("qm.cluster"), FACT_LANE_GROUP,
    route=lambda envelope: cohort_stream_outputs(envelope, config), send=send_facts,
    dead_letter=lambda record, error, kind: runtime.dead_letter_record(
        "qm.cluster", record, error, kind=kind, consumer=FACT_LANE_GROUP),
    takeover_group=os.environ.get("QM_FACT_LANE_TAKEOVER_GROUP") or None,
    fetch_max_wait_ms=FETCH_MAX_WAIT_MS, fetch_min_bytes=FETCH_MIN_BYTES,  # as the faust agents' (ADR 0018)
)


runtime.ready_checks["factLaneJoined"] = fact_lane.joined.is_set


@runtime.app.task
async def forward_facts() -> None:
    await run_forever(fact_lane)


@runtime.app.task
async def follow_live_state() -> None:
    await replica.run()


@runtime.app.page("/live-state")
async def live_state(web, request):
    """What the policies see for a namespace right now: its object, live usage and budget.
    On call: "why was this refused?" starts here."""
    namespace = request.query.get("namespace")
    if not namespace:
        return web.json({"code": 400, "message": "name the namespace: /live-state?namespace=<name>"}, status=400)
    namespace_object = replica.namespace(namespace)
    return web.json({
        "caughtUp": replica.ready(),
        # the facts' own consumer (ADR 0026): not joined, or unroutable rising, is worth a look
        "factLane": {"joined": fact_lane.joined.is_set(), "recordsForwarded": fact_lane.forwarded,
                     "unroutable": fact_lane.unroutable, "jobsStopped": fact_lane.stopped},
        # paused: submissions wait for the queue-manager to catch up (ADR 0049)
        "pace": {"paused": pace.paused, "queueManagerRecordsBehind": pace.behind, "max": pace.max_behind,
                 "pauses": pace.pauses},
        "namespace": namespace_object,
        "usage": replica.usage(namespace),
        "budget": replica.budget(cost_center_of({}, namespace_object)) if namespace_object else None,
    })


def apply_config(payload) -> None:
    """A new active set from qm.config: policies and queues switch together, or not at all."""
    global config
    if not isinstance(payload, ConfigSnapshot):
        return
    docs = config_set.documents(payload)
    try:
        objects, policy_set = config_set.validate(docs)
    except (ConfigError, PolicyError) as error:
        runtime.log.error("config refused; the previous set stays active", error=str(error), detail=payload.digest)
        return
    if objects.cluster_queues:
        config = KueueConfig.from_objects(objects)
        replica.objects = objects
    policies.replace(policy_set)
    runtime.log.info("config applied", detail=f"version {payload.version} {payload.digest}")


@runtime.app.task
async def follow_config() -> None:
    await follow(settings.kafka_bootstrap, [settings.topic("qm.config")], apply_config)


@runtime.app.task
async def serve_webhook() -> None:
    port = os.environ.get("QM_WEBHOOK_PORT")
    if not port:
        return
    from services.admission.webhook import make_app, serve

    await serve(make_app(policies.current, replica, queues=lambda: config.objects), settings.web_host, int(port),
                os.environ.get("QM_WEBHOOK_CERT"), os.environ.get("QM_WEBHOOK_KEY"))


def _reload(*_: object) -> None:
    result = policies.reload(policy_dir)
    if result.ok:
        runtime.log.info("policies reloaded", detail=result.version)
    else:
        runtime.log.error("policy reload refused; the previous set stays active", error=str(result.error))


signal.signal(signal.SIGHUP, _reload)
