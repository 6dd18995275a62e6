"""The preemption service: who gives way when a workload cannot get quota.

Wiring only; the decisions are in fold.apply (Kueue's preemption in the quota core, over
allowed candidates only, filtered by the PreemptionPolicy in services/core/preemption_policy).
    qm.preemption (keyed by cohort) PreemptionNeeded -> VictimsSelected (same topic, and the cohort's
                                    stream on qm.workloads: ADR 0025) + Evict (qm.actions)
One batched agent, the only writer of the victim-history table (keyed by cohort). The request
carries each possible victim's reservation and start (ADR 0020), so the service does not read
the lifecycle on qm.workloads: that was three quarters of its CPU (ADR 0021).
"""

from __future__ import annotations

import os

from prometheus_client import Counter

from services.adapters.kueue_config import KueueConfig
from services.adapters.runtime import ServiceRuntime
from services.adapters.settings import Settings
from services.contracts.codec import Envelope
from services.contracts.events import PreemptionNeeded
from services.contracts.schemas import topic_specs
from services.preemption import fold
from services.preemption.config import load_policy

PREEMPTIONS = Counter("kueue_preempted_workloads_total", "Workloads chosen as preemption victims", ["reason"])
BLOCKED = Counter("qm_preemption_blocked_total", "Preemption requests with no allowed victim set", [])

settings = Settings.from_env("preemption")
runtime = ServiceRuntime(settings)
config_dir = os.environ.get("QM_CONFIG_DIR", "examples/seed")
context = fold.Context(objects=KueueConfig.load(config_dir).objects, policy=load_policy(config_dir))
history = runtime.table("victim_history", partitions=topic_specs()["qm.preemption"].partitions,
                        help="preemption history per cohort")


async def _apply(key: str, envelope: Envelope) -> list:
    """The fold; returns the outputs published (empty for a duplicate)."""
    published: list = []

    def run(state, env):
        state, outputs = fold.apply(state, env, context)
        published.extend(outputs)
        return state, outputs

    applied = await runtime.apply_once(history, key, envelope, run)
    return published if applied else []


async def on_event(envelope: Envelope, event) -> None:
    payload = envelope.payload
    if not isinstance(payload, PreemptionNeeded):
        return  # our own answers
    key = event.key.decode() if event.key else payload.cohort
    outputs = await _apply(key, envelope)
    answers = [o.envelope.payload for o in outputs if o.topic == "qm.preemption"]
    if not answers:
        return
    answer = answers[0]
    for victim in answer.victims:
        PREEMPTIONS.labels(victim["reason"]).inc()
    if answer.blocked_message:
        BLOCKED.inc()
    runtime.log.info(
        "preemption decided", event_id=envelope.event_id, workload_uid=answer.preemptor_uid, cohort=key,
        decision="blocked" if answer.blocked_message else "victims", count=len(answer.victims),
        reason=answer.blocked_message or "",
    )


runtime.consume("qm.preemption", on_event, agent_name="fold_history", batched=True, reads=[PreemptionNeeded])


@runtime.app.page("/history")
async def history_view(web, request):
    view = {}
    for key, entry in history.items():
        state = entry["state"] or {}
        view[key] = {
            "preempted": {uid: len(e["preempted"]) for uid, e in state.get("workloads", {}).items() if e["preempted"]},
            "namespaces": {ns: len(rs) for ns, rs in state.get("namespaces", {}).items()},
        }
    return web.json(view)
