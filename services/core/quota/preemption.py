"""Preemption: who may be preempted, and the minimal set of victims, as Kueue decides.

Candidates (Kueue's ``findCandidates``):

* in the preemptor's ClusterQueue, by ``withinClusterQueue``: ``LowerPriority`` (strictly
  lower), ``LowerOrNewerEqualPriority`` (also equal priority but queued later);
* in other ClusterQueues of the same cohort tree that are *borrowing* the flavor-resources
  that need preemption, by ``reclaimWithinCohort``: ``LowerPriority`` or ``Any``.

Candidates are ordered (evicted first, other ClusterQueues first, lower priority first, most
recently admitted first, then by uid/key) and removed one by one until the preemptor fits;
then added back in reverse order while it still fits (``minimalPreemptions``).
``borrowWithinCohort`` lets a preemptor borrow while reclaiming from workloads below its
threshold. With fair sharing, victims come from the ClusterQueues with the highest dominant
resource share, subject to the configured strategies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.core.frozen import quick_init
from services.core.quota.fairsharing import dominant_resource_share, strategy_allows
from services.core.quota.model import FlavorResource, PreemptionPolicy, PreemptionReason, PreemptionTarget
from services.core.quota.snapshot import AdmittedWorkload, ClusterQueueState, Snapshot
from services.core.quota.tree import available, borrowing


@quick_init
@dataclass(frozen=True, slots=True)
class Preemptor:
    """What preemption needs to know about the workload that wants room."""

    key: str
    cluster_queue: str
    priority: int
    queued_at: float
    # Quartermaster's PreemptionPolicy: candidates it protects are never considered, so the
    # minimal victim set is searched among allowed candidates only. None: Kueue's rules alone.
    may_preempt: Callable[[AdmittedWorkload], bool] | None = None


def _uses(wl: AdmittedWorkload, frs: set[FlavorResource]) -> bool:
    return any(fr in frs for fr, _ in wl.usage)


def _cq_is_borrowing(cq: ClusterQueueState, frs: set[FlavorResource]) -> bool:
    node = cq.node
    if node.parent is None:
        return False
    usage, subtree = node.usage, node.subtree
    for fr in frs:  # tree.borrowing, inlined: asked once per candidate of every victim search
        if usage.get(fr, 0) > subtree.get(fr, 0):
            return True
    return False


def _own_candidates(
    preemptor: Preemptor, cq: ClusterQueueState, frs: set[FlavorResource]
) -> list[AdmittedWorkload]:
    """Candidates within the preemptor's ClusterQueue (withinClusterQueue)."""
    candidates: list[AdmittedWorkload] = []
    policy = cq.spec.preemption
    if policy.within_cluster_queue is not PreemptionPolicy.NEVER:
        same_prio = policy.within_cluster_queue is PreemptionPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
        for cand in cq.workloads.values():
            if cand.priority > preemptor.priority:
                continue
            if cand.priority == preemptor.priority and not (
                same_prio and preemptor.queued_at < cand.created_at
            ):
                continue
            if _uses(cand, frs):
                candidates.append(cand)
    return candidates


def _ranked_reclaim_candidates(
    snapshot: Snapshot, preemptor: Preemptor, cq: ClusterQueueState, frs: set[FlavorResource], now: float
) -> list[AdmittedWorkload]:
    """Candidates in the borrowing ClusterQueues of the preemptor's cohort tree (its own
    included), sorted by :func:`_rank`. Only for a ClusterQueue in a cohort that may reclaim
    (ordered_candidates checks).

    They depend only on the tree's admitted set (and, for LowerPriority, the preemptor's
    priority): memoised per tree fingerprint (see Snapshot.tree_cache), sorted once instead
    of per nomination (a cohort's hundreds of candidates sorted with a key function were
    two thirds of bench-core's reclaim-any pass)."""
    only_lower = cq.spec.preemption.reclaim_within_cohort is not PreemptionPolicy.ANY
    cache = snapshot.tree_cache(cq.root_key)
    ckey = ("reclaim", frozenset(frs), preemptor.priority if only_lower else None, now)
    ranked = cache.get(ckey)
    if ranked is None:
        ranked = []
        for other in snapshot.tree_members(cq):
            if not _cq_is_borrowing(other, frs):
                continue
            ranked.extend(
                cand
                for cand in other.workloads.values()
                if not (only_lower and cand.priority >= preemptor.priority) and _uses(cand, frs)
            )
        ranked.sort(key=_rank(now))
        cache[ckey] = ranked
    return ranked  # type: ignore[return-value]


def ordered_candidates(
    snapshot: Snapshot, preemptor: Preemptor, cq: ClusterQueueState, frs: set[FlavorResource], now: float,
    cohort: bool = True,
) -> list[AdmittedWorkload]:
    """Every candidate victim, in Kueue's preemption order: workloads already evicted first,
    then other ClusterQueues' before the preemptor's own, then lower priority, then the most
    recently admitted, then by uid. Built by merging lists that are each already in
    :func:`_rank` order (tests/unit/core/quota/test_memo.py checks it against one sort).
    `cohort=False`: the preemptor's own ClusterQueue's only (``_own_queue_only``)."""
    name = cq.name
    own = _own_candidates(preemptor, cq, frs)
    if len(own) > 1:
        own.sort(key=_rank(now))
    reclaim = cohort and cq.node.parent is not None \
        and cq.spec.preemption.reclaim_within_cohort is not PreemptionPolicy.NEVER
    others = (
        [c for c in _ranked_reclaim_candidates(snapshot, preemptor, cq, frs, now) if c.cluster_queue != name]
        if reclaim
        else []
    )
    if not others or not own:  # one list: already in order (_rank puts evicted ones first)
        candidates = others or own
    else:
        candidates = (
            [c for c in others if c.evicted]
            + [c for c in own if c.evicted]
            + [c for c in others if not c.evicted]
            + [c for c in own if not c.evicted]
        )
    if preemptor.may_preempt is not None:
        candidates = [c for c in candidates if preemptor.may_preempt(c)]
    return candidates


def could_be_victim(snapshot: Snapshot, cluster_queue: str, priority: int) -> Callable[[str, int], bool]:
    """Whether an admitted workload (by its ClusterQueue and priority) could be among
    :func:`ordered_candidates` for a preemptor of ``priority`` in ``cluster_queue``, under any
    preemption policy and whatever flavor-resources the preemptor needs: the ClusterQueue's own
    workloads of priority up to the preemptor's, and every workload of the cohort tree's other
    ClusterQueues that borrow some flavor-resource now. In a victim search everything else
    counts only as usage, so a preemption request lists these one by one and sums the rest
    (kueue-large-scale: a cohort's whole admitted set was 114–180 KB per request)."""
    cq = snapshot.cluster_queues.get(cluster_queue)
    if cq is None:
        return lambda queue, prio: True  # nothing to go by: list everything
    borrowing = {
        other.name
        for other in snapshot.tree_members(cq)
        if other.name != cluster_queue and _cq_is_borrowing(other, set(other.node.usage))
    }
    return lambda queue, prio: queue in borrowing or (queue == cluster_queue and prio <= priority)


def _rank(now: float):  # type: ignore[no-untyped-def]
    """Kueue's candidate order without its ClusterQueue part (other queues before the
    preemptor's own), which ordered_candidates applies by merging."""

    def key(c: AdmittedWorkload) -> tuple[object, ...]:
        reserved = c.quota_reserved_at if c.quota_reserved_at is not None else now
        return (not c.evicted, c.priority, -reserved, c.uid or c.key, c.key)

    return key


def _fits(wl_req: dict[FlavorResource, int], cq: ClusterQueueState, allow_borrowing: bool) -> bool:
    node = cq.node
    for fr, value in wl_req.items():
        if not allow_borrowing and borrowing(node, fr, value):
            return False
        if value > available(node, fr):
            return False
    return True


def _restore(snapshot: Snapshot, targets: list[tuple[AdmittedWorkload, PreemptionReason]]) -> None:
    for wl, _ in targets:
        snapshot.add_workload(wl)


def _fill_back(
    snapshot: Snapshot,
    targets: list[tuple[AdmittedWorkload, PreemptionReason]],
    wl_req: dict[FlavorResource, int],
    cq: ClusterQueueState,
    allow_borrowing: bool,
) -> list[tuple[AdmittedWorkload, PreemptionReason]]:
    i = len(targets) - 2
    while i >= 0:
        snapshot.add_workload(targets[i][0])
        if _fits(wl_req, cq, allow_borrowing):
            targets[i] = targets[-1]
            targets.pop()
        else:
            snapshot.remove_workload(targets[i][0].key)
        i -= 1
    return targets


def _minimal_preemptions(
    snapshot: Snapshot,
    wl_req: dict[FlavorResource, int],
    cq: ClusterQueueState,
    frs: set[FlavorResource],
    candidates: list[AdmittedWorkload],
    allow_borrowing: bool,
    below_priority: int | None,
) -> list[tuple[AdmittedWorkload, PreemptionReason]]:
    targets: list[tuple[AdmittedWorkload, PreemptionReason]] = []
    fits = False
    for cand in candidates:
        cand_cq = snapshot.cluster_queues[cand.cluster_queue]
        reason = PreemptionReason.IN_CLUSTER_QUEUE
        if cand_cq is not cq:
            if not _cq_is_borrowing(cand_cq, frs):
                continue
            reason = PreemptionReason.IN_COHORT_RECLAMATION
            if below_priority is not None:
                if cand.priority >= below_priority:
                    allow_borrowing = False
                else:
                    reason = PreemptionReason.IN_COHORT_RECLAIM_WHILE_BORROWING
        snapshot.remove_workload(cand.key)
        targets.append((cand, reason))
        if _fits(wl_req, cq, allow_borrowing):
            fits = True
            break
    if not fits:
        _restore(snapshot, targets)
        return []
    targets = _fill_back(snapshot, targets, wl_req, cq, allow_borrowing)
    _restore(snapshot, targets)
    return targets


def _fair_preemptions(
    snapshot: Snapshot,
    wl_req: dict[FlavorResource, int],
    cq: ClusterQueueState,
    frs: set[FlavorResource],
    candidates: list[AdmittedWorkload],
    below_priority: int | None,
) -> list[tuple[AdmittedWorkload, PreemptionReason]]:
    strategies = snapshot.config.fair_sharing.preemption_strategies
    # candidates grouped per ClusterQueue, in candidate order; heap by share (max first)
    groups: dict[str, list[AdmittedWorkload]] = {}
    for cand in candidates:
        groups.setdefault(cand.cluster_queue, []).append(cand)
    shares = {name: dominant_resource_share(snapshot.cluster_queues[name].node)[0] for name in groups}
    order = list(groups)  # insertion order breaks ties deterministically

    def pop_max() -> str | None:
        live = [n for n in order if n in shares]
        if not live:
            return None
        best = max(live, key=lambda n: shares[n])
        return best

    new_share = dominant_resource_share(cq.node, wl_req)[0]
    targets: list[tuple[AdmittedWorkload, PreemptionReason]] = []
    retry: list[AdmittedWorkload] = []
    fits = False
    while not fits:
        name = pop_max()
        if name is None:
            break
        del shares[name]
        cand_cq = snapshot.cluster_queues[name]
        workloads = groups[name]
        if cand_cq is cq:
            cand = workloads[0]
            snapshot.remove_workload(cand.key)
            targets.append((cand, PreemptionReason.IN_CLUSTER_QUEUE))
            if _fits(wl_req, cq, True):
                fits = True
                break
            new_share = dominant_resource_share(cq.node, wl_req)[0]
            groups[name] = workloads[1:]
            if groups[name]:
                shares[name] = dominant_resource_share(cand_cq.node)[0]
            continue
        old_share = dominant_resource_share(cand_cq.node)[0]
        for i, cand in enumerate(workloads):
            below = below_priority is not None and cand.priority < below_priority
            cand_usage = dict(cand.usage)
            cand_new = dominant_resource_share(cand_cq.node, without=cand_usage)[0]
            allowed = strategy_allows(strategies[0], new_share, old_share, cand_new)
            if below or allowed:
                snapshot.remove_workload(cand.key)
                reason = (
                    PreemptionReason.IN_COHORT_FAIR_SHARING
                    if allowed
                    else PreemptionReason.IN_COHORT_RECLAIM_WHILE_BORROWING
                )
                targets.append((cand, reason))
                if _fits(wl_req, cq, True):
                    fits = True
                    break
                groups[name] = workloads[i + 1 :]
                if groups[name] and _cq_is_borrowing(cand_cq, frs):
                    shares[name] = cand_new
                break
            retry.append(cand)
    if not fits and len(strategies) > 1:
        firsts: dict[str, AdmittedWorkload] = {}
        for cand in retry:
            firsts.setdefault(cand.cluster_queue, cand)
        shares = {n: dominant_resource_share(snapshot.cluster_queues[n].node)[0] for n in firsts}
        order = list(firsts)
        while not fits:
            name = pop_max()
            if name is None:
                break
            old_share = shares.pop(name)
            if strategy_allows(strategies[1], new_share, old_share, 0):
                cand = firsts[name]
                snapshot.remove_workload(cand.key)
                targets.append((cand, PreemptionReason.IN_COHORT_FAIR_SHARING))
                if _fits(wl_req, cq, True):
                    fits = True
    if not fits:
        _restore(snapshot, targets)
        return []
    targets = _fill_back(snapshot, targets, wl_req, cq, True)
    _restore(snapshot, targets)
    return targets


def _under_nominal(cq: ClusterQueueState, frs: set[FlavorResource]) -> bool:
    for fr in frs:
        if cq.node.usage.get(fr, 0) >= cq.nominal(fr):
            return False
    return True


def _own_queue_only(snapshot: Snapshot, cq: ClusterQueueState, frs: set[FlavorResource]) -> bool:
    """Whether only the preemptor's own ClusterQueue can give way, whatever the cohort holds:
    without fair sharing or borrowWithinCohort, Kueue reclaims from the cohort only for a
    ClusterQueue under its nominal quota in every flavor-resource that needs preemption, and
    otherwise preempts within the queue, borrowing (``getTargets``' last attempt). Then the
    cohort's borrowed workloads need not be gathered and ranked: in kueue-baseline's smalls
    phase nearly every victim search was such a queue's, and found nothing."""
    return (
        not snapshot.config.fair_sharing.enabled
        and cq.spec.preemption.borrow_within_cohort is PreemptionPolicy.NEVER
        and not _under_nominal(cq, frs)
    )


def get_targets(
    snapshot: Snapshot,
    preemptor: Preemptor,
    wl_req: dict[FlavorResource, int],
    frs: set[FlavorResource],
    now: float,
) -> list[PreemptionTarget]:
    """Victims that make room for ``wl_req`` in the preemptor's ClusterQueue (may be empty).

    The snapshot is used for simulation and restored before returning.
    """
    cq = snapshot.cluster_queues[preemptor.cluster_queue]
    # own candidates only: the search below then takes Kueue's last attempt, within the queue
    candidates = ordered_candidates(snapshot, preemptor, cq, frs, now, cohort=not _own_queue_only(snapshot, cq, frs))
    if not candidates:
        return []
    same_queue = [c for c in candidates if c.cluster_queue == cq.name]
    if len(same_queue) == len(candidates):
        chosen = _minimal_preemptions(snapshot, wl_req, cq, frs, candidates, True, None)
    else:
        policy = cq.spec.preemption
        threshold: int | None = None
        if policy.borrow_within_cohort is not PreemptionPolicy.NEVER:
            threshold = preemptor.priority
            if policy.max_priority_threshold is not None and policy.max_priority_threshold < threshold:
                threshold = policy.max_priority_threshold + 1
        if snapshot.config.fair_sharing.enabled:
            chosen = _fair_preemptions(snapshot, wl_req, cq, frs, candidates, threshold)
        elif threshold is not None:
            if not _under_nominal(cq, frs):
                candidates = [c for c in candidates if c.cluster_queue == cq.name or c.priority < threshold]
            chosen = _minimal_preemptions(snapshot, wl_req, cq, frs, candidates, True, threshold)
        else:
            chosen = []
            if _under_nominal(cq, frs):
                chosen = _minimal_preemptions(snapshot, wl_req, cq, frs, candidates, False, None)
            if not chosen:
                chosen = _minimal_preemptions(snapshot, wl_req, cq, frs, same_queue, True, None)
    return [PreemptionTarget(wl.key, reason, wl.cluster_queue) for wl, reason in chosen]
