"""The queue-manager's fold: one cohort's queues and reservations, advanced by events.

`apply(state, envelope, ctx) -> (state, outputs)` is pure: the quota decisions come from the
core's drain over an immutable snapshot, time comes from the events. The state is a plain
JSON-able dict so it can live in a faust table:

    pending   uid -> workload (as submitted) + eligible_at (backoff) + attempts
    admitted  uid -> workload + cluster_queue, flavors, counts, usage, reserved_at, running_at
    said      uid -> the last Pending reason|message published (no event storms)
    expiries  uid -> how many times its reservation expired before running
    finished_unjudged / running_unjudged  uid -> None: a finish / a running fact that came
              before the workload's verdict (bounded; the fact lane is not ordered with it)
    rejected  uid -> None: workloads admission rejected, stopped if their Job runs (bounded;
              ADR 0065)
    now       the latest event time seen (epoch seconds)
    limits    "cq|flavor|resource" -> the borrowingLimit a QuotaRule set (milli, None: no
              limit); absent: the configured one. Set only by cluster.signals.v1 events.
    draining  present while the queue.drain_due.v1 of this cohort's last drain is on its way
    due       the event time of the first change since then that waits for it (ADR 0016)
    preemptors  uid -> True for the waiting workloads whose last judgement was "preempting":
              an arrival is judged with them (ADR 0039), and each stays the head of its
              BestEffortFIFO queue until a pass decides it otherwise (ADR 0078)
    usage_due   namespace -> True: usage changed while `draining`, said when it returns (ADR 0050)
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from services.adapters.runtime import Output
from services.contracts.codec import Envelope, epoch_of, make_envelope, utc_iso
from services.contracts.events import (
    ActionAdmit,
    ActionCleanup,
    ActionEvict,
    ClockTick,
    ClusterSignals,
    DrainDue,
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
    WorkloadRejected,
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
    could_be_victim,
    drain,
    nomination_reads_only_kind,
    objects_behind,
)
from services.core.quota import Workload as CoreWorkload
from services.core.quota.dynamic import with_borrowing_limits
from services.core.quota.flavors import PODS, node_affinity_of, tolerations_of
from services.core.quota.model import QueueingStrategy, Reason
from services.core.quota.tree import available
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
    # Kueue's waitForPodsReady.requeuingStrategy.timestamp: a workload requeued after its
    # reservation expired waits behind those queued before the expiry (Eviction, the default),
    # or keeps its creation-time place (Creation). ADR 0074.
    requeue_after_expiry_by_creation: bool = False
    zombie_ttl_s: float = 600.0
    preemption_answer_timeout_s: float = 60.0  # a question unanswered this long (event time) is asked anew
    # pods all gone without a finish: released and cleaned up after zombie_ttl_s
    cache_key: str | None = None  # the table key (the cohort): the shell keeps this cohort's quota tree by it
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)  # flavor -> node labels
    quota_rules: tuple[quota_rules.QuotaRule, ...] = ()  # dynamic borrowingLimits (QuotaRule objects)
    # Changes that free quota while the cohort's last drain is in flight wait for its
    # queue.drain_due.v1 and are drained together (ADR 0016). Off: every change drains at once.
    coalesce_drains: bool = False


def by_creation_timestamp(requeuing_timestamp: str) -> bool:
    """Kueue's waitForPodsReady.requeuingStrategy.timestamp (`QM_REQUEUE_TIMESTAMP`) as
    `Context.requeue_after_expiry_by_creation`: Eviction (the default) or Creation."""
    choices = {"eviction": False, "creation": True}
    try:
        return choices[requeuing_timestamp.strip().lower()]
    except KeyError:
        raise ValueError(f"QM_REQUEUE_TIMESTAMP={requeuing_timestamp!r}: expected Eviction (a workload whose "
                         "reservation expired waits behind those queued before) or Creation (it keeps its "
                         "place by creation time), as Kueue's waitForPodsReady.requeuingStrategy.timestamp") from None


class KeyedContexts:
    """A context with a cohort key as its ``cache_key``, made once per key and context:
    ``dataclasses.replace`` for every event was ~3% of the queue-manager in kueue-large-scale.
    A key's context made from a context that a new config has replaced is made again."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[Context, Context]] = {}

    def of(self, context: Context, key: str) -> Context:
        made = self._made.get(key)
        if made is None or made[0] is not context:
            made = self._made[key] = (context, dataclasses.replace(context, cache_key=key))
        return made[1]


def empty_state() -> dict[str, Any]:
    return {"pending": {}, "admitted": {}, "said": {}, "expiries": {}, "now": 0.0}


#: How many workloads a cohort remembers of each kind below (newest kept).
UNJUDGED_KEPT = 4096


def _remember(state: dict, kind: str, uid: str) -> None:
    """A workload the cohort does not queue, kept under `kind`. Admission forwards facts on its
    fact lane and judges submissions on another, with no order between them (ADR 0026):
    * "finished_unjudged": a Job deleted a moment after its creation can have its finish reach
      the cohort's stream before its verdict, and the verdict must not queue it then;
    * "running_unjudged": a Job created where no webhook suspends it runs before its verdict,
      and the verdict stops it (ADR 0062);
    * "rejected": admission's verdict was no; its Job is stopped whenever it runs (ADR 0065).
    Bounded, oldest dropped: a verdict comes seconds after its workload's facts at most, not
    thousands of facts later; a rejected Job unsuspended after 4,096 newer rejections in its
    cohort runs unstopped."""
    unjudged = state.setdefault(kind, {})
    unjudged[uid] = None
    if len(unjudged) > UNJUDGED_KEPT:
        del unjudged[next(iter(unjudged))]


@functools.lru_cache(maxsize=1 << 16)
def iso(seconds: float) -> str:
    # Cached: every PreemptionNeeded formats each admitted workload's times again (2 us a call).
    return utc_iso(datetime.fromtimestamp(seconds, UTC))


#: What the fold reads on qm.workloads. Everything else there (its own decisions) changes
#: nothing, not even the fold's clock, so the shell may skip it unread.
FOLDED = (WorkloadValidated, WorkloadRejected, NodeCapacity, PodRunning, PodFinished, WorkloadRunning,
          WorkloadFinished, ClockTick, PreemptionVictimsSelected, ClusterSignals, DrainDue)


def apply(state: dict | None, envelope: Envelope, ctx: Context) -> tuple[dict, list[Output]]:
    state = state if state is not None else empty_state()
    payload = envelope.payload
    if not isinstance(payload, FOLDED):
        return state, []
    configured = ctx.objects
    if state.get("limits"):  # decide with the borrowingLimits the QuotaRules chose
        ctx = dataclasses.replace(ctx, objects=_effective_objects(configured, state["limits"]))
    previous_now = state["now"]
    state["now"] = max(state["now"], epoch_of(envelope.occurred_at))
    outputs: list[Output] = []
    emit = _Emitter(envelope, outputs, state["now"], ctx)
    # a change while the cohort's drain_due is on its way (not that drain_due, nor a tick)
    in_window = "draining" in state and not isinstance(payload, DrainDue | ClockTick)
    _step(state, payload, ctx, configured, previous_now, emit)
    _say_usage(state, emit, in_window)
    return state, outputs


def _step(state: dict, payload: Any, ctx: Context, configured: Objects, previous_now: float,
          emit: _Emitter) -> None:
    only: list[str] | None = None  # None: every pending workload of the cohort may now fit
    if isinstance(payload, WorkloadValidated):
        if payload.uid in state["admitted"] or payload.uid in state["pending"]:
            return  # re-validated after a resubmission: already known
        if payload.uid in state.get("finished_unjudged", ()):
            return  # deleted before its verdict came: nothing to queue
        _enqueue(state, ctx, {
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
        })
        if payload.uid in state.get("running_unjudged", ()):
            del state["running_unjudged"][payload.uid]
            _stop_if_never_admitted(state, payload.uid, emit)  # before any Admit the drain sends
        if "due" in state:
            return  # the coming drain judges it in its place among the waiting
        # An arrival frees no quota, so under BestEffortFIFO only the newcomer can newly fit;
        # under StrictFIFO it may have to queue behind its ClusterQueue's head. It is judged
        # with the waiting preemptors: Kueue holds a preemptor's quota in every cycle it is
        # nominated in, so a newcomer behind it in the cycle's order cannot take what frees up
        # while its victims go (judged alone, a stream of small arrivals kept a 20-cpu
        # preemptor waiting 15 s; ADR 0039).
        spec = ctx.objects.cluster_queues.get(payload.cluster_queue)
        if spec is not None and spec.queueing_strategy == QueueingStrategy.STRICT_FIFO:
            only = [u for u, w in state["pending"].items() if w["cluster_queue"] == payload.cluster_queue]
        else:
            only = [payload.uid]
        only += [u for u in state.get("preemptors", ()) if u in state["pending"] and u not in only]
    elif isinstance(payload, WorkloadRejected):
        if payload.uid in state["admitted"] or payload.uid in state["pending"]:
            return  # judged again after a resubmission: its first verdict stands
        _remember(state, "rejected", payload.uid)
        if payload.uid in state.get("running_unjudged", ()):
            del state["running_unjudged"][payload.uid]
            _stop_rejected(payload.uid, payload.namespace, payload.name, "", emit)  # it ran before the verdict
        return
    elif isinstance(payload, NodeCapacity):
        nodes = state.setdefault("nodes", {})
        _NODES_BY_FLAVOR.pop(id(nodes), None)
        if payload.deleted or payload.unschedulable or not payload.flavor:
            nodes.pop(payload.node, None)
        else:
            nodes[payload.node] = {"flavor": payload.flavor, "gpu": (payload.allocatable or {}).get(GPU, 0)}
    elif isinstance(payload, PodRunning | PodFinished):
        _track_pod(state, payload)
        return
    elif isinstance(payload, WorkloadRunning):
        entry = state["admitted"].get(payload.uid)
        if entry is None:
            if payload.uid in state["pending"]:
                _stop_if_never_admitted(state, payload.uid, emit)
            elif payload.uid in state.get("rejected", ()):
                _stop_rejected(payload.uid, payload.namespace, payload.name, payload.started_at, emit)
            elif payload.uid not in state.get("finished_unjudged", ()):
                _remember(state, "running_unjudged", payload.uid)
            return
        if entry["running_at"] is not None:
            return
        _mark_running(state, ctx, entry, epoch_of(payload.started_at))
        emit.usage_changed({entry["namespace"]})
        return
    elif isinstance(payload, WorkloadFinished):
        if payload.uid not in state["admitted"] and payload.uid not in state["pending"]:
            _remember(state, "finished_unjudged", payload.uid)
            state.get("rejected", {}).pop(payload.uid, None)  # its Job is gone: nothing left to stop
        entry = _unadmit(state, ctx, payload.uid)
        _dequeue(state, ctx, payload.uid)
        state["said"].pop(payload.uid, None)
        state.get("blocked", {}).pop(payload.uid, None)
        state["expiries"].pop(payload.uid, None)
        if entry is None:
            return
        emit.released(entry, "Finished", epoch_of(payload.finished_at))
        emit.usage_changed({entry["namespace"]})
    elif isinstance(payload, ClockTick):
        expired = _expire_idle_reservations(state, ctx, emit)
        expired = _clean_up_zombies(state, ctx, emit) or expired
        woke = any(previous_now < w["eligible_at"] <= state["now"] for w in state["pending"].values())
        if not expired and not woke and "due" not in state:
            return  # time passed, nothing that decides changed
        # A tick drains at once, and closes the window: a drain_due that got lost (or is
        # late) cannot keep the cohort's changes waiting for longer than one tick.
        state.pop("draining", None)
        state.pop("due", None)
        _drain(state, ctx, emit)
        return
    elif isinstance(payload, DrainDue):
        state.pop("draining", None)
        if state.pop("due", None) is None:
            return  # nothing waited: the window closes
    elif isinstance(payload, PreemptionVictimsSelected):
        if not _apply_preemption(state, payload, ctx, emit):
            return
    elif isinstance(payload, ClusterSignals):
        if not _apply_quota_rules(state, payload, configured, ctx, emit):
            return  # no limit rose: nothing waiting can newly fit
        ctx = dataclasses.replace(ctx, objects=_effective_objects(configured, state.get("limits") or {}))
    else:
        return  # our own outputs and other services' events on qm.workloads

    if only is not None:
        _drain(state, ctx, emit, only=only)
    else:
        _drain_all(state, ctx, emit)


def _say_usage(state: dict, emit: _Emitter, in_window: bool) -> None:
    """Publish the usage of the namespaces the event changed, or keep them for the round trip
    (ADR 0050). A change in a drain window waits in `usage_due`; the drain_due's return (or a
    tick, if it is lost) says each namespace kept once, with its usage of that moment. A busy
    cohort so says a namespace's usage about once per round trip of its own stream, not at
    every reservation, start and release; a quiet cohort says it at once, as it drains."""
    changed = emit.namespaces_changed
    if in_window:
        if changed:
            due = state.setdefault("usage_due", {})  # namespace -> True (JSON has no sets)
            due.update(dict.fromkeys(changed, True))
        return
    due = state.pop("usage_due", None)
    if due:
        changed = changed | due.keys()
    if changed:
        emit.publish_usage(state, changed)


def _drain_all(state: dict, ctx: Context, emit: _Emitter) -> None:
    """A change after which any waiting workload may fit. A quiet cohort drains at once and
    sends itself a queue.drain_due.v1; changes that arrive before it comes back wait for it and
    are drained together. A busy cohort so drains once per round trip of its own stream, not
    once per finish, and the drains happen at the same places in the stream on every replay
    (ADR 0016)."""
    if not ctx.coalesce_drains or ctx.cache_key is None:
        _drain(state, ctx, emit)
        return
    if "draining" in state:
        state.setdefault("due", state["now"])
        return
    _drain(state, ctx, emit)
    state["draining"] = True
    emit.add("qm.workloads", ctx.cache_key, DrainDue(cohort=ctx.cache_key, since=iso(state["now"])),
             identity=(ctx.cache_key, "drain-due", emit.cause.event_id))


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
        subset = objects_behind(configured, ctx.cache_key)
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
        emit.usage_changed(holders)
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
    """Pre-freeze timeout: a reservation not running within podsReadyTimeout is released, its
    Job stopped (an Evict without grace) and requeued with exponential backoff; after
    max_expiries the workload is deactivated (and stopped too)."""
    now, timeout, admitted = state["now"], ctx.pods_ready_timeout_s, state["admitted"]
    touched = set()
    # Every tick looks at every admitted workload; sorting them all first was ~10% of the
    # queue-manager in the Alibaba replay. Only the expired are sorted (by uid, as before).
    expired = sorted(uid for uid, e in admitted.items() if e["running_at"] is None and now - e["reserved_at"] >= timeout)
    for uid in expired:
        entry = admitted[uid]
        _unadmit(state, ctx, uid)
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
            identity=(uid, entry["reserved_at"], entry.get("attempt", 0), "expired"),
        )
        emit.released(entry, "PodsReadyTimeout", expired_at)
        # The Job was unsuspended when its quota was reserved: stop it, as Kueue evicts on
        # waitForPodsReady's timeout, or pods that start later (a node that comes up, an image
        # that finally pulls) run on quota released to others. No grace: nothing ran to checkpoint.
        _stop_job(emit, uid, entry["namespace"], entry["name"], ActionEvict.PODS_READY_TIMEOUT,
                  identity=(uid, entry["reserved_at"], entry.get("attempt", 0), "stop"))
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
        _requeue(state, ctx, emit, entry, "PodsReadyTimeout", attempt=expiries, at=expired_at, backoff=True)
    if touched:
        emit.usage_changed(touched)
    return bool(touched)


def _requeue(state: dict, ctx: Context, emit: _Emitter, entry: dict, reason: str, *, attempt: int,
             at: float, backoff: bool) -> None:
    """Back to the queue: after a pre-freeze expiry with Kueue's exponential backoff (base,
    doubled per attempt, capped), after a preemption at once. Kueue's requeuingStrategy backs
    off only evictions for PodsReadyTimeout; a preempted workload goes straight back to its
    queue, in its place by priority and creation time (ADR 0063)."""
    workload = entry["workload"]
    backoff_s = min(ctx.backoff_base_s * 2 ** (attempt - 1), ctx.backoff_max_s) if backoff else 0.0
    workload["eligible_at"] = at + backoff_s
    # Its place in the queue (Kueue's GetQueueOrderTimestamp): the expiry's time after a
    # pre-freeze expiry (requeuingStrategy Eviction), the creation time after a preemption
    if backoff and not ctx.requeue_after_expiry_by_creation:
        workload["queued_at"] = iso(at)
    else:
        workload.pop("queued_at", None)
    _CORE_WORKLOADS.pop(entry["uid"], None)  # its queue order may have moved
    workload["attempts"] = attempt
    _enqueue(state, ctx, workload)
    emit.add("qm.workloads", entry["cohort_key"], WorkloadRequeued(
        uid=entry["uid"], namespace=entry["namespace"], name=entry["name"], cluster_queue=entry["cluster_queue"],
        reason=reason, requeue_at=iso(workload["eligible_at"]), backoff_s=int(backoff_s), attempt=attempt,
        queue_order_at=_queue_order_at(workload)),
        identity=(entry["uid"], entry["reserved_at"], entry.get("attempt", 0), "requeued"))


def _stop_if_never_admitted(state: dict, uid: str, emit: _Emitter) -> None:
    """A queued workload that runs before any admission (its Job unsuspended by hand, or created
    where the mutating webhook is not installed) runs on quota nobody reserved: stop it, once per
    queued attempt, as Kueue's job reconciler stops a Job it has not admitted. A requeued
    workload (attempts > 0) was stopped already, by its eviction or its expiry."""
    waiting = state["pending"].get(uid)
    if waiting is None or waiting["attempts"] or waiting.get("stopped"):
        return
    waiting["stopped"] = True
    _stop_job(emit, uid, waiting["namespace"], waiting["name"], ActionEvict.NOT_ADMITTED, identity=(uid, "not-admitted"))


def _stop_rejected(uid: str, namespace: str, name: str, started_at: str, emit: _Emitter) -> None:
    """A workload admission rejected runs (its Job unsuspended by hand, or created where the
    mutating webhook is not installed): stop it, as Kueue's reconciler stops every queue-labelled
    Job it has not admitted (ADR 0065). Once per start of it: a Job unsuspended again is stopped
    again, and the pods of one start share its time (at worst a few stops, which the watcher
    answers "already suspended")."""
    _stop_job(emit, uid, namespace, name, ActionEvict.NOT_ADMITTED, identity=(uid, "rejected", started_at))


def _stop_job(emit: _Emitter, uid: str, namespace: str, name: str, reason: str, *, identity: tuple) -> None:
    """The queue-manager's own stop of a workload's Job (ADR 0062, 0065): an Evict without grace,
    since nothing ran on quota that could checkpoint."""
    emit.add("qm.actions", uid, ActionEvict(workload_uid=uid, namespace=namespace, name=name, kind="Job",
                                            reason=reason, grace_period_s=0), identity=identity)


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
            entry["pods_gone_at"] = epoch_of(pod.finished_at)


def _clean_up_zombies(state: dict, ctx: Context, emit: _Emitter) -> bool:
    """A workload whose pods vanished without a finish still holds quota: after the TTL it is
    released and the watcher is told to delete it."""
    now, ttl, admitted = state["now"], ctx.zombie_ttl_s, state["admitted"]
    touched = set()
    gone_past_ttl = sorted(uid for uid, e in admitted.items() if (gone := e.get("pods_gone_at")) is not None and now - gone >= ttl)
    for uid in gone_past_ttl:
        entry = admitted[uid]
        gone = entry["pods_gone_at"]
        _unadmit(state, ctx, uid)
        touched.add(entry["namespace"])
        emit.released(entry, "ZombieTTLExpired", gone + ctx.zombie_ttl_s)
        emit.add("qm.actions", uid, ActionCleanup(
            workload_uid=uid, namespace=entry["namespace"], name=entry["name"], kind="Job",
            reason=f"pods gone since {iso(gone)} without the workload finishing; quota released after "
                   f"{ctx.zombie_ttl_s:.0f}s"), identity=(uid, entry["reserved_at"], entry.get("attempt", 0), "cleanup"))
    if touched:
        emit.usage_changed(touched)
    return bool(touched)


def _apply_preemption(state: dict, answer: PreemptionVictimsSelected, ctx: Context, emit: _Emitter) -> bool:
    """The preemption service chose victims (or found none allowed). Victims give their quota
    back and requeue; the preemptor is admitted first in this same step, so the
    freed quota is held for it and no third workload can take it. Returns False if nothing moved.

    The preemption service has already told the cluster to evict the victims when its answer
    arrives, so they give their quota back even if the preemptor no longer waits (admitted or
    gone meanwhile): kept as admitted here, they would hold quota while the cluster had
    stopped them, and nothing would ever admit them again."""
    asking = state.get("asking", {})
    for cq in [cq for cq, question in asking.items() if question["uid"] == answer.preemptor_uid]:
        del asking[cq]  # answered: the queue's next preemptor may ask
    preemptor = state["pending"].get(answer.preemptor_uid)
    if preemptor is None:
        holder = state["admitted"].get(answer.preemptor_uid)
        name = f"{holder['namespace']}/{holder['name']}" if holder else answer.preemptor_uid
        return _evict_victims(state, answer, ctx, emit, name)  # then every waiting workload may fit
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
    _evict_victims(state, answer, ctx, emit, f"{preemptor['namespace']}/{preemptor['name']}")
    _drain(state, ctx, emit, only=[preemptor["uid"]])  # nominated: the freed quota is the preemptor's
    return True


def _evict_victims(state: dict, answer: PreemptionVictimsSelected, ctx: Context, emit: _Emitter,
                   preemptor_name: str) -> bool:
    """The victims still admitted give their quota back and requeue (at once, as in Kueue)."""
    now = state["now"]
    touched = set()
    for victim in answer.victims:
        entry = _unadmit(state, ctx, victim["uid"])
        if entry is None:
            continue
        touched.add(entry["namespace"])
        emit.add("qm.workloads", entry["cohort_key"], WorkloadEvicted(
            uid=entry["uid"], namespace=entry["namespace"], name=entry["name"], cluster_queue=entry["cluster_queue"],
            reason=victim["reason"], preemptor=preemptor_name, grace_period_s=victim.get("grace_period_s", 0),
            evicted_at=iso(now)), identity=(entry["uid"], entry["reserved_at"], entry.get("attempt", 0), "evicted"))
        emit.released(entry, "Preempted", now)
        state["said"].pop(entry["uid"], None)
        _requeue(state, ctx, emit, entry, "Preempted", attempt=entry["workload"].get("attempts", 0) + 1, at=now,
                 backoff=False)
    if touched:
        emit.usage_changed(touched)
    return bool(touched)


_CORE_WORKLOADS: dict[str, tuple[dict, CoreWorkload, tuple, tuple, tuple]] = {}


def _pending_view(w: dict) -> tuple[dict, CoreWorkload, tuple, tuple, tuple]:
    """(w, the core's view of it, its kind, its place in its kind, its place in a drain's
    order) — made once per pending entry (what they read does not change while it waits): a
    deep queue is looked at on every release."""
    memo = _CORE_WORKLOADS.get(w["uid"])
    if memo is not None and memo[0] is w:
        return memo
    if len(_CORE_WORKLOADS) > 200_000:  # (entries leave on admission; this bounds the withdrawn)
        _CORE_WORKLOADS.clear()
    shape = tuple((ps["name"], ps.get("min_count") or ps["count"], tuple(sorted(ps["requests"].items())),
                   _pairs(ps, "node_selector"), _pairs(ps, "refused_flavors"),
                   node_affinity_of(ps.get("node_affinity")), tolerations_of(ps.get("tolerations")))
                  for ps in w["pod_sets"])
    core = _convert_pending(w)
    # the core's own queue order within a kind (queue time, namespace/name), then uid: a kind's
    # first few in this order are the first few its queue holds in the drain (ADR 0077)
    order = (*core.queue_order[1:], w["uid"])
    memo = (w, core, (w["cluster_queue"], w["priority"], shape), order, (-w["priority"], *order))
    _CORE_WORKLOADS[w["uid"]] = memo
    return memo


_DRAIN_ORDER = itemgetter(4)


def _queue_order_at(w: dict) -> str:
    """When a waiting workload's place in its queue counts from (Kueue's GetQueueOrderTimestamp):
    the expiry that requeued it, else its creation (ADR 0074)."""
    return w.get("queued_at") or w["created_at"]


#: one tuple of PodSets per distinct pod sets: a drain finds a workload's shape by the tuple's
#: identity, where hashing and comparing its PodSets again was a tenth of building the drain
_POD_SETS: dict[tuple, tuple[PodSet, ...]] = {}


def _pairs(ps: dict, field: str) -> tuple[tuple[str, str], ...]:
    """A pod set's nodeSelector or refused flavors as the core reads them (ADR 0070)."""
    mapping = ps.get(field)
    return tuple(sorted(mapping.items())) if mapping else ()


def _shared_pod_sets(pod_sets: list[dict]) -> tuple[PodSet, ...]:
    fields = tuple((ps["name"], ps["count"], tuple(sorted(ps["requests"].items())), ps.get("min_count"),
                    _pairs(ps, "node_selector"), _pairs(ps, "refused_flavors"),
                   node_affinity_of(ps.get("node_affinity")), tolerations_of(ps.get("tolerations")))
                   for ps in pod_sets)
    shared = _POD_SETS.get(fields)
    if shared is None:
        if len(_POD_SETS) > 4096:
            _POD_SETS.clear()
        shared = _POD_SETS[fields] = tuple(
            PodSet(name=name, count=count, requests=requests, min_count=min_count, node_selector=selector,
                   refused_flavors=refused, node_affinity=affinity, tolerations=tolerations)
            for name, count, requests, min_count, selector, refused, affinity, tolerations in fields
        )
    return shared


def _convert_pending(w: dict) -> CoreWorkload:
    return CoreWorkload(
        namespace=w["namespace"],
        name=w["name"],
        queue_name=w["queue_name"],
        pod_sets=_shared_pod_sets(w["pod_sets"]),
        priority=w["priority"],
        priority_class=w.get("priority_class"),
        created_at=epoch_of(_queue_order_at(w)),  # the queue order's time
        uid=w["uid"],
    )


@dataclass
class _CohortIndex:
    """What the fold would otherwise recompute from every admitted workload on every event:
    the cohort's quota tree with its usage, the admitted workloads per namespace, the GPUs
    placed per node. Process memory, kept in step by `_admit` / `_unadmit` (the only writers
    of state["admitted"]) and trusted only for the very dict it mirrors, at the size it saw:
    anything else (a restart, a config change, a fold that failed half-way) rebuilds it."""

    objects: Objects
    admitted: dict
    count: int
    snapshot: Any
    by_namespace: dict[str, dict[str, dict]]
    node_used: dict[str, int]
    usage: dict[str, _UsageTotals]  # namespace -> its reserved and running sums

    @classmethod
    def build(cls, objects: Objects, admitted: dict) -> _CohortIndex:
        index = cls(objects, admitted, 0, build_snapshot(objects, []), {}, {}, {})
        for entry in admitted.values():
            index.add(entry)
        return index

    def fits(self, objects: Objects, admitted: dict) -> bool:
        return self.objects is objects and self.mirrors(admitted)

    def mirrors(self, admitted: dict) -> bool:
        return self.admitted is admitted and self.count == len(admitted)

    def add(self, entry: dict) -> None:
        workload = _convert_admitted(entry)
        if workload.key in self.snapshot.workloads:
            raise ValueError(f"{workload.key} is admitted twice (uids {entry['uid']} and "
                             f"{self.snapshot.workloads[workload.key].uid})")
        self.snapshot.add_workload(workload)
        self.by_namespace.setdefault(entry["namespace"], {})[entry["uid"]] = entry
        self.usage.setdefault(entry["namespace"], _UsageTotals()).change(entry, +1)
        for node, gpu in entry.get("placement") or []:
            self.node_used[node] = self.node_used.get(node, 0) + gpu
        self.count += 1

    def remove(self, entry: dict) -> None:
        key = f"{entry['namespace']}/{entry['name']}"
        if key in self.snapshot.workloads:  # (one in an unknown ClusterQueue never counted)
            self.snapshot.remove_workload(key)
        self.by_namespace.get(entry["namespace"], {}).pop(entry["uid"], None)
        self.usage[entry["namespace"]].change(entry, -1)
        for node, gpu in entry.get("placement") or []:
            self.node_used[node] = self.node_used.get(node, 0) - gpu
        self.count -= 1


_INDEXES: dict[str | None, _CohortIndex] = {}  # by cache key (None: the last one built without)


def _index(ctx: Context, state: dict) -> _CohortIndex:
    """The cohort's index, rebuilt when it does not mirror this state; without a cache key (a
    fold over events in a test or a tool) a fresh one each time it is asked for."""
    objects = objects_behind(ctx.objects, ctx.cache_key) if ctx.cache_key is not None else ctx.objects
    index = _INDEXES.get(ctx.cache_key)
    if ctx.cache_key is None or index is None or not index.fits(objects, state["admitted"]):
        if len(_INDEXES) > 4096:
            _INDEXES.clear()
        index = _INDEXES[ctx.cache_key] = _CohortIndex.build(objects, state["admitted"])
    return index


def _admit(state: dict, ctx: Context, entry: dict) -> None:
    index = _in_step(state, ctx)
    state["admitted"][entry["uid"]] = entry
    state["rev"] = state.get("rev", 0) + 1
    _CORE_WORKLOADS.pop(entry["uid"], None)
    if index is not None:
        index.add(entry)


def _unadmit(state: dict, ctx: Context, uid: str) -> dict | None:
    index = _in_step(state, ctx)
    entry = state["admitted"].pop(uid, None)
    if entry is None:
        return None
    state["rev"] = state.get("rev", 0) + 1
    _VICTIM_VIEWS.pop(uid, None)
    if index is not None:
        index.remove(entry)
    return entry


def _mark_running(state: dict, ctx: Context, entry: dict, at: float) -> None:
    """Its GPUs move from reserved to running in the namespace's sums."""
    index = _in_step(state, ctx)
    totals = index.usage.get(entry["namespace"]) if index is not None else None
    if totals is not None:
        totals.change(entry, -1)
    entry["running_at"] = at
    if totals is not None:
        totals.change(entry, +1)


def _in_step(state: dict, ctx: Context) -> _CohortIndex | None:
    """The index when it mirrors this state (whatever config it was built for)."""
    index = _INDEXES.get(ctx.cache_key)
    return index if index is not None and index.mirrors(state["admitted"]) else None


def _namespace_entries(state: dict, ctx: Context, namespace: str) -> Iterable[dict]:
    index = _in_step(state, ctx)
    if index is not None:
        return index.by_namespace.get(namespace, {}).values()
    return [e for e in state["admitted"].values() if e["namespace"] == namespace]


def _namespace_usage(state: dict, ctx: Context, namespace: str) -> tuple[dict, dict, dict]:
    index = _in_step(state, ctx)
    if index is not None:
        return index.usage.get(namespace, _UsageTotals()).view()
    return namespace_usage(state["admitted"].values(), namespace)


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
        created_at=epoch_of(entry["workload"]["created_at"]),
        uid=entry["uid"],
    )


def _usage_by_flavor(workload: dict, flavors: dict, counts: dict) -> dict[str, dict[str, int]]:
    """What a reservation holds, per flavor and resource, as the core's flavor assigner counts
    it: each pod set's requests times its count and, in a ClusterQueue that covers Kueue's
    `pods` resource (a flavor was chosen for it), one pod (1,000 milli) per count. Without the
    pods, every reservation after the drain that made it counted none, and a queue with a
    pods quota of 2 took a third one-pod workload."""
    usage: dict[str, dict[str, int]] = {}
    for ps in workload["pod_sets"]:
        count = counts.get(ps["name"], ps["count"])
        chosen = flavors.get(ps["name"], {})
        for resource, per_pod in ps["requests"].items():
            flavor = chosen.get(resource)
            if flavor is None or resource == PODS:
                continue
            by_res = usage.setdefault(flavor, {})
            by_res[resource] = by_res.get(resource, 0) + per_pod * count
        flavor = chosen.get(PODS)
        if flavor is not None:
            by_res = usage.setdefault(flavor, {})
            by_res[PODS] = by_res.get(PODS, 0) + count * 1000
    return usage


def _drain(state: dict, ctx: Context, emit: _Emitter, only: list[str] | None = None) -> None:
    """Admit everything that now fits, in Kueue's order (the core's drain mode)."""
    now = state["now"]
    index = _index(ctx, state)
    snapshot = index.snapshot
    ends: set[str] = set()
    if only is None:
        eligible, ends = _worth_judging(snapshot, _pending_index(ctx, state), state["pending"], now, DRAIN_SHARE_MARGIN)
        if ends and _preemptor_left_out(state, eligible, now):
            eligible, ends = _worth_judging(snapshot, _pending_index(ctx, state), state["pending"], now, None)
    else:
        eligible = [state["pending"][u] for u in only if u in state["pending"] and state["pending"][u]["eligible_at"] <= now]
    if not eligible:
        return
    standing = state.get("preemptors")
    pending = state["pending"]
    sticky = {_pending_view(w)[1].key for uid in standing if (w := pending.get(uid)) is not None} if standing else ()
    try:
        by_key, result = _drain_pass(snapshot, eligible, now, ends, sticky)
        if ends and _fed_too_few(result):
            # a run was cut short while the pass still took quota: judge as many as could fit
            eligible, _ = _worth_judging(snapshot, _pending_index(ctx, state), state["pending"], now, None)
            by_key, result = _drain_pass(snapshot, eligible, now, set(), sticky)
    except BaseException:
        _INDEXES.pop(ctx.cache_key, None)  # half-way through a drain: rebuilt from the state next time
        raise
    touched = set()
    preempting = []
    preemptors = state.get("preemptors")
    for decision in result.decisions:
        workload = by_key[decision.workload]
        uid = workload["uid"]
        if preemptors and decision.status != WorkloadStatus.PREEMPTING:
            preemptors.pop(uid, None)  # admitted, or no longer needs anybody's quota
        if decision.status == WorkloadStatus.ADMITTED:
            flavors = {ps: dict(res) for ps, res in decision.flavors.items()}
            counts = dict(decision.counts)
            placement, no_fit = _place(state, index.node_used, workload, flavors, counts)
            if no_fit:
                _say_pending(state, emit, workload, snapshot, decision.cluster_queue, "NoFit", no_fit)
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
                # which reservation of the workload this is: a victim requeued without backoff can
                # be reserved again at the same event time, and its events need ids of their own
                "attempt": workload.get("attempts", 0),
                "running_at": None,
                "placement": placement,
                "workload": workload,
            }
            _dequeue(state, ctx, uid)
            state["said"].pop(uid, None)
            state.get("blocked", {}).pop(uid, None)
            _admit(state, ctx, entry)
            touched.add(workload["namespace"])
            emit.reserved(entry, borrowing=decision.borrowing > 0)
            emit.admit_action(entry, ctx)
        elif decision.status == WorkloadStatus.PREEMPTING:
            preempting.append((decision, workload))
            state.setdefault("preemptors", {})[uid] = True
        elif decision.reason is Reason.QUEUED and uid in state["said"]:
            # Not judged this pass (behind its queue's head): as in Kueue, which leaves the status
            # of a workload it did not nominate alone, its last word stands. Saying "Queued" here
            # and the quota shortfall again next pass was a third of qm.workloads in
            # kueue-baseline (14,250 Pending for 3,000 workloads at scale 0.2).
            continue
        else:
            reason = str(decision.reason)
            _say_pending(state, emit, workload, snapshot, decision.cluster_queue, reason, decision.message or reason)
    # Asked once this pass's admissions are in the state: the drain judged these with all of
    # them holding quota, and a question sent before some were added said the cohort had room
    # (100 of 327 answers in a kueue-large-scale run at scale 0.1 were "it fits already").
    for decision, workload in preempting:
        uid = workload["uid"]
        # One question per ClusterQueue in flight (Kueue nominates one head per queue and
        # cycle): asking for every waiting preemptor after every admission or finish made
        # a storm of questions, each carrying the cohort's admitted set.
        asking = state.setdefault("asking", {})
        current = asking.get(decision.cluster_queue)
        if current is not None and current["uid"] in state["pending"] \
                and now - current["at"] < ctx.preemption_answer_timeout_s:
            continue  # answered first; then this one may ask (or be admitted meanwhile)
        # Ask again only when the cohort's admitted set changed since the last question.
        said = f"preempting|{state.get('rev', 0)}"
        if state["said"].get(uid) == said:
            continue  # already asked; the preemption service answers once
        state["said"][uid] = said
        asking[decision.cluster_queue] = {"uid": uid, "at": now}
        emit.preemption_needed(state, workload, decision, snapshot.root_name(decision.cluster_queue),
                               could_be_victim(snapshot, decision.cluster_queue, workload["priority"]))
    if touched:
        emit.usage_changed(touched)


#: A drain is handed, of each kind of waiting workload, its share of the room (the room over the
#: cohort's kinds, rounded up) and this many more (ADR 0077); None: as many as could fit, and one
#: more. 4: in kueue-baseline's last 20 s, 1 drain in 2,224 had to run again with all of them.
DRAIN_SHARE_MARGIN: int | None = 4


def _drain_pass(snapshot: Any, eligible: list[dict], now: float, ends: set[str],
                sticky: Collection[str] = ()) -> tuple[dict[str, dict], Any]:
    """One drain over `eligible` on the index's own snapshot, its admissions taken back out.
    `sticky`: the core's keys of the standing preemptors, each its queue's head (ADR 0078)."""
    # Decisions are carried out in this order (node placement takes GPUs first come, first
    # served), so make it Kueue's queue order, not the order the workloads were looked up in.
    views = [_pending_view(w) for w in eligible]
    views.sort(key=_DRAIN_ORDER)
    by_key = {view[1].key: view[0] for view in views}
    result = drain(snapshot, [view[1] for view in views], now, in_place=True, watch=ends, sticky=sticky)
    # The drain admitted into the index's own snapshot; take them back: each is added
    # again below (_admit) unless no node can hold it.
    for decision in result.decisions:
        if decision.status is WorkloadStatus.ADMITTED:
            snapshot.remove_workload(decision.workload)
    return by_key, result


def _preemptor_left_out(state: dict, eligible: list[dict], now: float) -> bool:
    """Whether a waiting preemptor was cut from a drain fed only each kind's share (ADR 0077).
    A pass that is fed a preemptor and does not decide it Preempting again (it admits it, says
    it Pending, or leaves it Queued behind its queue's head, as a StrictFIFO queue may) ends its standing,
    and the next arrival's drain is judged with the preemptors still standing (ADR 0039). So a
    preemptor the whole pass would be fed must not be left out of the fed one, or the two go on
    to decide differently (test_drain_feed, seed 53 and four more of 200). Rare: a preemptor is
    usually its queue's head."""
    preemptors = state.get("preemptors")
    if not preemptors:
        return False
    pending = state["pending"]
    fed = {w["uid"] for w in eligible}
    return any(uid not in fed and uid in pending and pending[uid]["eligible_at"] <= now for uid in preemptors)


def _fed_too_few(result: Any) -> bool:
    """Whether a drain fed the first few of some runs could have decided otherwise with all of
    them (ADR 0077): it took quota (an admission, a preemption) in or after the cycle that first
    decided the last one fed of a run, that one included. From the next cycle on, that queue's
    head would have been a workload it was not given, nominated on a tree that had changed since
    its run was last judged."""
    last_taking = result.last_taking_cycle
    return any(cycle <= last_taking for cycle in result.watched_at.values())


def _worth_judging(snapshot: Any, pending_index: _PendingIndex, pending: dict, now: float,
                   margin: int | None) -> tuple[list[dict], set[str]]:
    """Of a deep queue, only the workloads that could get quota now, and one more of each kind;
    with a `margin`, at most the kind's share of that and `margin` more, where its workloads are
    all nominated alike.

    Workloads of one ClusterQueue with the same priority and pod sets are judged alike, oldest
    first. Nothing is freed during a drain, so of a kind no more can be admitted than fit in
    what the queue may still use (its nominal quota left plus what it may borrow): judging the
    rest would only repeat "pending" thousands of times per release. One more than fits is kept,
    so the first that does not fit is still said Pending, or asks for preemption. Waiting
    workloads left out keep their last Pending message until their turn comes. Workloads in
    backoff (eligible later) are passed over.

    Every queue of a cohort counts the cohort's unused quota as its own room, so a release
    that frees room for 25 handed each of kueue-baseline's 6 queues 26 workloads, and the
    drain set aside some 130 of them one by one (ADR 0077). Cut to its share, a kind names
    the last workload kept (the second value): `_fed_too_few` tells from the drain's result
    whether it must run again with every workload that could fit. A kind's workloads are taken
    in the core's own queue order (`_pending_view`), so those kept are the first its queue
    holds."""
    kept = []
    ends: set[str] = set()
    kinds = len(pending_index.kinds)
    for (cq_name, _, shape), members in pending_index.kinds.items():
        cq = snapshot.cluster_queues.get(cq_name)
        room = _how_many_fit(cq, shape) + 1 if cq is not None else len(members)
        share = None if margin is None else -(-room // kinds) + margin
        capped = share is not None and share < room and cq is not None and nomination_reads_only_kind(cq)
        if capped:
            room = share
        last = None
        for _, uid in members:
            w = pending[uid]
            if w["eligible_at"] <= now:
                if room == 0:  # one more is waiting beyond its share
                    ends.add(_pending_view(last)[1].key)  # the name the drain knows it by
                    break
                kept.append(w)
                last = w
                room -= 1
                if room == 0 and not capped:
                    break
    return kept, ends


class _PendingIndex:
    """The waiting workloads by kind (ClusterQueue, priority, pod sets), oldest first; kept in
    step by `_enqueue` / `_dequeue` (the only writers of state["pending"]) like `_CohortIndex`."""

    def __init__(self, pending: dict) -> None:
        self.pending = pending
        self.count = 0
        self.kinds: dict[tuple, list[tuple[tuple, str]]] = {}
        for w in pending.values():
            self.add(w)

    def mirrors(self, pending: dict) -> bool:
        return self.pending is pending and self.count == len(pending)

    def add(self, w: dict) -> None:
        _, _, kind, order, _ = _pending_view(w)
        bisect.insort(self.kinds.setdefault(kind, []), (order, w["uid"]))
        self.count += 1

    def remove(self, w: dict) -> None:
        _, _, kind, order, _ = _pending_view(w)
        members = self.kinds[kind]
        members.pop(bisect.bisect_left(members, (order, w["uid"])))
        if not members:
            del self.kinds[kind]
        self.count -= 1


_PENDING_INDEXES: dict[str | None, _PendingIndex] = {}


def _pending_index(ctx: Context, state: dict) -> _PendingIndex:
    index = _PENDING_INDEXES.get(ctx.cache_key)
    if ctx.cache_key is None or index is None or not index.mirrors(state["pending"]):
        if len(_PENDING_INDEXES) > 4096:
            _PENDING_INDEXES.clear()
        index = _PENDING_INDEXES[ctx.cache_key] = _PendingIndex(state["pending"])
    return index


def _enqueue(state: dict, ctx: Context, w: dict) -> None:
    index = _PENDING_INDEXES.get(ctx.cache_key)
    in_step = index is not None and index.mirrors(state["pending"])
    replaced = state["pending"].get(w["uid"])
    if replaced is not None and in_step:
        index.remove(replaced)
    state["pending"][w["uid"]] = w
    if in_step:
        index.add(w)


def _dequeue(state: dict, ctx: Context, uid: str) -> dict | None:
    index = _PENDING_INDEXES.get(ctx.cache_key)
    in_step = index is not None and index.mirrors(state["pending"])
    w = state["pending"].pop(uid, None)
    state.get("preemptors", {}).pop(uid, None)
    if w is not None and in_step:
        index.remove(w)
    return w


def _how_many_fit(cq: Any, shape: tuple) -> int:
    """An upper bound of how many workloads of `shape` the queue could admit now: per resource,
    the most any of its flavors has available (borrowing included) over what one asks."""
    need: dict[str, int] = {}
    for _, count, requests, *_ in shape:
        for resource, per_pod in requests:
            need[resource] = need.get(resource, 0) + per_pod * count
    fit = None
    for resource, amount in need.items():
        if amount <= 0:
            continue
        room = max((available(cq.node, (flavor.flavor, resource)) for group in cq.spec.resource_groups
                    for flavor in group.flavors if resource in group.covered_resources), default=0)
        n = max(0, room) // amount
        fit = n if fit is None else min(fit, n)
    return 1 << 30 if fit is None else fit


def _say_pending(state: dict, emit: _Emitter, workload: dict, snapshot: Any, cluster_queue: str | None,
                 reason: str, message: str) -> None:
    """Pending, said only when the reason or message changed: no event storm for a queue that
    did not move (most of a drain's waiting workloads: the check comes first)."""
    uid = workload["uid"]
    said = f"{reason}|{message}"
    if state["said"].get(uid) == said:
        return
    state["said"][uid] = said
    key = snapshot.root_name(cluster_queue) if cluster_queue else workload["cluster_queue"]
    emit.add("qm.workloads", key, WorkloadPending(uid=uid, namespace=workload["namespace"], name=workload["name"],
                                                  cluster_queue=cluster_queue, reason=reason, message=message),
             identity=(uid, said, len(state["admitted"])))


# id(a cohort's nodes) -> (those nodes, per flavor its node names and their GPU capacity). A
# fleet of 1,523 nodes walked for every placement was a tenth of the queue-manager in the Alibaba
# replay. Dropped by the fold whenever it changes the nodes; the nodes themselves are kept, so
# their id is not reused.
_NODES_BY_FLAVOR: dict[int, tuple[dict, dict[str, tuple[list[str], list[int]]]]] = {}


def _nodes_by_flavor(nodes: dict) -> dict[str, tuple[list[str], list[int]]]:
    """flavor -> (its node names, largest name first; their GPU capacity in milli, same order)."""
    hit = _NODES_BY_FLAVOR.get(id(nodes))
    if hit is not None and hit[0] is nodes:
        return hit[1]
    names_by_flavor: dict[str, list[str]] = {}
    for name, spec in nodes.items():
        names_by_flavor.setdefault(spec["flavor"], []).append(name)
    by_flavor = {}
    for flavor, names in names_by_flavor.items():
        names.sort(reverse=True)
        by_flavor[flavor] = (names, [nodes[name]["gpu"] for name in names])
    if len(_NODES_BY_FLAVOR) > 4096:
        _NODES_BY_FLAVOR.clear()
    _NODES_BY_FLAVOR[id(nodes)] = (nodes, by_flavor)
    return by_flavor


def _place(state: dict, node_used: dict[str, int], workload: dict, flavors: dict, counts: dict) -> tuple[list, str]:
    """Quota is not capacity: place every pod on a node of its flavor with enough free GPUs
    (largest free first). Nodes come from node.capacity events; what this cohort already
    placed counts as used. Flavors without known nodes are not checked.
    Returns (placement [(node, gpu milli)], "" ) or ([], the Pending message)."""
    nodes = state.get("nodes") or {}
    if not nodes:
        return [], ""
    free_by_flavor: dict[str, list[int]] = {}  # pod sets of one flavor share its nodes
    placement = []
    for ps in workload["pod_sets"]:
        per_pod = ps["requests"].get(GPU, 0)
        flavor = flavors.get(ps["name"], {}).get(GPU)
        candidates = _nodes_by_flavor(nodes).get(flavor)
        if not per_pod or not candidates:
            continue
        names, capacity = candidates
        free = free_by_flavor.get(flavor)
        if free is None:
            used = node_used.get
            free = free_by_flavor[flavor] = [gpu - used(name, 0) for name, gpu in zip(names, capacity, strict=True)]
        for _ in range(counts.get(ps["name"], ps["count"])):
            # The most free GPUs, the largest name among equals: names run largest first, and
            # index() finds the first. Two passes in C; a max() with a key per node was a tenth
            # of the queue-manager in the Alibaba replay (1,523 nodes).
            most = max(free)
            if most < per_pod:
                return [], f"quota available, but no {flavor} node has {per_pod / 1000:g} free {GPU}"
            best = free.index(most)
            free[best] -= per_pod
            placement.append((names[best], per_pod))
    return placement, ""


def _namespace_limits(state: dict, ctx: Context, namespace: str) -> dict | None:
    """The rule-set borrowingLimits of the ClusterQueues this namespace holds quota in
    (cq -> flavor -> resource -> milli), published with its usage; None without any."""
    limits = state.get("limits")
    if not limits:
        return None
    queues = {e["cluster_queue"] for e in _namespace_entries(state, ctx, namespace)}
    out: dict[str, dict[str, dict[str, int]]] = {}
    for stored, milli in sorted(limits.items()):
        cq, flavor, resource = stored.split("|", 2)
        if cq in queues and milli is not None:
            out.setdefault(cq, {}).setdefault(flavor, {})[resource] = milli
    return out or None


def namespace_usage(admitted: Iterable[dict], namespace: str) -> tuple[dict, dict, dict]:
    """(reserved, running, total) of one namespace's admitted workloads: flavor -> resource -> milli
    for reserved (pods not yet running) and running, resource -> milli for the total."""
    totals = _UsageTotals()
    for entry in admitted:
        if entry["namespace"] == namespace:
            totals.change(entry, +1)
    return totals.view()


class _UsageTotals:
    """One namespace's admitted usage summed by (reserved|running, flavor, resource), with how
    many workloads make up each figure: a figure no workload holds any more disappears, so the
    running sums read exactly as a scan of the workloads would."""

    def __init__(self) -> None:
        self.figures: dict[tuple[str, str, str], list[int]] = {}  # -> [milli, workloads]

    def change(self, entry: dict, sign: int) -> None:
        kind = "running" if entry["running_at"] is not None else "reserved"
        for flavor, by_res in entry["usage"].items():
            for resource, amount in by_res.items():
                figure = self.figures.setdefault((kind, flavor, resource), [0, 0])
                figure[0] += sign * amount
                figure[1] += sign
                if figure[1] == 0:
                    del self.figures[(kind, flavor, resource)]

    def view(self) -> tuple[dict, dict, dict]:
        out: dict[str, dict[str, dict[str, int]]] = {"reserved": {}, "running": {}}
        total: dict[str, int] = {}
        for (kind, flavor, resource), (milli, _) in sorted(self.figures.items()):
            out[kind].setdefault(flavor, {})[resource] = milli
            total[resource] = total.get(resource, 0) + milli
        return out["reserved"], out["running"], dict(sorted(total.items()))


_VICTIM_VIEWS: dict[str, tuple[dict, float | None, dict]] = {}


def _victim_view(entry: dict) -> dict:
    """An admitted workload as a preemption request lists it (ADR 0020): made once per
    reservation, and again once it runs. A busy cohort asks with thousands of these, and
    building them anew for every question was a tenth of the queue-manager in
    kueue-large-scale. The view is shared by the requests that list it, never changed."""
    memo = _VICTIM_VIEWS.get(entry["uid"])
    if memo is not None and memo[0] is entry and memo[1] == entry["running_at"]:
        return memo[2]
    if len(_VICTIM_VIEWS) > 200_000:  # (entries leave on release; this bounds the rest)
        _VICTIM_VIEWS.clear()
    workload = entry["workload"]
    view = {
        "uid": entry["uid"], "namespace": entry["namespace"], "name": entry["name"],
        "cluster_queue": entry["cluster_queue"], "priority": workload["priority"],
        "created_at": workload["created_at"], "labels": workload.get("labels", {}), "usage": entry["usage"],
        "reserved_at": iso(entry["reserved_at"]),
        "running_at": iso(entry["running_at"]) if entry["running_at"] is not None else None,
    }
    _VICTIM_VIEWS[entry["uid"]] = (entry, entry["running_at"], view)
    return view


class _Emitter:
    """Builds output envelopes caused by one input event, with deterministic ids."""

    def __init__(self, cause: Envelope, outputs: list[Output], now: float, ctx: Context) -> None:
        self.cause = cause
        self.outputs = outputs
        self.now = now
        self.ctx = ctx
        self.namespaces_changed: set[str] = set()  # namespaces whose usage this event moved

    def add(self, topic: str, key: str, payload: Any, identity: tuple, *, latest_only: bool = False) -> None:
        envelope = make_envelope(
            payload, producer=PRODUCER, occurred_at=iso(self.now), identity=identity, cause=self.cause
        )
        self.outputs.append(Output(topic, key, envelope, latest_only))

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
            identity=(entry["uid"], entry["reserved_at"], entry.get("attempt", 0), "reserved"),
        )

    def admit_action(self, entry: dict, ctx: Context) -> None:
        node_selector: dict[str, str] = {}
        for by_res in entry["flavors"].values():
            for flavor in by_res.values():
                node_selector.update(ctx.node_labels.get(flavor, {}))
        # Partial admission (minCount): the watcher must run only the pods the quota holds
        counts = entry["counts"]
        partial = any(counts.get(ps["name"], ps["count"]) < ps["count"] for ps in entry["workload"]["pod_sets"])
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
                counts=dict(counts) if partial else None,
            ),
            identity=(entry["uid"], entry["reserved_at"], entry.get("attempt", 0), "admit"),
        )

    def preemption_needed(self, state: dict, workload: dict, decision: Any, cohort_key: str,
                          possible_victim: Callable[[str, int], bool]) -> None:
        """Ask the preemption service, with the cohort's snapshot: the admitted workloads that
        could be victims one by one, the usage of the others summed per ClusterQueue."""
        admitted = []
        others_usage: dict[str, dict[str, dict[str, int]]] = {}
        for e in state["admitted"].values():
            if not possible_victim(e["cluster_queue"], e["workload"]["priority"]):
                by_flavor = others_usage.setdefault(e["cluster_queue"], {})
                for flavor, by_res in e["usage"].items():
                    summed = by_flavor.setdefault(flavor, {})
                    for resource, milli in by_res.items():
                        summed[resource] = summed.get(resource, 0) + milli
                continue
            admitted.append(_victim_view(e))
        admitted.sort(key=lambda view: view["uid"])
        others_usage = {cq: {flavor: dict(sorted(by_res.items())) for flavor, by_res in sorted(by_flavor.items())}
                        for cq, by_flavor in sorted(others_usage.items())}
        preemptor = {k: workload[k] for k in ("uid", "namespace", "name", "priority", "created_at", "pod_sets",
                                              "queue_name")}
        preemptor.update(cluster_queue=decision.cluster_queue, labels=workload.get("labels", {}))
        self.add(
            "qm.preemption",
            cohort_key,
            PreemptionNeeded(preemptor=preemptor, cohort=cohort_key,
                             snapshot={"admitted": admitted, "others_usage": others_usage, "now": iso(self.now),
                                       "kueue_targets": [{"workload": t.workload, "reason": str(t.reason)}
                                                         for t in decision.preempts]},
                             message=decision.message or "preemption needed"),
            # the admitted set's revision stands for the set (it changes with every admit and
            # release, and replays alike): hashing every admitted uid was 2% of the service
            identity=(workload["uid"], state.get("rev", 0), "preemption-needed"),
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
            identity=(entry["uid"], entry["reserved_at"], entry.get("attempt", 0), "released"),
        )

    def usage_changed(self, namespaces: Iterable[str]) -> None:
        """These namespaces' usage moved: `_say_usage` publishes it once the event is folded."""
        self.namespaces_changed.update(namespaces)

    def publish_usage(self, state: dict, namespaces: Iterable[str]) -> None:
        """Per-namespace usage in this cohort, reserved (not yet running) and running, by flavor."""
        for namespace in sorted(namespaces):
            reserved, running, total = _namespace_usage(state, self.ctx, namespace)
            limits = _namespace_limits(state, self.ctx, namespace)
            self.add(
                "qm.usage",
                namespace,
                UsageSnapshot(namespace=namespace, reserved=reserved, running=running, total=total, as_of=iso(self.now),
                              effective_borrowing_limits=limits),
                # an event says a namespace once (ADR 0050): its id and the namespace name the record
                identity=(namespace, self.cause.event_id, "usage"),
                latest_only=True,  # a later change in the same batch supersedes it (ADR 0024)
            )
