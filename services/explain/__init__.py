"""`qm explain`: a workload's trail and the reason it is where it is — pure functions over envelopes.

``explain("ml-team/llm-ft", envelopes)`` reads the events that mention the workload (by
namespace and name, then by its uids), orders them by event time into a timeline, and answers
the field report's troubleshooting table (section 4.4) with a verdict and what to do next:

=========================  ==========================================================
verdict                    when
=========================  ==========================================================
not-found                  no event names the workload
not-in-local-queue         no queue-name label, or its LocalQueue (or that LocalQueue's
                           ClusterQueue) does not exist
awaiting-admission         submitted, no admission decision yet
rejected                   an admission policy denied it (each rule and its message)
namespace-not-allowed      the ClusterQueue's namespaceSelector excludes the namespace
cluster-queue-stopped      the ClusterQueue is inactive (stopPolicy, or a missing flavor)
queued                     validated; the queue-manager has not decided yet
waiting-for-quota          pending for quota; the holders of that quota are listed
no-matching-flavor         no flavor of the ClusterQueue matches its node affinity
reserved-not-running       quota reserved but no pod runs: no node fits (labels, capacity)
prefreeze-expired          the reservation expired without pods ready; requeued
preempted                  evicted by another workload (who, why)
deactivated                will not be retried
running / finished         as it says, with what it has been billed
=========================  ==========================================================
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from services.contracts.codec import Envelope, epoch_of
from services.contracts.events import ActionEvict
from services.core.quantity import format_milli

__all__ = ["Explanation", "Holder", "Step", "Verdict", "explain", "quota_holders"]

GPU = "nvidia.com/gpu"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class Verdict(StrEnum):
    NOT_FOUND = "not-found"
    NOT_IN_LOCAL_QUEUE = "not-in-local-queue"
    AWAITING_ADMISSION = "awaiting-admission"
    REJECTED = "rejected"
    NAMESPACE_NOT_ALLOWED = "namespace-not-allowed"
    CLUSTER_QUEUE_STOPPED = "cluster-queue-stopped"
    QUEUED = "queued"
    WAITING_FOR_QUOTA = "waiting-for-quota"
    NO_MATCHING_FLAVOR = "no-matching-flavor"
    RESERVED_NOT_RUNNING = "reserved-not-running"
    PREFREEZE_EXPIRED = "prefreeze-expired"
    PREEMPTED = "preempted"
    DEACTIVATED = "deactivated"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class Step:
    at: str
    what: str
    detail: str
    event_type: str
    producer: str
    event_id: str


@dataclass(frozen=True, slots=True)
class Holder:
    """A workload holding quota in the same ClusterQueue or cohort."""

    workload: str
    uid: str
    cluster_queue: str
    usage: dict  # flavor -> resource -> milli
    reserved_at: str
    running: bool
    same_cluster_queue: bool
    borrowing: bool = False  # its reservation used quota beyond its ClusterQueue's nominal

    @property
    def gpu_milli(self) -> int:
        return sum(by_res.get(GPU, 0) for by_res in self.usage.values())


@dataclass(frozen=True, slots=True)
class Explanation:
    workload: str
    uids: tuple[str, ...]
    timeline: list[Step]
    verdict: Verdict
    answer: str
    next_steps: list[str] = field(default_factory=list)
    holders: list[Holder] = field(default_factory=list)
    billed: dict[str, Any] = field(default_factory=dict)
    cluster_queue: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = str(self.verdict)
        data["uids"] = list(self.uids)
        for holder, original in zip(data["holders"], self.holders, strict=True):
            holder["gpu"] = format_milli(original.gpu_milli, GPU)
        return data


# --------------------------------------------------------------------------- matching


def _mentions(envelope: Envelope, namespace: str, name: str, uids: set[str]) -> bool:
    p = envelope.payload
    t = envelope.event_type
    if t == "billing.ledger_row.v1":
        return p.ResourceId in uids
    if t == "preemption.needed.v1":
        pre = p.preemptor or {}
        return pre.get("uid") in uids or (pre.get("namespace") == namespace and pre.get("name") == name)
    if t == "preemption.victims_selected.v1":
        return p.preemptor_uid in uids or any(
            v.get("uid") in uids or (v.get("namespace") == namespace and v.get("name") == name) for v in p.victims
        )
    if t == "action.outcome.v1":
        return p.workload_uid in uids
    ns = getattr(p, "namespace", None)
    if ns != namespace:
        return False
    if getattr(p, "workload_uid", None) in uids or getattr(p, "uid", None) in uids:
        return True
    return getattr(p, "name", None) == name or getattr(p, "workload_name", None) == name


def _uids(envelopes: Sequence[Envelope], namespace: str, name: str) -> set[str]:
    uids: set[str] = set()
    for e in envelopes:
        p = e.payload
        if getattr(p, "namespace", None) != namespace:
            continue
        if getattr(p, "name", None) == name and hasattr(p, "uid") and not e.event_type.startswith("pod."):
            uids.add(p.uid)
        elif getattr(p, "name", None) == name and hasattr(p, "workload_uid"):
            uids.add(p.workload_uid)
        elif getattr(p, "workload_name", None) == name and hasattr(p, "workload_uid"):
            uids.add(p.workload_uid)
    return uids


def _ts(envelope: Envelope) -> float:
    try:
        return epoch_of(envelope.occurred_at)
    except ValueError:
        return 0.0


# At equal event times, the order in which one thing causes the next (the queue-manager stamps
# a reservation and its admit with the same time; a rekeyed event keeps its source's time).
_RANK = {t: i for i, t in enumerate((
    "namespace.labels.v1", "node.capacity.v1", "clock.tick.v1", "cluster.signals.v1", "quota.limits_changed.v1",
    "workload.submitted.v1", "workload.validated.v1",
    "workload.rejected.v1", "workload.pending.v1", "preemption.needed.v1", "preemption.victims_selected.v1",
    "action.evict.v1", "workload.evicted.v1", "workload.quota_reserved.v1", "action.admit.v1", "action.outcome.v1",
    "pod.running.v1", "workload.running.v1", "workload.prefreeze_expired.v1", "workload.released.v1",
    "workload.requeued.v1", "workload.deactivated.v1", "pod.finished.v1", "workload.finished.v1",
))}


def _ordered(envelopes: Iterable[Envelope]) -> list[Envelope]:
    indexed = list(enumerate(envelopes))
    indexed.sort(key=lambda item: (_ts(item[1]), _RANK.get(item[1].event_type, len(_RANK)), item[0]))
    seen: set[str] = set()
    out = []
    for _, e in indexed:
        if e.event_id in seen:
            continue  # at-least-once delivery: the same event twice is one event
        seen.add(e.event_id)
        out.append(e)
    return out


# --------------------------------------------------------------------------- wording


def _gpus(usage: dict) -> str:
    milli = sum(by_res.get(GPU, 0) for by_res in usage.values())
    return f"{format_milli(milli, GPU)} GPU"


def _requests(pod_sets: list) -> str:
    total: dict[str, int] = {}
    for ps in pod_sets or []:
        for res, milli in (ps.get("requests") or {}).items():
            total[res] = total.get(res, 0) + milli * ps.get("count", 1)
    parts = [f"{format_milli(v, r)} {'GPU' if r == GPU else r}" for r, v in sorted(total.items(), key=lambda i: i[0] != GPU)]
    return ", ".join(parts)


def _flavors(usage: dict) -> str:
    return ", ".join(sorted(usage)) or "-"


def _describe(e: Envelope, names: dict[str, str]) -> tuple[str, str]:
    p = e.payload
    t = e.event_type
    if t == "workload.submitted.v1":
        queue = p.queue_name or (p.labels or {}).get(QUEUE_LABEL)
        return "submitted", f"{p.kind} asking {_requests(p.pod_sets)}; queue {queue or '(none: no queue-name label)'}"
    if t == "workload.validated.v1":
        warn = f"; warnings: {'; '.join(p.warnings)}" if p.warnings else ""
        refused = sorted({f for ps in p.pod_sets for f in ps.get("refused_flavors") or {}})
        kept_off = f"; kept off flavor(s) {', '.join(refused)} by its policies (ADR 0070)" if refused else ""
        return "validated", (f"admission allowed it into ClusterQueue {p.cluster_queue} (LocalQueue {p.queue_name})"
                             f"{kept_off}{warn}")
    if t == "workload.rejected.v1":
        rules = ", ".join(v.get("policy", "?") for v in p.violations) or "?"
        return "rejected", f"by {rules}: {p.message}"
    if t == "workload.pending.v1":
        return "pending", f"{p.reason}: {p.message}"
    if t == "workload.quota_reserved.v1":
        borrowing = " (borrowing from the cohort)" if p.borrowing else ""
        return "reserved", f"{_gpus(p.usage)} on {_flavors(p.usage)} in {p.cluster_queue}{borrowing}"
    if t == "action.admit.v1":
        sel = ", ".join(f"{k}={v}" for k, v in sorted((p.node_selector or {}).items()))
        return "admit sent", f"unsuspend, pinned to nodes {sel or '(any)'}"
    if t == "pod.running.v1":
        return "pod running", f"{p.name} on {p.node or '?'}"
    if t == "workload.running.v1":
        return "running", "its first pod runs"  # admission derives it from each pod.running; the first counts
    if t == "pod.finished.v1":
        return "pod finished", f"{p.name} {p.phase}"
    if t == "workload.prefreeze_expired.v1":
        return "pre-freeze expired", (
            f"held {_gpus(p.usage)} idle for {p.idle_s:.0f} s without pods ready (expiry {p.expiries or 1})"
        )
    if t == "workload.requeued.v1":
        return "requeued", f"{p.reason}; retry at {p.requeue_at} (attempt {p.attempt})"
    if t == "workload.released.v1":
        return "released", f"{_gpus(p.usage)} on {_flavors(p.usage)} ({p.reason})"
    if t == "preemption.needed.v1":
        return "preemption needed", p.message or f"cohort {p.cohort}"
    if t == "preemption.victims_selected.v1":
        who = names.get(p.preemptor_uid, p.preemptor_uid)
        if p.blocked_message and not p.victims:
            return "preemption blocked", p.blocked_message
        victims = ", ".join(f"{v.get('namespace')}/{v.get('name')}" for v in p.victims)
        return "victims selected", f"for {who}: {victims}"
    if t == "workload.evicted.v1":
        by = f" by {names.get(p.preemptor, p.preemptor)}" if p.preemptor else ""
        grace = f", {p.grace_period_s} s grace" if p.grace_period_s is not None else ""
        return "evicted", f"{p.reason}{by}{grace}"
    if t == "action.evict.v1":
        return "evict sent", f"{p.reason}, {p.grace_period_s} s grace"
    if t == "action.cleanup.v1":
        return "cleanup sent", p.reason
    if t == "action.outcome.v1":
        return f"{p.action} {p.outcome}", p.message or ""
    if t == "workload.finished.v1":
        return "finished", "succeeded" if p.succeeded else "failed or deleted"
    if t == "workload.deactivated.v1":
        return "deactivated", f"{p.reason}: {p.message}"
    if t == "quota.limits_changed.v1":
        return "borrowing limit changed", p.message
    if t == "billing.ledger_row.v1":
        return "billed", f"{p.x_UsageKind} {p.ConsumedQuantity} {p.ConsumedUnit} = {p.BilledCost} {p.BillingCurrency}"
    return t, ""


# --------------------------------------------------------------------------- quota holders


def _holdings(envelopes: Iterable[Envelope]) -> tuple[dict[str, tuple[Any, str]], set[str], dict[str, str]]:
    """One pass over the trail: uid -> (its latest reservation, when) for each workload that still
    holds quota at the end, the uids whose pods run, and ClusterQueue -> cohort."""
    held: dict[str, tuple[Any, str]] = {}
    running: set[str] = set()
    cohort_of_cq: dict[str, str] = {}
    for e in _ordered(envelopes):
        p = e.payload
        t = e.event_type
        if t == "workload.quota_reserved.v1":
            held[p.uid] = (p, e.occurred_at)
            running.discard(p.uid)
            if p.cohort:
                cohort_of_cq[p.cluster_queue] = p.cohort
        elif t in ("workload.released.v1", "workload.finished.v1", "workload.prefreeze_expired.v1",
                   "workload.deactivated.v1"):
            held.pop(p.uid, None)
            running.discard(p.uid)
        elif t == "workload.evicted.v1":
            held.pop(p.uid, None)
            running.discard(p.uid)
        elif t == "workload.running.v1":
            running.add(p.uid)
        elif t == "pod.running.v1":
            running.add(p.workload_uid)
    return held, running, cohort_of_cq


def holders_by_cluster_queue(envelopes: Iterable[Envelope]) -> dict[str, list[Holder]]:
    """Every ClusterQueue's own quota holders at the end of the trail, in one pass (`qm status`
    asked quota_holders once per queue, each a pass: over 15 minutes for 1,000 queues)."""
    held, running, _ = _holdings(envelopes)
    out: dict[str, list[Holder]] = {}
    for uid, (p, _at) in held.items():
        out.setdefault(p.cluster_queue, []).append(_holder(uid, p, uid in running, True))
    return out


def _holder(uid: str, reservation: Any, running: bool, same_cluster_queue: bool) -> Holder:
    p = reservation
    return Holder(f"{p.namespace}/{p.name}", uid, p.cluster_queue, p.usage, p.reserved_at, running,
                  same_cluster_queue, bool(p.borrowing))


def quota_holders(
    envelopes: Iterable[Envelope], *, cluster_queue: str | None, cohort: str | None = None, exclude: Iterable[str] = ()
) -> list[Holder]:
    """Workloads that hold quota at the end of the trail in ``cluster_queue`` or its cohort:
    the latest reservation of each uid not followed by a release, a finish or an eviction.
    Largest GPU holders first; those in the same ClusterQueue before borrowers from the cohort."""
    excluded = set(exclude)
    held, running, cohort_of_cq = _holdings(envelopes)
    if cohort is None and cluster_queue is not None:
        cohort = cohort_of_cq.get(cluster_queue)
    out = []
    for uid, (p, _at) in held.items():
        if uid in excluded:
            continue
        same = p.cluster_queue == cluster_queue
        in_cohort = cohort is not None and (p.cohort == cohort or cohort_of_cq.get(p.cluster_queue) == cohort)
        if not (same or in_cohort):
            continue
        out.append(_holder(uid, p, uid in running, same))
    out.sort(key=lambda h: (not h.same_cluster_queue, -h.gpu_milli, h.reserved_at, h.workload))
    return out


# --------------------------------------------------------------------------- the answer


def _billed(trail: Sequence[Envelope]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for e in trail:
        if e.event_type == "billing.ledger_row.v1":
            rows[e.payload.row_id] = e.payload  # a later revision of the same row replaces it
    if not rows:
        return {}
    by_kind: dict[str, dict[str, float]] = {}
    currency = ""
    for row in rows.values():
        kind = by_kind.setdefault(row.x_UsageKind, {"gpu_hours": 0.0, "cost": 0.0})
        kind["gpu_hours"] += float(row.x_GpuHours or (row.ConsumedQuantity if row.ConsumedUnit == "GPU-Hours" else 0))
        kind["cost"] += float(row.BilledCost)
        currency = row.BillingCurrency
    total = sum(k["cost"] for k in by_kind.values())
    return {
        "rows": len(rows),
        "currency": currency,
        "cost": round(total, 6),
        "gpu_hours": round(sum(k["gpu_hours"] for k in by_kind.values()), 6),
        "by_kind": {k: {kk: round(vv, 6) for kk, vv in v.items()} for k, v in sorted(by_kind.items())},
    }


def _last(trail: Sequence[Envelope], *types: str,
          unless: Callable[[Envelope], bool] | None = None) -> tuple[int, Envelope | None]:
    for index in range(len(trail) - 1, -1, -1):
        if trail[index].event_type in types and not (unless is not None and unless(trail[index])):
            return index, trail[index]
    return -1, None


#: The flavor assigner's words for a request no resourceGroup of the ClusterQueue covers.
_UNCOVERED = re.compile(r"resource (\S+) unavailable in ClusterQueue")

#: The reasons of the Evicts the queue-manager (and, for a Job in no LocalQueue, admission) sends
#: itself (ADR 0062, 0065): an expired reservation's Job, and a Job found running before it was
#: admitted. Neither is a preemption.
_QUEUE_MANAGER_STOPS = frozenset({ActionEvict.PODS_READY_TIMEOUT, ActionEvict.NOT_ADMITTED})


#: Verdicts under which nothing will admit the workload as it is (ADR 0065): a NotAdmitted stop
#: of its Job then lasts.
_NEVER_ADMITTED = frozenset({Verdict.REJECTED, Verdict.NOT_IN_LOCAL_QUEUE})
_STOPPED_FOR_GOOD = (
    " Its Job ran anyway and was stopped (NotAdmitted): it stays stopped, since nothing admits it as it is.",
    "do not unsuspend it by hand; where Jobs start unsuspended, install the mutating webhook "
    "(deploy/kubernetes/admission-webhook.yaml) so they wait suspended",
)


def _is_queue_managers_stop(e: Envelope) -> bool:
    return e.event_type == "action.evict.v1" and e.payload.reason in _QUEUE_MANAGER_STOPS


def _last_stop(trail: Sequence[Envelope], reason: str) -> int:
    """Where the queue-manager last stopped the Job for `reason` (-1: never)."""
    return _last(trail, "action.evict.v1", unless=lambda e: e.payload.reason != reason)[0]


def _holders_text(holders: Sequence[Holder], limit: int = 5) -> str:
    if not holders:
        return "no reservation in the trail holds it (usage may come from workloads admitted before the trail starts)"
    parts = []
    for h in holders[:limit]:
        state = "running" if h.running else "reserved, NOT running"
        # Another ClusterQueue of the cohort holds nominal quota of its own unless it borrowed.
        where = " (borrowing from the cohort)" if h.borrowing else ""
        if not h.same_cluster_queue:
            where = f" (in {h.cluster_queue}{', borrowing from the cohort' if h.borrowing else ''})"
        parts.append(f"{h.workload} {format_milli(h.gpu_milli, GPU)} GPU on {_flavors(h.usage)} since {h.reserved_at}, "
                     f"{state}{where}")
    more = f"; and {len(holders) - limit} more" if len(holders) > limit else ""
    return "; ".join(parts) + more


_REFUSED_FLAVOR = re.compile(r"flavor (\S+) refused by policy")


_UNTOLERATED = re.compile(r"untolerated taint (\S+) in flavor (\S+?)(?:,|$)")


def _taint_steps(message: str) -> list[str]:
    """What to do about flavors whose nodeTaints the pods do not tolerate (ADR 0072)."""
    return [f"or tolerate flavor {flavor}'s taint {taint} in the Job's pod template (its nodes are kept for "
            "workloads that do)" for taint, flavor in sorted(set(_UNTOLERATED.findall(message)))]


def _policy_refusal_steps(message: str) -> list[str]:
    """What to do about flavors the admission policies keep a workload off (ADR 0070)."""
    refused = sorted(set(_REFUSED_FLAVOR.findall(message)))
    if not refused:
        return []
    return [f"its policies keep it off flavor(s) {', '.join(refused)}, so it waits for the others: do what the "
            "policy's message asks (an approval label on the namespace, say) to have them too"]


def explain(workload_key: str, envelopes: Iterable[Envelope]) -> Explanation:
    """The trail of ``<namespace>/<name>`` in ``envelopes`` (any topics, any order) and the reason
    it is where it is."""
    namespace, _, name = workload_key.partition("/")
    if not name:
        raise ValueError(f"{workload_key!r}: expected <namespace>/<name>")
    every = _ordered(e for e in envelopes if isinstance(e, Envelope))
    uids = _uids(every, namespace, name)
    trail = [e for e in every if _mentions(e, namespace, name, uids)]
    names = {uid: workload_key for uid in uids}
    for e in every:
        p = e.payload
        if hasattr(p, "uid") and hasattr(p, "namespace") and hasattr(p, "name") and not e.event_type.startswith("pod."):
            names.setdefault(p.uid, f"{p.namespace}/{p.name}")
    billed = _billed(trail)
    timeline = [Step(e.occurred_at, *_describe(e, names), e.event_type, e.producer, e.event_id) for e in trail]

    # (sentence, next step) said after any verdict while a NotAdmitted stop is the latest news
    stopped_unadmitted: tuple[str, str] | None = None

    def result(verdict: Verdict, answer: str, steps: list[str], holders: list[Holder] | None = None,
               cq: str | None = None) -> Explanation:
        if stopped_unadmitted is not None:
            sentence, step = _STOPPED_FOR_GOOD if verdict in _NEVER_ADMITTED else stopped_unadmitted
            answer, steps = answer + sentence, [*steps, step]
        return Explanation(workload_key, tuple(sorted(uids)), timeline, verdict, answer, steps, holders or [], billed, cq)

    lifecycle = [e for e in trail if not e.event_type.startswith(("billing.", "action.outcome"))]
    if not lifecycle:
        return result(
            Verdict.NOT_FOUND,
            f"No event on the bus names {workload_key}.",
            [
                "check the namespace and name (kubectl get jobs,workloads -n " + namespace + ")",
                f"check that the Job carries the label {QUEUE_LABEL}: without it Kueue and Quartermaster ignore it",
                "check that the watcher is running and publishing to this topic prefix",
            ],
        )

    _, submitted = _last(trail, "workload.submitted.v1")
    _, validated = _last(trail, "workload.validated.v1")
    cq = validated.payload.cluster_queue if validated else None
    cohort = validated.payload.cohort if validated else None
    i_reserved, reserved = _last(trail, "workload.quota_reserved.v1")
    if reserved is not None:
        cq = reserved.payload.cluster_queue
        cohort = reserved.payload.cohort or cohort
    i_pending, pending = _last(trail, "workload.pending.v1")
    if pending is not None and pending.payload.cluster_queue:
        cq = cq or pending.payload.cluster_queue
    # The queue's borrowingLimit moves with QuotaRules: those changes belong in its story.
    limit_changes = [e for e in every if e.event_type == "quota.limits_changed.v1" and e.payload.cluster_queue == cq]
    timeline = [Step(e.occurred_at, *_describe(e, names), e.event_type, e.producer, e.event_id)
                for e in _ordered([*trail, *limit_changes])]
    i_finished, finished = _last(trail, "workload.finished.v1")
    i_deact, deactivated = _last(trail, "workload.deactivated.v1")
    i_rejected, rejected = _last(trail, "workload.rejected.v1")
    i_validated, _ = _last(trail, "workload.validated.v1")
    i_evicted, evicted = _last(trail, "workload.evicted.v1", "action.evict.v1", unless=_is_queue_managers_stop)
    i_expired, expired = _last(trail, "workload.prefreeze_expired.v1")
    i_stopped = _last_stop(trail, ActionEvict.PODS_READY_TIMEOUT)
    if _last_stop(trail, ActionEvict.NOT_ADMITTED) > i_reserved:
        stopped_unadmitted = (
            " Its Job ran before the queue admitted it and was stopped (NotAdmitted): it runs once admitted.",
            "do not unsuspend a queued Job by hand; where Jobs start unsuspended, install the mutating webhook "
            "(deploy/kubernetes/admission-webhook.yaml) so they wait suspended",
        )
    i_running, _ = _last(trail, "workload.running.v1", "pod.running.v1")
    i_pod_end, _ = _last(trail, "pod.finished.v1")
    i_admit, admit = _last(trail, "action.admit.v1")
    latest = max(i_pending, i_reserved, i_validated)
    gpu_hours = f" Billed so far: {billed['gpu_hours']:g} GPU-hours, {billed['cost']:g} {billed['currency']}." if billed else ""

    if finished is not None and i_finished >= latest:
        how = "succeeded" if finished.payload.succeeded else "failed or was deleted"
        return result(Verdict.FINISHED, f"{workload_key} {how} at {finished.payload.finished_at}.{gpu_hours}",
                      ["qm billing export --cost-center <its cost center> for the ledger rows"] if billed else [], cq=cq)
    if deactivated is not None and i_deact >= latest:
        p = deactivated.payload
        return result(Verdict.DEACTIVATED, f"{workload_key} was deactivated ({p.reason}): {p.message}.{gpu_hours}",
                      ["fix what kept its pods from starting (image, node selector, resources), then delete and "
                       "resubmit the Job"], cq=cq)
    if rejected is not None and i_rejected > i_validated:
        p = rejected.payload
        rules = [v for v in p.violations if v.get("enforcement_action", "deny") == "deny"] or p.violations
        lines = "; ".join(f"policy {v.get('policy')}: {v.get('message')}" for v in rules)
        return result(
            Verdict.REJECTED,
            f"{workload_key} was rejected by admission policy — {lines}.",
            [
                "change the request so the rule holds (the message names the limit), or ask the policy owner "
                "for an exception",
                f"`qm policy test` / `qm policy what-if` show how {', '.join(str(v.get('policy')) for v in rules)} "
                "decides",
            ],
        )
    if evicted is not None and i_evicted > i_reserved and i_evicted > i_finished:
        p = evicted.payload
        by = getattr(p, "preemptor", None)
        who = names.get(by, by) if by else None
        grace = getattr(p, "grace_period_s", None)
        answer = f"{workload_key} was preempted" + (f" by {who}" if who else "") + f" ({p.reason})"
        answer += f" with {grace} s to checkpoint." if grace is not None else "."
        if pending is not None and i_pending > i_evicted:
            answer += f" It is queued again: {pending.payload.message}."
        steps = ["it is requeued and resumes when quota frees up; make sure it checkpoints within the grace period"]
        if who:
            steps.append(f"`qm explain {who}` shows the preemptor; the preemption policy decides who may preempt whom")
        return result(Verdict.PREEMPTED, answer + gpu_hours, steps, cq=cq)
    if expired is not None and i_expired > i_running and i_expired >= i_reserved:
        p = expired.payload
        _, requeued = _last(trail, "workload.requeued.v1")
        retry = f" It was requeued; next try at {requeued.payload.requeue_at}." if requeued else ""
        order_at = requeued.payload.queue_order_at if requeued else None
        if order_at and order_at >= p.expired_at:  # ordered by the expiry, not its creation (ADR 0074)
            retry = (f" It was requeued behind the workloads queued before {order_at} (Kueue's requeuing by "
                     f"eviction time); next try at {requeued.payload.requeue_at}.")
        if i_stopped > i_reserved:  # (at the expiry's own time, in either order)
            retry = " Its Job was stopped, so pods that start late do not run on released quota." + retry
        return result(
            Verdict.PREFREEZE_EXPIRED,
            f"Quota was reserved (pre-frozen) for {workload_key} but its pods were not ready within the timeout: "
            f"{_gpus(p.usage)} sat idle {p.idle_s:.0f} s (billed as reserved-idle) and the reservation was released "
            f"(expiry {p.expiries or 1}).{retry}{gpu_hours}",
            [
                "quota and nodes are two systems: the reservation fit the quota but no node ran the pods — check "
                "`kubectl describe pod` events (Insufficient nvidia.com/gpu, node selector, taints, image pull)",
                "compare the flavor's nodeLabels with the labels and allocatable GPUs of the nodes",
                "after repeated expiries the workload is deactivated",
            ],
            cq=cq,
        )
    if reserved is not None and i_reserved >= max(i_pending, i_evicted):
        p = reserved.payload
        if i_running > i_reserved and i_pod_end < i_running:
            return result(Verdict.RUNNING, f"{workload_key} is running on {_flavors(p.usage)} in {p.cluster_queue} "
                          f"({_gpus(p.usage)}).{gpu_hours}", [], cq=cq)
        selector = ""
        if admit is not None and i_admit > i_reserved:
            selector = ", ".join(f"{k}={v}" for k, v in sorted((admit.payload.node_selector or {}).items()))
        return result(
            Verdict.RESERVED_NOT_RUNNING,
            f"Quota is reserved for {workload_key} ({_gpus(p.usage)} on {_flavors(p.usage)} in {p.cluster_queue} since "
            f"{p.reserved_at}) but no pod runs yet. Quota available is not a node that fits: "
            + ("the admit was sent" + (f" pinning it to {selector}" if selector else "") + "."
               if admit is not None and i_admit > i_reserved else "no admit action was seen yet."),
            [
                "check `kubectl describe pod` events for FailedScheduling (no node with free GPUs carries the "
                "flavor's labels, taints, or the image does not pull)",
                "check node allocatable for the flavor; the reservation is billed as idle until pods run and "
                "expires after podsReadyTimeout",
            ],
            cq=cq,
        )
    if pending is not None and i_pending >= max(i_validated, i_reserved):
        p = pending.payload
        reason, message = p.reason, p.message
        if reason == "Inadmissible" and "is inactive" in message:
            return result(
                Verdict.CLUSTER_QUEUE_STOPPED,
                f"{workload_key} does not queue: {message}. A stopped ClusterQueue (spec.stopPolicy Hold or "
                "HoldAndDrain) or one whose ResourceFlavor is missing admits nothing.",
                [
                    f"kubectl get clusterqueue {p.cluster_queue or cq or '<cq>'} -o yaml: check spec.stopPolicy and "
                    "status.conditions",
                    "create the ResourceFlavors its resourceGroups name, or set stopPolicy: None",
                ],
                cq=p.cluster_queue or cq,
            )
        if reason == "Inadmissible" or "LocalQueue" in message and "doesn't exist" in message:
            return result(
                Verdict.NOT_IN_LOCAL_QUEUE,
                f"{workload_key} is not in any LocalQueue: {message}. Nothing will ever admit it as it is.",
                [
                    f"set the label {QUEUE_LABEL}: <LocalQueue> on the Job (kubectl get localqueues -n {namespace})",
                    "or create the LocalQueue in the namespace, pointing at an existing ClusterQueue",
                ],
            )
        if reason == "NamespaceMismatch":
            return result(
                Verdict.NAMESPACE_NOT_ALLOWED,
                f"{workload_key} waits: {message}.",
                [f"the ClusterQueue's namespaceSelector must match namespace {namespace}'s labels"],
                cq=p.cluster_queue or cq,
            )
        uncovered = _UNCOVERED.search(message) if reason == "NoMatchingFlavor" else None
        if uncovered is not None:
            resource, queue = uncovered.group(1), p.cluster_queue or cq or "<cq>"
            return result(
                Verdict.NO_MATCHING_FLAVOR,
                f"{workload_key} waits: {message}. It requests {resource}, which no resourceGroup of ClusterQueue "
                f"{queue} covers, so no flavor can be assigned to it whatever is free (Kueue decides the same).",
                [f"add {resource} to a resourceGroup's coveredResources in ClusterQueue {queue}, with a nominalQuota "
                 "for each of its flavors (`qm config check` validates the change)",
                 f"or drop the {resource} request from the Job's containers"],
                cq=p.cluster_queue or cq,
            )
        if reason == "NoMatchingFlavor":
            return result(
                Verdict.NO_MATCHING_FLAVOR,
                f"{workload_key} waits: {message}. No flavor of the ClusterQueue matches the workload's node "
                "selector/affinity, so quota cannot be assigned whatever is free.",
                ["align the Job's nodeSelector (or required node affinity) with a ResourceFlavor's nodeLabels, or "
                 "add that flavor to the ClusterQueue", *_taint_steps(message), *_policy_refusal_steps(message)],
                cq=p.cluster_queue or cq,
            )
        queue = p.cluster_queue or cq
        holders = quota_holders(every, cluster_queue=queue, cohort=cohort, exclude=uids)
        idle = [h for h in holders if not h.running]
        steps = []
        if idle:
            steps.append(
                f"{len(idle)} holder(s) reserve quota without running ({', '.join(h.workload for h in idle[:3])}): "
                "zombie or stuck jobs — clean them up or set a TTL; their reservations expire after podsReadyTimeout"
            )
        steps += _policy_refusal_steps(message)
        if reason == "ExceedsMaxQuota":
            steps.append("the request is larger than the ClusterQueue can ever give (nominal + borrowing): "
                         "make it smaller or raise the quota")
        else:
            steps.append("it is admitted when the holders finish or release; a higher priority, or a preemption "
                         "policy that allows it, lets it in sooner")
            steps.append("if GPUs look idle while this waits: quota and node capacity are two systems — compare the "
                         "ClusterQueue's quota with node allocatable (`qm status`)")
        dynamic = ""
        if limit_changes:
            last_change = limit_changes[-1].payload
            dynamic = f" Dynamic quota (since {last_change.changed_at}): {last_change.message}."
            steps.append("the QuotaRule behind it re-decides at every clock tick from the cluster's live figures "
                         "(`qm config` shows its rules)")
        return result(
            Verdict.WAITING_FOR_QUOTA,
            f"{workload_key} is pending in ClusterQueue {queue}: {reason}: {message}. Quota is held by: "
            f"{_holders_text(holders)}.{dynamic}",
            steps,
            holders,
            cq=queue,
        )
    if validated is not None:
        return result(
            Verdict.QUEUED,
            f"{workload_key} was validated into ClusterQueue {cq}; the queue-manager has not published a decision yet.",
            ["check that the queue-manager is running (its /queues page lists pending and admitted workloads)"],
            cq=cq,
        )
    if submitted is not None:
        p = submitted.payload
        if not (p.queue_name or (p.labels or {}).get(QUEUE_LABEL)):
            return result(
                Verdict.NOT_IN_LOCAL_QUEUE,
                f"{workload_key} has no {QUEUE_LABEL} label, so it is not in any LocalQueue and nothing will admit it.",
                [f"add the label {QUEUE_LABEL}: <LocalQueue> (kubectl get localqueues -n {namespace})"],
            )
        return result(
            Verdict.AWAITING_ADMISSION,
            f"{workload_key} was submitted to LocalQueue {p.queue_name} at {p.created_at}; admission has not judged "
            "it yet.",
            ["check that the admission service is running and consuming qm.cluster"],
        )
    return result(Verdict.NOT_FOUND, f"Only actions or pods mention {workload_key}; its lifecycle events are missing.",
                  ["check that the watcher and the queue-manager publish to this topic prefix"])
