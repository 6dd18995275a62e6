"""The queue-manager's fold: one cohort's queues and reservations, advanced by events.

`apply(state, envelope, ctx) -> (state, outputs)` is pure: the quota decisions come from the
core's drain over an immutable snapshot, time comes from the events. The state is a plain
JSON-able dict so it can live in a faust table:

    pending   uid -> workload (as submitted) + eligible_at (backoff) + attempts
    admitted  uid -> workload + cluster_queue, flavors, counts, usage, reserved_at, running_at
    said      uid -> the last Pending reason|message published (no event storms)
    expiries  uid -> how many times its reservation expired before running
    now       the latest event time seen (epoch seconds)
    limits    "cq|flavor|resource" -> the borrowingLimit a QuotaRule set (milli, None: no
              limit); absent: the configured one. Set only by cluster.signals.v1 events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from services.adapters.runtime import Output
from services.contracts.codec import Envelope, make_envelope, parse_utc, utc_iso
from services.contracts.events import (
    ActionAdmit,
    ActionCleanup,
    ClockTick,
    ClusterSignals,
    NodeCapacity,
    PodFinished,
    PodRunning,
    PreemptionNeeded,
    PreemptionVictimsSelected,
    QuotaLimitsChanged,
    UsageSnapshot,
    WorkloadDeactivated,
    WorkloadEvicted,
    WorkloadFinished,
    WorkloadPending,
    WorkloadPrefreezeExpired,
    WorkloadQuotaReserved,
    WorkloadReleased,
    WorkloadRequeued,
    WorkloadRunning,
    WorkloadValidated,
)
from services.core.quota import (
    AdmittedWorkload,
    Objects,
    PodSet,
    WorkloadStatus,
    build_snapshot,
    drain,
)
from services.core.quota import Workload as CoreWorkload
from services.core.quota.dynamic import with_borrowing_limits
from services.core.quota.model import QueueingStrategy
from services.policy import quota_rules

PRODUCER = "queue-manager"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class Context:
    """What the fold needs besides state and event: the active config and the timeouts."""

    objects: Objects
    pods_ready_timeout_s: float = 300.0  # Kueue's waitForPodsReady default is 5 minutes
    backoff_base_s: float = 60.0  # Kueue's requeuingStrategy defaults
    backoff_max_s: float = 3600.0
    max_expiries: int = 3  # then the workload is deactivated
    zombie_ttl_s: float = 600.0
    # pods all gone without a finish: released and cleaned up after zombie_ttl_s
    cache_key: str | None = None  # the table key (the cohort): the shell keeps this cohort's quota tree by it
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)  # flavor -> node labels
    quota_rules: tuple[quota_rules.QuotaRule, ...] = ()  # dynamic borrowingLimits (QuotaRule objects)


def empty_state() -> dict[str, Any]:
    return {"pending": {}, "admitted": {}, "said": {}, "expiries": {}, "now": 0.0}


def epoch(text: str) -> float:
    return parse_utc(text).timestamp()


def iso(seconds: float) -> str:
    from datetime import UTC, datetime

    return utc_iso(datetime.fromtimestamp(seconds, UTC))


def apply(state: dict | None, envelope: Envelope, ctx: Context) -> tuple[dict, list[Output]]:
    state = state if state is not None else empty_state()
    payload = envelope.payload
    configured = ctx.objects
    if state.get("limits"):  # decide with the borrowingLimits the QuotaRules chose
        ctx = dataclasses.replace(ctx, objects=_effective_objects(configured, state["limits"]))
    previous_now = state["now"]
    state["now"] = max(state["now"], epoch(envelope.occurred_at))
    only: list[str] | None = None  # None: every pending workload of the cohort may now fit
    outputs: list[Output] = []
    emit = _Emitter(envelope, outputs, state["now"])

    if isinstance(payload, WorkloadValidated):
        if payload.uid in state["admitted"] or payload.uid in state["pending"]:
            return state, outputs  # re-validated after a resubmission: already known
        state["pending"][payload.uid] = {
            "uid": payload.uid,
            "namespace": payload.namespace,
            "name": payload.name,
            "queue_name": payload.queue_name,
            "cluster_queue": payload.cluster_queue,
            "cohort": payload.cohort,
            "priority": payload.priority,
            "priority_class": payload.priority_class,
            "pod_sets": payload.pod_sets,
            "labels": payload.labels or {},
            "created_at": payload.created_at,
            "eligible_at": 0.0,
            "attempts": 0,
        }
        # An arrival frees no quota, so under BestEffortFIFO only the newcomer can newly fit;
        # under StrictFIFO it may have to queue behind its ClusterQueue's head.
        spec = ctx.objects.cluster_queues.get(payload.cluster_queue)
        if spec is not None and spec.queueing_strategy == QueueingStrategy.STRICT_FIFO:
            only = [u for u, w in state["pending"].items() if w["cluster_queue"] == payload.cluster_queue]
        else:
            only = [payload.uid]
    elif isinstance(payload, NodeCapacity):
        nodes = state.setdefault("nodes", {})
        if payload.deleted or payload.unschedulable or not payload.flavor:
            nodes.pop(payload.node, None)
        else:
            nodes[payload.node] = {"flavor": payload.flavor, "gpu": (payload.allocatable or {}).get(GPU, 0)}
    elif isinstance(payload, PodRunning | PodFinished):
        _track_pod(state, payload)
        return state, outputs
    elif isinstance(payload, WorkloadRunning):
        entry = state["admitted"].get(payload.uid)
        if entry is None or entry["running_at"] is not None:
            return state, outputs
        entry["running_at"] = epoch(payload.started_at)
        emit.usage(state, {entry["namespace"]})
        return state, outputs
    elif isinstance(payload, WorkloadFinished):
        entry = state["admitted"].pop(payload.uid, None)
        state["pending"].pop(payload.uid, None)
        state["said"].pop(payload.uid, None)
        state.get("blocked", {}).pop(payload.uid, None)
        state["expiries"].pop(payload.uid, None)
        if entry is None:
            return state, outputs
        emit.released(entry, "Finished", epoch(payload.finished_at))
        emit.usage(state, {entry["namespace"]})
    elif isinstance(payload, ClockTick):
        expired = _expire_idle_reservations(state, ctx, emit)
        expired = _clean_up_zombies(state, ctx, emit) or expired
        woke = any(previous_now < w["eligible_at"] <= state["now"] for w in state["pending"].values())
        if not expired and not woke:
            return state, outputs  # time passed, nothing that decides changed
    elif isinstance(payload, PreemptionVictimsSelected):
        if not _apply_preemption(state, payload, ctx, emit):
            return state, outputs
    elif isinstance(payload, ClusterSignals):
        if not _apply_quota_rules(state, payload, configured, ctx, emit):
            return state, outputs  # no limit rose: nothing waiting can newly fit
        ctx = dataclasses.replace(ctx, objects=_effective_objects(configured, state.get("limits") or {}))
    else:
        return state, outputs  # our own outputs and other services' events on qm.workloads

    _drain(state, ctx, emit, only=only)
    return state, outputs


def _limit_key(key: tuple[str, str, str]) -> str:
    return "|".join(key)


_EFFECTIVE_MEMO: dict[tuple[int, tuple], tuple[Objects, Objects]] = {}


def _effective_objects(configured: Objects, limits: dict[str, int | None]) -> Objects:
    """The config with the rules' borrowingLimits in place; the same object for the same
    inputs, so the cohort's cached quota tree survives events that change no limit."""
    if not limits:
        return configured
    memo_key = (id(configured), tuple(sorted(limits.items(), key=lambda kv: kv[0])))
    memo = _EFFECTIVE_MEMO.get(memo_key)
    if memo is not None and memo[0] is configured:
        return memo[1]
    if len(_EFFECTIVE_MEMO) > 1024:
        _EFFECTIVE_MEMO.clear()
    effective = with_borrowing_limits(configured, {tuple(k.split("|", 2)): v for k, v in limits.items()})
    _EFFECTIVE_MEMO[memo_key] = (configured, effective)
    return effective


def _apply_quota_rules(state: dict, signals: ClusterSignals, configured: Objects, ctx: Context,
                       emit: _Emitter) -> bool:
    """Dynamic quota: evaluate this cohort's QuotaRules over the signals; a changed effective
    borrowingLimit is said (quota.limits_changed.v1) and used from this event on. Returns True
    when some limit rose, so waiting workloads may now fit. A lowered limit evicts nobody
    (as in Kueue: borrowed quota is given back as workloads finish)."""
    state["signals"] = signals.signals
    cohort_queues = None  # without a table key (a fold over one cohort's events): every rule
    if ctx.cache_key:
        subset = _cohort_objects(configured, ctx.cache_key)
        cohort_queues = set(subset.cluster_queues) if subset is not configured else set()
    rules = [r for r in ctx.quota_rules if cohort_queues is None or r.cluster_queue in cohort_queues]
    limits = state.setdefault("limits", {})
    rose = False
    changed_queues: set[str] = set()
    for key, outcome in sorted(quota_rules.evaluate(rules, signals.signals, configured).items()):
        stored = _limit_key(key)
        previous = limits.get(stored, outcome.static)
        if outcome.rule is None:
            limits.pop(stored, None)
        else:
            limits[stored] = outcome.effective
        if previous == outcome.effective:
            continue
        rose = rose or outcome.effective is None or (previous is not None and outcome.effective > previous)
        cq, flavor, resource = key
        changed_queues.add(cq)
        emit.add("qm.workloads", ctx.cache_key or cq, QuotaLimitsChanged(
            cluster_queue=cq, flavor=flavor, resource=resource, static_borrowing_limit=outcome.static,
            previous_borrowing_limit=previous, effective_borrowing_limit=outcome.effective, rule=outcome.rule,
            signals=signals.signals, changed_at=iso(state["now"]), errors=list(outcome.errors) or None,
            message=_limit_message(key, previous, outcome, signals.signals)),
            identity=(stored, signals.at, previous, outcome.effective))
    if not limits:
        state.pop("limits", None)
    holders = {e["namespace"] for e in state["admitted"].values() if e["cluster_queue"] in changed_queues}
    if holders:
        emit.usage(state, holders)
    return rose


def _limit_message(key: tuple[str, str, str], previous: int | None, outcome: quota_rules.Outcome,
                   signals: dict) -> str:
    cq, flavor, resource = key

    def amount(milli: int | None) -> str:
        return "no limit" if milli is None else f"{milli / 1000:g}"

    why = outcome.rule or "no rule is true, the configured borrowingLimit applies"
    return (f"{cq} may borrow up to {amount(outcome.effective)} {resource} of {flavor} (was {amount(previous)}): "
            f"{why} (cluster GPU utilization {signals.get('gpuUtilization', 0):.0%})")


def _expire_idle_reservations(state: dict, ctx: Context, emit: _Emitter) -> bool:
    """Pre-freeze timeout: a reservation not running within podsReadyTimeout is released and
    requeued with exponential backoff; after max_expiries the workload is deactivated."""
    now = state["now"]
    touched = set()
    for uid, entry in sorted(state["admitted"].items()):
        if entry["running_at"] is not None or now - entry["reserved_at"] < ctx.pods_ready_timeout_s:
            continue
        del state["admitted"][uid]
        touched.add(entry["namespace"])
        expiries = state["expiries"].get(uid, 0) + 1
        state["expiries"][uid] = expiries
        expired_at = entry["reserved_at"] + ctx.pods_ready_timeout_s
        emit.add(
            "qm.workloads",
            entry["cohort_key"],
            WorkloadPrefreezeExpired(
                uid=uid,
                namespace=entry["namespace"],
                name=entry["name"],
                cluster_queue=entry["cluster_queue"],
                reserved_at=iso(entry["reserved_at"]),
                expired_at=iso(expired_at),
                idle_s=expired_at - entry["reserved_at"],
                usage=entry["usage"],
                expiries=expiries,
            ),
            identity=(uid, entry["reserved_at"], "expired"),
        )
        emit.released(entry, "PodsReadyTimeout", expired_at)
        if expiries >= ctx.max_expiries:
            emit.add(
                "qm.workloads",
                entry["cohort_key"],
                WorkloadDeactivated(
                    uid=uid,
                    namespace=entry["namespace"],
                    name=entry["name"],
                    cluster_queue=entry["cluster_queue"],
                    reason="PreFreezeExpiredTooOften",
                    message=(
                        f"quota was reserved {expiries} times but the pods never became ready within "
                        f"{ctx.pods_ready_timeout_s:.0f}s; fix the pods (image, node selector, resources) "
                        "and resubmit"
                    ),
                ),
                identity=(uid, "deactivated"),
            )
            continue
        _requeue(state, ctx, emit, entry, "PodsReadyTimeout", attempt=expiries, at=expired_at)
    if touched:
        emit.usage(state, touched)
    return bool(touched)


def _requeue(state: dict, ctx: Context, emit: _Emitter, entry: dict, reason: str, *, attempt: int,
             at: float) -> None:
    """Back to the queue with Kueue's exponential backoff (base, doubled per attempt, capped)."""
    workload = entry["workload"]
    backoff = min(ctx.backoff_base_s * 2 ** (attempt - 1), ctx.backoff_max_s)
    workload["eligible_at"] = at + backoff
    workload["attempts"] = attempt
    state["pending"][entry["uid"]] = workload
    emit.add("qm.workloads", entry["cohort_key"], WorkloadRequeued(
        uid=entry["uid"], namespace=entry["namespace"], name=entry["name"], cluster_queue=entry["cluster_queue"],
        reason=reason, requeue_at=iso(workload["eligible_at"]), backoff_s=int(backoff), attempt=attempt),
        identity=(entry["uid"], entry["reserved_at"], "requeued"))


def _track_pod(state: dict, pod: PodRunning | PodFinished) -> None:
    """Which pods of an admitted workload run; when the last one vanishes without the
    workload finishing, the clock starts for zombie cleanup."""
    entry = state["admitted"].get(pod.workload_uid)
    if entry is None:
        return
    pods = entry.setdefault("pods", {})
    if isinstance(pod, PodRunning):
        pods[pod.uid] = pod.node
        entry["pods_gone_at"] = None
    else:
        pods.pop(pod.uid, None)
        if not pods and entry["running_at"] is not None:
            entry["pods_gone_at"] = epoch(pod.finished_at)


def _clean_up_zombies(state: dict, ctx: Context, emit: _Emitter) -> bool:
    """A workload whose pods vanished without a finish still holds quota: after the TTL it is
    released and the watcher is told to delete it."""
    now = state["now"]
    touched = set()
    for uid, entry in sorted(state["admitted"].items()):
        gone = entry.get("pods_gone_at")
        if gone is None or now - gone < ctx.zombie_ttl_s:
            continue
        del state["admitted"][uid]
        touched.add(entry["namespace"])
        emit.released(entry, "ZombieTTLExpired", gone + ctx.zombie_ttl_s)
        emit.add("qm.actions", uid, ActionCleanup(
            workload_uid=uid, namespace=entry["namespace"], name=entry["name"], kind="Job",
            reason=f"pods gone since {iso(gone)} without the workload finishing; quota released after "
                   f"{ctx.zombie_ttl_s:.0f}s"), identity=(uid, entry["reserved_at"], "cleanup"))
    if touched:
        emit.usage(state, touched)
    return bool(touched)


def _apply_preemption(state: dict, answer: PreemptionVictimsSelected, ctx: Context, emit: _Emitter) -> bool:
    """The preemption service chose victims (or found none allowed). Victims give their quota
    back and requeue with backoff; the preemptor is admitted first in this same step, so the
    freed quota is held for it and no third workload can take it. Returns False if moot."""
    preemptor = state["pending"].get(answer.preemptor_uid)
    if preemptor is None:
        return False  # admitted or gone meanwhile: evicting anyone now would be waste
    if answer.blocked_message:
        blocked = state.setdefault("blocked", {})
        if blocked.get(preemptor["uid"]) != answer.blocked_message:
            blocked[preemptor["uid"]] = answer.blocked_message
            emit.add(
                "qm.workloads",
                preemptor.get("cohort_key") or answer.cohort,
                WorkloadPending(uid=preemptor["uid"], namespace=preemptor["namespace"], name=preemptor["name"],
                                cluster_queue=preemptor["cluster_queue"], reason="PreemptionBlocked",
                                message=answer.blocked_message),
                identity=(preemptor["uid"], answer.blocked_message),
            )
        return False
    now = state["now"]
    touched = set()
    for victim in answer.victims:
        entry = state["admitted"].pop(victim["uid"], None)
        if entry is None:
            continue
        touched.add(entry["namespace"])
        preemptor_name = f"{preemptor['namespace']}/{preemptor['name']}"
        emit.add("qm.workloads", entry["cohort_key"], WorkloadEvicted(
            uid=entry["uid"], namespace=entry["namespace"], name=entry["name"], cluster_queue=entry["cluster_queue"],
            reason=victim["reason"], preemptor=preemptor_name, grace_period_s=victim.get("grace_period_s", 0),
            evicted_at=iso(now)), identity=(entry["uid"], entry["reserved_at"], "evicted"))
        emit.released(entry, "Preempted", now)
        state["said"].pop(entry["uid"], None)
        _requeue(state, ctx, emit, entry, "Preempted", attempt=entry["workload"].get("attempts", 0) + 1, at=now)
    if touched:
        emit.usage(state, touched)
    _drain(state, ctx, emit, only=[preemptor["uid"]])  # nominated: the freed quota is the preemptor's
    return True


def _core_workload(w: dict) -> CoreWorkload:
    return CoreWorkload(
        namespace=w["namespace"],
        name=w["name"],
        queue_name=w["queue_name"],
        pod_sets=tuple(
            PodSet(
                name=ps["name"],
                count=ps["count"],
                requests=tuple(sorted(ps["requests"].items())),
                min_count=ps.get("min_count"),
            )
            for ps in w["pod_sets"]
        ),
        priority=w["priority"],
        priority_class=w.get("priority_class"),
        created_at=epoch(w["created_at"]),
        uid=w["uid"],
    )


# Memo tables of pure functions (same input, same output), so a deep cohort does not pay for
# converting every admitted workload and rebuilding its quota tree on every event. The core's
# drain copies the snapshot it is given, so sharing one is safe.
_ADMITTED_MEMO: dict[int, tuple[tuple, AdmittedWorkload]] = {}
_COHORT_OBJECTS: dict[tuple[int, str], Objects] = {}
_SNAPSHOT_MEMO: dict[tuple, Any] = {}


def _snapshot_for(ctx: Context, state: dict) -> Any:
    """The cohort's quota tree with its admitted usage. With a cache key (the shell passes the
    table key) the last tree is kept and brought up to date by adding and removing only what
    changed since, instead of being rebuilt from every admitted workload on every event."""
    admitted = {id(a): a for a in map(_admitted_for_snapshot, state["admitted"].values())}
    cached = _SNAPSHOT_MEMO.get(ctx.cache_key) if ctx.cache_key is not None else None
    if cached is None or cached[0] is not ctx.objects:
        objects = _cohort_objects(ctx.objects, ctx.cache_key) if ctx.cache_key is not None else ctx.objects
        snapshot = build_snapshot(objects, list(admitted.values()))
    else:
        _, held, snapshot = cached
        for gone in held.keys() - admitted.keys():
            snapshot.remove_workload(held[gone].key)
        for new in admitted.keys() - held.keys():
            snapshot.add_workload(admitted[new])
    if ctx.cache_key is not None:
        if len(_SNAPSHOT_MEMO) > 4096:
            _SNAPSHOT_MEMO.clear()
        _SNAPSHOT_MEMO[ctx.cache_key] = (ctx.objects, admitted, snapshot)
    return snapshot


def _cohort_objects(objects: Objects, key: str) -> Objects:
    """Only the ClusterQueues (and cohorts) behind one qm.workloads key: the drain copies its
    snapshot, so a tree of the whole cluster would be copied on every event."""
    memo = _COHORT_OBJECTS.get((id(objects), key))
    if memo is not None and memo[0] is objects:
        return memo[1]
    whole = build_snapshot(objects, [])
    queues = {name: cq for name, cq in objects.cluster_queues.items() if whole.root_name(name) == key}
    if not queues:
        return objects
    cohorts = {name: c for name, c in objects.cohorts.items() if "cohort:" + _root(objects, name) == key}
    local = {k: lq for k, lq in objects.local_queues.items() if lq.cluster_queue in queues}
    subset = dataclasses.replace(objects, cluster_queues=queues, cohorts=cohorts, local_queues=local, workloads=())
    _COHORT_OBJECTS[(id(objects), key)] = (objects, subset)
    return subset


def _root(objects: Objects, cohort: str) -> str:
    while cohort in objects.cohorts and objects.cohorts[cohort].parent is not None:
        cohort = objects.cohorts[cohort].parent
    return cohort


def _admitted_for_snapshot(entry: dict) -> AdmittedWorkload:
    # Entries live in the table as the same dict between events; an id is only trusted with
    # the identity it was made for (a reused id of another entry fails the check).
    identity = (entry["uid"], entry["reserved_at"], entry["cluster_queue"])
    memo = _ADMITTED_MEMO.get(id(entry))
    if memo is not None and memo[0] == identity:
        return memo[1]
    if len(_ADMITTED_MEMO) > 200_000:
        _ADMITTED_MEMO.clear()
    admitted = _convert_admitted(entry)
    _ADMITTED_MEMO[id(entry)] = (identity, admitted)
    return admitted


def _convert_admitted(entry: dict) -> AdmittedWorkload:
    usage = tuple(
        sorted(((flavor, res), amount) for flavor, by_res in entry["usage"].items() for res, amount in by_res.items())
    )
    return AdmittedWorkload(
        key=f"{entry['namespace']}/{entry['name']}",
        cluster_queue=entry["cluster_queue"],
        priority=entry["workload"]["priority"],
        usage=usage,
        quota_reserved_at=entry["reserved_at"],
        created_at=epoch(entry["workload"]["created_at"]),
        uid=entry["uid"],
    )


def _usage_by_flavor(workload: dict, flavors: dict, counts: dict) -> dict[str, dict[str, int]]:
    usage: dict[str, dict[str, int]] = {}
    for ps in workload["pod_sets"]:
        count = counts.get(ps["name"], ps["count"])
        for resource, per_pod in ps["requests"].items():
            flavor = flavors.get(ps["name"], {}).get(resource)
            if flavor is None:
                continue
            by_res = usage.setdefault(flavor, {})
            by_res[resource] = by_res.get(resource, 0) + per_pod * count
    return usage


def _drain(state: dict, ctx: Context, emit: _Emitter, only: list[str] | None = None) -> None:
    """Admit everything that now fits, in Kueue's order (the core's drain mode)."""
    now = state["now"]
    candidates = [state["pending"][u] for u in only if u in state["pending"]] if only else state["pending"].values()
    eligible = [w for w in candidates if w["eligible_at"] <= now]
    if not eligible:
        return
    snapshot = _snapshot_for(ctx, state)
    by_key = {f"{w['namespace']}/{w['name']}": w for w in eligible}
    result = drain(snapshot, [_core_workload(w) for w in eligible], now)
    touched = set()
    for decision in result.decisions:
        workload = by_key[decision.workload]
        uid = workload["uid"]
        if decision.status == WorkloadStatus.ADMITTED:
            flavors = {ps: dict(res) for ps, res in decision.flavors.items()}
            counts = dict(decision.counts)
            placement, no_fit = _place(state, workload, flavors, counts)
            if no_fit:
                _say_pending(state, emit, workload, snapshot.root_name(decision.cluster_queue),
                             decision.cluster_queue, "NoFit", no_fit)
                continue
            entry = {
                "uid": uid,
                "namespace": workload["namespace"],
                "name": workload["name"],
                "cluster_queue": decision.cluster_queue,
                "cohort_key": snapshot.root_name(decision.cluster_queue),
                "flavors": flavors,
                "counts": counts,
                "usage": _usage_by_flavor(workload, flavors, counts),
                "reserved_at": now,
                "running_at": None,
                "placement": placement,
                "workload": workload,
            }
            del state["pending"][uid]
            state["said"].pop(uid, None)
            state.get("blocked", {}).pop(uid, None)
            state["admitted"][uid] = entry
            touched.add(workload["namespace"])
            emit.reserved(entry, borrowing=decision.borrowing > 0)
            emit.admit_action(entry, ctx)
        elif decision.status == WorkloadStatus.PREEMPTING:
            # Ask again only when the cohort's admitted set changed since the last question.
            said = "preempting|" + ",".join(sorted(state["admitted"]))
            if state["said"].get(uid) == said:
                continue  # already asked; the preemption service answers once
            state["said"][uid] = said
            emit.preemption_needed(state, workload, decision, snapshot.root_name(decision.cluster_queue))
        else:
            key = snapshot.root_name(decision.cluster_queue) if decision.cluster_queue else workload["cluster_queue"]
            _say_pending(state, emit, workload, key, decision.cluster_queue, str(decision.reason),
                         decision.message or str(decision.reason))
    if touched:
        emit.usage(state, touched)


def _say_pending(state: dict, emit: _Emitter, workload: dict, key: str, cluster_queue: str | None,
                 reason: str, message: str) -> None:
    """Pending, said only when the reason or message changed: no event storm for a queue that
    did not move."""
    uid = workload["uid"]
    said = f"{reason}|{message}"
    if state["said"].get(uid) == said:
        return
    state["said"][uid] = said
    emit.add("qm.workloads", key, WorkloadPending(uid=uid, namespace=workload["namespace"], name=workload["name"],
                                                  cluster_queue=cluster_queue, reason=reason, message=message),
             identity=(uid, said, len(state["admitted"])))


def _place(state: dict, workload: dict, flavors: dict, counts: dict) -> tuple[list, str]:
    """Quota is not capacity: place every pod on a node of its flavor with enough free GPUs
    (largest free first). Nodes come from node.capacity events; what this cohort already
    placed counts as used. Flavors without known nodes are not checked.
    Returns (placement [(node, gpu milli)], "" ) or ([], the Pending message)."""
    nodes = state.get("nodes") or {}
    if not nodes:
        return [], ""
    free = {name: n["gpu"] for name, n in nodes.items()}
    for entry in state["admitted"].values():
        for node, gpu in entry.get("placement") or []:
            if node in free:
                free[node] -= gpu
    placement = []
    for ps in workload["pod_sets"]:
        per_pod = ps["requests"].get(GPU, 0)
        flavor = flavors.get(ps["name"], {}).get(GPU)
        candidates = [n for n, spec in nodes.items() if spec["flavor"] == flavor]
        if not per_pod or not candidates:
            continue
        for _ in range(counts.get(ps["name"], ps["count"])):
            best = max(candidates, key=lambda n: (free[n], n))
            if free[best] < per_pod:
                return [], f"quota available, but no {flavor} node has {per_pod / 1000:g} free {GPU}"
            free[best] -= per_pod
            placement.append((best, per_pod))
    return placement, ""


def _namespace_limits(state: dict, namespace: str) -> dict | None:
    """The rule-set borrowingLimits of the ClusterQueues this namespace holds quota in
    (cq -> flavor -> resource -> milli), published with its usage; None without any."""
    limits = state.get("limits")
    if not limits:
        return None
    queues = {e["cluster_queue"] for e in state["admitted"].values() if e["namespace"] == namespace}
    out: dict[str, dict[str, dict[str, int]]] = {}
    for stored, milli in sorted(limits.items()):
        cq, flavor, resource = stored.split("|", 2)
        if cq in queues and milli is not None:
            out.setdefault(cq, {}).setdefault(flavor, {})[resource] = milli
    return out or None


def namespace_usage(admitted: Iterable[dict], namespace: str) -> tuple[dict, dict, dict]:
    """(reserved, running, total) of one namespace's admitted workloads: flavor -> resource -> milli
    for reserved (pods not yet running) and running, resource -> milli for the total."""
    reserved: dict[str, dict[str, int]] = {}
    running: dict[str, dict[str, int]] = {}
    total: dict[str, int] = {}
    for entry in admitted:
        if entry["namespace"] != namespace:
            continue
        target = running if entry["running_at"] is not None else reserved
        for flavor, by_res in entry["usage"].items():
            for resource, amount in by_res.items():
                target.setdefault(flavor, {})[resource] = target.get(flavor, {}).get(resource, 0) + amount
                total[resource] = total.get(resource, 0) + amount
    return reserved, running, total


class _Emitter:
    """Builds output envelopes caused by one input event, with deterministic ids."""

    def __init__(self, cause: Envelope, outputs: list[Output], now: float) -> None:
        self.cause = cause
        self.outputs = outputs
        self.now = now

    def add(self, topic: str, key: str, payload: Any, identity: tuple) -> None:
        envelope = make_envelope(
            payload, producer=PRODUCER, occurred_at=iso(self.now), identity=identity, cause=self.cause
        )
        self.outputs.append(Output(topic, key, envelope))

    def reserved(self, entry: dict, *, borrowing: bool) -> None:
        self.add(
            "qm.workloads",
            entry["cohort_key"],
            WorkloadQuotaReserved(
                uid=entry["uid"],
                namespace=entry["namespace"],
                name=entry["name"],
                cluster_queue=entry["cluster_queue"],
                cohort=entry["workload"].get("cohort"),
                flavors=entry["flavors"],
                counts=entry["counts"],
                usage=entry["usage"],
                reserved_at=iso(entry["reserved_at"]),
                borrowing=borrowing,
            ),
            identity=(entry["uid"], entry["reserved_at"], "reserved"),
        )

    def admit_action(self, entry: dict, ctx: Context) -> None:
        node_selector: dict[str, str] = {}
        for by_res in entry["flavors"].values():
            for flavor in by_res.values():
                node_selector.update(ctx.node_labels.get(flavor, {}))
        self.add(
            "qm.actions",
            entry["uid"],
            ActionAdmit(
                workload_uid=entry["uid"],
                namespace=entry["namespace"],
                name=entry["name"],
                kind="Job",
                node_selector=node_selector,
                flavors=entry["flavors"],
            ),
            identity=(entry["uid"], entry["reserved_at"], "admit"),
        )

    def preemption_needed(self, state: dict, workload: dict, decision: Any, cohort_key: str) -> None:
        """Ask the preemption service, with the cohort's admitted workloads as its snapshot."""
        admitted = [
            {
                "uid": e["uid"], "namespace": e["namespace"], "name": e["name"], "cluster_queue": e["cluster_queue"],
                "priority": e["workload"]["priority"], "created_at": e["workload"]["created_at"],
                "labels": e["workload"].get("labels", {}), "usage": e["usage"], "reserved_at": iso(e["reserved_at"]),
                "running_at": iso(e["running_at"]) if e["running_at"] is not None else None,
            }
            for e in sorted(state["admitted"].values(), key=lambda e: e["uid"])
        ]
        preemptor = {k: workload[k] for k in ("uid", "namespace", "name", "priority", "created_at", "pod_sets",
                                              "queue_name")}
        preemptor.update(cluster_queue=decision.cluster_queue, labels=workload.get("labels", {}))
        self.add(
            "qm.preemption",
            cohort_key,
            PreemptionNeeded(preemptor=preemptor, cohort=cohort_key,
                             snapshot={"admitted": admitted, "now": iso(self.now),
                                       "kueue_targets": [{"workload": t.workload, "reason": str(t.reason)}
                                                         for t in decision.preempts]},
                             message=decision.message or "preemption needed"),
            identity=(workload["uid"], tuple(sorted(a["uid"] for a in admitted)), "preemption-needed"),
        )

    def released(self, entry: dict, reason: str, at: float) -> None:
        self.add(
            "qm.workloads",
            entry["cohort_key"],
            WorkloadReleased(
                uid=entry["uid"],
                namespace=entry["namespace"],
                name=entry["name"],
                cluster_queue=entry["cluster_queue"],
                cohort=entry["workload"].get("cohort"),
                reason=reason,
                usage=entry["usage"],
                released_at=iso(at),
            ),
            identity=(entry["uid"], entry["reserved_at"], "released"),
        )

    def usage(self, state: dict, namespaces: set[str]) -> None:
        """Per-namespace usage in this cohort, reserved (not yet running) and running, by flavor."""
        for namespace in sorted(namespaces):
            reserved, running, total = namespace_usage(state["admitted"].values(), namespace)
            limits = _namespace_limits(state, namespace)
            digest = repr((sorted(reserved.items()), sorted(running.items()), limits))
            self.add(
                "qm.usage",
                namespace,
                UsageSnapshot(namespace=namespace, reserved=reserved, running=running, total=total, as_of=iso(self.now),
                              effective_borrowing_limits=limits),
                identity=(namespace, self.cause.event_id, digest),
            )
