"""The preemption service's fold: victim history per cohort, and the answer to PreemptionNeeded.

`apply(state, envelope, ctx) -> (state, outputs)` is pure. The state is a plain JSON-able
dict kept in a faust table keyed by cohort key (qm.preemption is keyed by cohort):

    workloads   uid -> {namespace, preempted: [[at, preemptor_uid, preemptor_key]]}
    namespaces  namespace -> [[at, victim_uid, preemptor_uid]]   (for the hourly budget)
    now         the latest event time seen (epoch seconds)

History older than the policy's longest window (at least an hour) is forgotten. Everything
else the decision needs comes with the request: each possible victim's priority, labels,
reservation and start (ADR 0020, 0021).

A PreemptionNeeded is answered with one `preemption.victims_selected.v1` (victims, or a
blocked message naming the policy that protects the workload Kueue would have preempted),
written to qm.preemption and to the cohort's stream on qm.workloads (ADR 0025), and one
`action.evict.v1` per victim on qm.actions, with the victim's grace period.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.adapters.runtime import Output
from services.contracts.codec import Envelope, epoch_of, make_envelope, utc_iso
from services.contracts.events import ActionEvict, PreemptionNeeded, PreemptionVictimsSelected
from services.core.preemption_policy import (
    DEFAULT_POLICY,
    Allowed,
    Candidate,
    History,
    PreemptionPolicy,
    filter_victims,
    over_budget,
)
from services.core.quota import (
    AdmittedWorkload,
    Objects,
    PodSet,
    build_snapshot,
    objects_behind,
    preemption_targets,
)
from services.core.quota import Workload as CoreWorkload
from services.core.quota.flavors import AssignmentMode, node_affinity_of, tolerations_of

PRODUCER = "preemption"
#: Where an answer goes: the requests' topic (the trail) and the cohort's stream, which the
#: queue-manager folds. Both keyed by cohort; one event, one id, on both (ADR 0025).
ANSWER_TOPICS = ("qm.preemption", "qm.workloads")
FORGET_EVERY_S = 60.0  # event time between walks that drop history past the horizon


@dataclass(frozen=True)
class Context:
    """The active Kueue objects and PreemptionPolicy."""

    objects: Objects
    policy: PreemptionPolicy = field(default=DEFAULT_POLICY)


@dataclass(frozen=True)
class Answer:
    """The decision for one PreemptionNeeded: the victims chosen (with why) or why none."""

    victims: tuple[tuple[Allowed, str], ...]  # (policy allowance, Kueue reason)
    blocked_message: str | None


def empty_state() -> dict[str, Any]:
    return {"workloads": {}, "namespaces": {}, "now": 0.0}


def epoch(text: str | None) -> float | None:
    return None if not text else epoch_of(text)


def iso(seconds: float) -> str:
    return utc_iso(datetime.fromtimestamp(seconds, UTC))


# --------------------------------------------------------------------------- the fold


def apply(state: dict | None, envelope: Envelope, ctx: Context) -> tuple[dict, list[Output]]:
    state = state if state is not None else empty_state()
    payload = envelope.payload
    state["now"] = max(state["now"], epoch(envelope.occurred_at) or 0.0)
    if not isinstance(payload, PreemptionNeeded):
        return state, []  # our own answers, read back from the same topic
    now = epoch((payload.snapshot or {}).get("now")) or epoch(envelope.occurred_at) or state["now"]
    state["now"] = max(state["now"], now)
    _forget_old(state, now, ctx.policy)
    answer = decide(payload, state, now, ctx)
    _record(state, payload, answer, now)
    return state, _outputs(envelope, payload, answer, now)


def _entry(workloads: dict, uid: str, namespace: str) -> dict:
    return workloads.setdefault(uid, {"namespace": namespace, "preempted": []})


def _forget_old(state: dict, now: float, policy: PreemptionPolicy) -> None:
    """Drop history past the policy's horizon. The policy counts only records inside its
    windows, so this is housekeeping: done once per FORGET_EVERY_S of event time, not per
    event (it walks every workload of the cohort; 11% of the service in kueue-baseline)."""
    if now - state.get("forgot_at", float("-inf")) < FORGET_EVERY_S:
        return
    state["forgot_at"] = now
    horizon = now - policy.history_horizon_s
    for uid in list(state["workloads"]):
        entry = state["workloads"][uid]
        entry["preempted"] = [r for r in entry["preempted"] if r[0] > horizon]
        if not entry["preempted"]:
            del state["workloads"][uid]
    for ns in list(state["namespaces"]):
        kept = [r for r in state["namespaces"][ns] if r[0] > horizon]
        if kept:
            state["namespaces"][ns] = kept
        else:
            del state["namespaces"][ns]


def _record(state: dict, payload: PreemptionNeeded, answer: Answer, now: float) -> None:
    """Count each victim once per preemptor (a re-sent request does not count twice)."""
    preemptor = payload.preemptor
    by = preemptor["uid"]
    key = f"{preemptor['namespace']}/{preemptor['name']}"
    for allowed, _ in answer.victims:
        victim = allowed.candidate
        entry = _entry(state["workloads"], victim.uid, victim.namespace)
        if any(r[1] == by for r in entry["preempted"]):
            continue
        entry["preempted"].append([now, by, key])
        state["namespaces"].setdefault(victim.namespace, []).append([now, victim.uid, by])


# --------------------------------------------------------------------------- the decision


def history_of(state: dict, uids: Iterable[str]) -> History:
    """The preemption history the policy reads: of the given workloads, and per namespace."""
    workloads = state["workloads"]
    return History(
        preemptions={uid: tuple(r[0] for r in workloads[uid]["preempted"]) for uid in uids if uid in workloads},
        namespace_preemptions={ns: tuple(r[0] for r in rs) for ns, rs in state["namespaces"].items()},
    )


def _started_at(admitted: dict) -> float | None:
    """When the workload last started: running since, else holding quota since (an idle
    reservation younger than the minimum runtime is protected too, ADR 0006)."""
    running = epoch(admitted.get("running_at"))
    return running if running is not None else epoch(admitted.get("reserved_at"))


def _usage(usage: dict) -> tuple[tuple[tuple[str, str], int], ...]:
    return tuple(sorted(((flavor, res), int(v)) for flavor, by_res in usage.items() for res, v in by_res.items()))


def _queue_name(objects: Objects, preemptor: dict) -> str | None:
    if preemptor.get("queue_name"):
        return preemptor["queue_name"]
    for (ns, name), lq in sorted(objects.local_queues.items()):
        if ns == preemptor["namespace"] and lq.cluster_queue == preemptor["cluster_queue"]:
            return name
    return None


def decide(payload: PreemptionNeeded, state: dict, now: float, ctx: Context) -> Answer:
    """Kueue's minimal victim set among the candidates the PreemptionPolicy allows."""
    p = payload.preemptor
    admitted_docs = [a for a in (payload.snapshot or {}).get("admitted", []) if a.get("uid") != p["uid"]]
    # The request's cohort tree only: building all of the cluster's was a fifth of the service
    # in kueue-large-scale (1,000 ClusterQueues, 100 per cohort).
    objects = objects_behind(ctx.objects, payload.cohort) if payload.cohort else ctx.objects
    known_cqs = objects.cluster_queues
    admitted = [
        AdmittedWorkload(
            key=f"{a['namespace']}/{a['name']}",
            cluster_queue=a["cluster_queue"],
            priority=int(a.get("priority") or 0),
            usage=_usage(a.get("usage") or {}),
            quota_reserved_at=epoch(a.get("reserved_at")),
            created_at=epoch(a.get("created_at")) or 0.0,
            uid=a["uid"],
        )
        for a in admitted_docs
        if a.get("cluster_queue") in known_cqs
    ]
    candidates = [
        Candidate(
            uid=a["uid"], namespace=a["namespace"], name=a["name"], priority=int(a.get("priority") or 0),
            labels=a.get("labels") or {}, started_at=_started_at(a),
            cluster_queue=a["cluster_queue"],
        )
        for a in admitted_docs
    ]
    preemptor = Candidate(uid=p["uid"], namespace=p["namespace"], name=p["name"], priority=int(p["priority"]),
                          labels=p.get("labels") or {}, cluster_queue=p["cluster_queue"])
    history = history_of(state, [c.uid for c in candidates])
    allowed, blocked = filter_victims(candidates, preemptor, history, now, policy=ctx.policy)
    allowed_by_uid = {a.candidate.uid: a for a in allowed}
    blocked_by_uid = {b.candidate.uid: b for b in blocked}
    by_key = {c.key: c for c in candidates}

    # The request lists only the workloads that could be victims; the others' usage comes summed
    # per ClusterQueue (a request from before that lists every admitted workload has none).
    others_usage = {
        cq: _usage(usage) for cq, usage in ((payload.snapshot or {}).get("others_usage") or {}).items()
        if cq in known_cqs
    }
    snapshot = build_snapshot(objects, admitted, others_usage)
    workload = CoreWorkload(
        namespace=p["namespace"],
        name=p["name"],
        queue_name=_queue_name(objects, p),
        pod_sets=tuple(
            PodSet(name=ps["name"], count=int(ps["count"]), requests=tuple(sorted(ps["requests"].items())),
                   min_count=ps.get("min_count"), node_selector=tuple(sorted((ps.get("node_selector") or {}).items())),
                   refused_flavors=tuple(sorted((ps.get("refused_flavors") or {}).items())),
                   node_affinity=node_affinity_of(ps.get("node_affinity")),
                   tolerations=tolerations_of(ps.get("tolerations")))
            for ps in p.get("pod_sets") or []
        ),
        priority=int(p["priority"]),
        created_at=epoch(p.get("created_at")) or 0.0,
        uid=p["uid"],
    )
    plan = preemption_targets(snapshot, workload, now, may_preempt=lambda wl: wl.uid in allowed_by_uid)
    if plan.targets:
        victims = tuple((allowed_by_uid[by_key[t.workload].uid], str(t.reason)) for t in plan.targets)
        too_many = over_budget([v.candidate for v, _ in victims], history, now, policy=ctx.policy)
        if too_many is not None:
            return Answer((), too_many)
        return Answer(victims, None)
    if plan.mode is AssignmentMode.FIT:
        return Answer((), None)  # it fits already (quota was freed since the request): nobody gives way
    # No allowed set: ask Kueue alone whom it would have preempted, and name the policy in the way.
    unfiltered = preemption_targets(snapshot, workload, now)
    for target in unfiltered.targets:
        cand = by_key.get(target.workload)
        if cand is not None and cand.uid in blocked_by_uid:
            return Answer((), blocked_by_uid[cand.uid].message)
    if blocked:
        return Answer((), blocked[0].message)
    return Answer((), f"no workload can be preempted: {plan.message}" if plan.message else "no workload can be preempted")


def _outputs(cause: Envelope, payload: PreemptionNeeded, answer: Answer, now: float) -> list[Output]:
    p = payload.preemptor
    preemptor_key = f"{p['namespace']}/{p['name']}"
    at = iso(now)
    victims = [
        {
            "uid": a.candidate.uid,
            "namespace": a.candidate.namespace,
            "name": a.candidate.name,
            "cluster_queue": a.candidate.cluster_queue,
            "reason": reason,
            "policy": a.rule,
            "grace_period_s": a.grace_period_s,
        }
        for a, reason in answer.victims
    ]
    answer_envelope = make_envelope(
        PreemptionVictimsSelected(
            preemptor_uid=p["uid"], cohort=payload.cohort, victims=victims, blocked_message=answer.blocked_message,
        ),
        producer=PRODUCER, occurred_at=at, identity=(cause.event_id,), cause=cause,
    )
    # The same answer (same event id) on the request's topic, for the trail, and on the
    # cohort's own stream, where the queue-manager folds it (ADR 0025).
    outputs = [Output(topic, payload.cohort, answer_envelope) for topic in ANSWER_TOPICS]
    for a, reason in answer.victims:
        v = a.candidate
        outputs.append(
            Output(
                "qm.actions",
                v.uid,
                make_envelope(
                    ActionEvict(
                        workload_uid=v.uid, namespace=v.namespace, name=v.name, kind="Job",
                        reason=f"Preempted by {preemptor_key} ({reason}, policy {a.rule})",
                        grace_period_s=a.grace_period_s,
                    ),
                    producer=PRODUCER, occurred_at=at, identity=(cause.event_id, v.uid), cause=cause,
                ),
            )
        )
    return outputs
