"""Scheduling cycles and drain passes, as Kueue's scheduler runs them.

One cycle (:func:`schedule_cycle`):

1. take the head of every ClusterQueue's queue (priority, then FIFO by creation time; a
   BestEffortFIFO head found inadmissible steps aside for the next, a StrictFIFO head blocks);
2. nominate each head on the cycle's snapshot: flavors, borrowing level, preemption targets,
   partial admission (``minCount``) when the full workload does not fit;
3. order entries by borrowing level, then (fair sharing) dominant resource share, then
   priority, then FIFO;
4. walk the entries: a workload that needs preemption but has no candidates keeps its
   ClusterQueue's unused nominal quota from borrowers for the rest of the cycle (unless the
   queue can always reclaim); overlapping preemption targets and quota already taken by an
   earlier entry skip the workload ("no over-admission within one cycle"); otherwise the
   workload is admitted or issues its preemptions.

:func:`run_cycles` repeats cycles (victims removed between cycles, as if their eviction
completed); :func:`drain` repeats cycles until nothing changes, without evictions: it admits
everything that fits, as the event-driven queue-manager does per event.

Nothing here mutates the snapshot passed in: results carry a new snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from services.core.quota.fairsharing import dominant_resource_share
from services.core.quota.flavors import (
    Assignment,
    AssignmentMode,
    FlavorAssigner,
    Mode,
    pod_set_counts_to_try,
)
from services.core.quota.model import (
    NO_ENTRIES,
    Decision,
    PodSet,
    PreemptionPolicy,
    PreemptionTarget,
    QueueingStrategy,
    Reason,
    Workload,
    WorkloadStatus,
)
from services.core.quota.preemption import Preemptor, get_targets
from services.core.quota.snapshot import AdmittedWorkload, ClusterQueueState, Snapshot
from services.core.quota.tree import (
    Node,
    add_usage,
    fits_in,
    height_of_lowest_subtree_that_fits,
    remove_usage,
)

NO_LONGER_FITS = "Workload no longer fits after processing another workload"
OVERLAPPING_TARGETS = "Workload has overlapping preemption targets with another workload"
NAMESPACE_MISMATCH = "Workload namespace doesn't match ClusterQueue selector"


@dataclass(frozen=True, slots=True)
class CycleResult:
    """Decisions for every pending workload given, and the snapshot after admissions."""

    decisions: tuple[Decision, ...]
    snapshot: Snapshot
    cycles: int = 1
    # (drain's `watch`) the cycle in which each watched workload was first decided, and the
    # last cycle that admitted a workload or issued a preemption (0: none)
    watched_at: Mapping[str, int] = field(default_factory=dict)
    last_taking_cycle: int = 0

    def by_workload(self) -> dict[str, Decision]:
        return {d.workload: d for d in self.decisions}

    @property
    def admitted(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.status is WorkloadStatus.ADMITTED)

    def to_json(self) -> dict[str, object]:
        return {"workloads": [d.to_json() for d in self.decisions]}


@dataclass(slots=True)
class PreemptionPlan:
    """Flavor assignment and victims for one workload (for the preemption service)."""

    workload: str
    cluster_queue: str | None
    mode: AssignmentMode
    targets: tuple[PreemptionTarget, ...]
    assignment: Assignment | None
    message: str


# --------------------------------------------------------------------------- queue resolution


def resolve_cluster_queue(
    snapshot: Snapshot, wl: Workload
) -> tuple[ClusterQueueState | None, Decision | None]:
    """The ClusterQueue a pending workload queues in, or a Pending decision saying why not."""

    def pending(message: str, reason: Reason = Reason.INADMISSIBLE, cq: str | None = None) -> Decision:
        return Decision(wl.key, WorkloadStatus.PENDING, cq, reason, message)

    if wl.queue_name is None:
        return None, pending("Workload has no queue-name")
    lq = snapshot.local_queues.get((wl.namespace, wl.queue_name))
    if lq is None:
        return None, pending(f"LocalQueue {wl.queue_name} doesn't exist")
    cq = snapshot.cluster_queues.get(lq.cluster_queue)
    if cq is None:
        return None, pending(f"ClusterQueue {lq.cluster_queue} doesn't exist")
    if cq.inactive_reason is not None:
        return None, pending(cq.inactive_reason, cq=cq.name)
    return cq, None


def _selects_every_namespace(cq: ClusterQueueState) -> bool | None:
    """True: the namespace selector is empty (matches all); False: there is none (matches
    nothing); None: it depends on the namespace's labels."""
    selector = cq.spec.namespace_selector
    if selector is None:
        return False
    if not selector.match_labels and not selector.match_expressions:
        return True
    return None


def nomination_reads_only_kind(cq: ClusterQueueState) -> bool:
    """Whether every waiting workload of this queue with the same priority and pod sets is
    nominated alike on the same tree: the queue's namespace selector does not depend on the
    namespace, and its preemption policy does not read the queue time (`_nomination_key`)."""
    return _selects_every_namespace(cq) is not None and not _queued_at_counts(cq)


def _queued_at_counts(cq: ClusterQueueState) -> bool:
    """Whether a preemptor's queue time is part of its standing (LowerOrNewerEqualPriority)."""
    return cq.spec.preemption.within_cluster_queue is PreemptionPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY


def _namespace_matches(snapshot: Snapshot, cq: ClusterQueueState, namespace: str) -> bool:
    every = _selects_every_namespace(cq)
    if every is not None:
        return every
    selector = cq.spec.namespace_selector
    assert selector is not None
    ns = snapshot.namespaces.get(namespace)
    labels = ns.label_map() if ns is not None else {"kubernetes.io/metadata.name": namespace}
    return selector.matches(labels)


# --------------------------------------------------------------------------- nomination


@dataclass(slots=True)
class _Entry:
    wl: Workload
    cq: ClusterQueueState
    assignment: Assignment | None = None
    targets: list[PreemptionTarget] | tuple[()] = ()
    target_keys: frozenset[str] = frozenset()
    message: str = ""
    mode: AssignmentMode = AssignmentMode.NO_FIT
    reason: Reason = Reason.WAITING_FOR_QUOTA
    share: int = 0
    sort_key: tuple[object, ...] = (1 << 62,)  # entries without an assignment go last
    # (drain) a preemptor's hold: what it needs beyond what its victims, still counted, will free
    held: tuple[tuple[tuple[str, str], int], ...] | None = None
    lane: _Lane | None = None  # the queue it heads (None: a hold)


_SORT_KEY = attrgetter("sort_key")
_QUEUE_ORDER = attrgetter("queue_order")


class _Oracle:
    """Kueue's preemption oracle for one preemptor: could preemption make room for ``value``
    of ``fr``, and at what borrowing level? Memoised per tree state (Snapshot.tree_cache)."""

    __slots__ = ("snapshot", "preemptor", "now", "cq", "pkey", "cache")

    def __init__(
        self,
        snapshot: Snapshot,
        preemptor: Preemptor,
        cq: ClusterQueueState,
        now: float,
        pkey: object,
        cache: dict[object, object] | None,
    ) -> None:
        self.snapshot = snapshot
        self.preemptor = preemptor
        self.now = now
        self.cq = cq
        self.pkey = pkey
        self.cache = cache  # the tree's memo (its admitted set is fixed while the oracle is used)

    def __call__(self, fr: tuple[str, str], value: int) -> tuple[Mode, int]:
        snapshot, cq, pkey = self.snapshot, self.cq, self.pkey
        cache = self.cache if pkey is not None else None
        if cache is not None:
            hit = cache.get(("oracle", pkey, fr, value))
            if hit is not None:
                return hit  # type: ignore[return-value]
        targets = _targets(snapshot, self.preemptor, {fr: value}, {fr}, self.now, pkey, cache)
        if not targets:
            out = Mode.NO_CANDIDATES, 0
        else:
            undo = snapshot.simulate_removal(t.workload for t in targets)
            borrow, _ = height_of_lowest_subtree_that_fits(cq.node, fr, value)
            undo()
            if any(t.cluster_queue == cq.name for t in targets):
                out = Mode.PREEMPT, borrow
            else:
                out = Mode.RECLAIM, borrow
        if cache is not None:
            cache[("oracle", pkey, fr, value)] = out
        return out


def _targets(
    snapshot: Snapshot,
    preemptor: Preemptor,
    usage: dict[tuple[str, str], int],
    resources: set[tuple[str, str]],
    now: float,
    pkey: object,
    cache: dict[object, object] | None,
) -> list[PreemptionTarget]:
    """get_targets, memoised per tree state like the oracle: a workload that asks for one
    resource searches for the same victims twice, once as the oracle's question and once as
    its assignment's (in kueue-baseline's smalls phase, victim searches were most of a drain)."""
    if pkey is None or cache is None:
        return get_targets(snapshot, preemptor, usage, resources, now)
    key = ("targets", pkey, tuple(sorted(usage.items())), frozenset(resources))
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = get_targets(snapshot, preemptor, usage, resources, now)
    return hit  # type: ignore[return-value]


def _preemptor_key(cq: ClusterQueueState, preemptor: Preemptor, now: float) -> tuple[object, ...] | None:
    """Everything a victim search reads from the preemptor (besides the snapshot), or None
    when it cannot be memoised (a victim filter is a black box)."""
    if preemptor.may_preempt is not None:
        return None
    return (cq.name, preemptor.priority, preemptor.queued_at if _queued_at_counts(cq) else None, now)


def _assign(
    snapshot: Snapshot,
    wl: Workload,
    cq: ClusterQueueState,
    now: float,
    may_preempt: Callable[[AdmittedWorkload], bool] | None = None,
    pod_sets: tuple[PodSet, ...] | None = None,
    cache: dict[object, object] | None = None,
) -> tuple[Assignment, list[PreemptionTarget]]:
    """Kueue's getInitialAssignments: full assignment, its victims, else partial admission.

    ``pod_sets``: an equal, shared copy of ``wl.pod_sets`` (the drain's), so the assigner's
    per-queue plans are found by identity rather than by comparing every field. ``cache``:
    the cohort tree's memo, when the caller already holds it."""
    if pod_sets is None:
        pod_sets = wl.pod_sets
    preemptor = Preemptor(wl.key, cq.name, wl.priority, wl.created_at, may_preempt)
    fair = snapshot.config.fair_sharing.enabled
    pkey = _preemptor_key(cq, preemptor, now)
    if pkey is None:
        cache = memo = None
    else:
        if cache is None:
            cache = snapshot.tree_cache(cq.root_key)
        memo = (cache, pkey)
    assigner = FlavorAssigner(
        cq, snapshot.flavors, pod_sets, _Oracle(snapshot, preemptor, cq, now, pkey, cache), fair, memo
    )
    full = assigner.assign()
    mode = full.representative_mode()
    if mode is AssignmentMode.FIT:
        return full, []
    if mode is AssignmentMode.PREEMPT and not full.preemption_known_impossible():
        targets = _targets(snapshot, preemptor, full.usage, full.resources_requiring_preemption(), now, pkey, cache)
        if targets:
            return full, targets
    reducer = pod_set_counts_to_try(pod_sets)
    if reducer is not None:
        lo, hi = 1, reducer.total  # type: ignore[attr-defined]
        found: tuple[Assignment, list[PreemptionTarget]] | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            attempt = assigner.assign(reducer(mid))
            amode = attempt.representative_mode()
            ok: tuple[Assignment, list[PreemptionTarget]] | None = None
            if amode is AssignmentMode.FIT:
                ok = (attempt, [])
            elif amode is AssignmentMode.PREEMPT:
                t = _targets(
                    snapshot, preemptor, attempt.usage, attempt.resources_requiring_preemption(), now, pkey, cache
                )
                if t:
                    ok = (attempt, t)
            if ok is not None:
                found = ok
                hi = mid - 1
            else:
                lo = mid + 1
        if found is not None:
            return found
    return full, []


def preemption_targets(
    snapshot: Snapshot,
    wl: Workload,
    now: float,
    *,
    may_preempt: Callable[[AdmittedWorkload], bool] | None = None,
) -> PreemptionPlan:
    """Flavors and the minimal victim set for one pending workload (snapshot left unchanged).

    ``may_preempt`` (the preemption service's policy) excludes protected workloads from the
    candidates before the search, so the set is minimal among allowed victims; the flavor
    assigner also sees "no candidates" for a flavor whose only victims are protected.
    """
    cq, rejected = resolve_cluster_queue(snapshot, wl)
    if cq is None:
        assert rejected is not None
        return PreemptionPlan(
            wl.key, rejected.cluster_queue, AssignmentMode.NO_FIT, (), None, rejected.message
        )
    assignment, targets = _assign(snapshot, wl, cq, now, may_preempt)
    return PreemptionPlan(
        wl.key, cq.name, assignment.representative_mode(), tuple(targets), assignment, assignment.message()
    )


# --------------------------------------------------------------------------- the cycle


class _Lane:
    """One ClusterQueue's pending workloads in queue order, with what each nomination reads of
    the queue's spec (fixed for the pass)."""

    __slots__ = ("cq", "workloads", "shapes", "pos", "strict", "matches_all", "newer", "preempting")

    def __init__(self, cq: ClusterQueueState) -> None:
        self.cq = cq
        self.workloads: list[Workload] = []
        self.shapes: list[int] = []  # the workloads' pod-set shape ids, aligned
        self.pos = 0  # first index that may still be pending
        self.strict = cq.spec.queueing_strategy is QueueingStrategy.STRICT_FIFO
        self.matches_all = _selects_every_namespace(cq)
        self.newer = _queued_at_counts(cq)  # part of the nomination memo key, as of _preemptor_key
        # drain: the head issued preemptions and stays the head until its victims are gone, as
        # Kueue's (requeued at once, sticky): nothing behind it is nominated in this pass
        self.preempting = False


def _nomination_key(lane: _Lane, wl: Workload, shape: int) -> tuple[object, ...]:
    """Everything a head's nomination reads besides the cohort tree: what _preemptor_key reads
    (now is fixed for the pass) and the pod sets' shape id. The nomination memo's key, and what
    skip_repeats compares: two heads with equal keys on an unchanged tree are nominated alike."""
    return ("nomination", lane.cq.name, wl.priority, wl.created_at if lane.newer else None, shape)


class _Queues:
    """Pending workloads per ClusterQueue, in queue order, plus the BestEffortFIFO
    inadmissible set (workloads that stepped aside until quota is freed)."""

    __slots__ = ("lanes", "inadmissible", "live")

    def __init__(self) -> None:
        self.lanes: dict[str, _Lane] = {}
        self.inadmissible: set[str] = set()
        # lanes whose queue is not yet used up, in ClusterQueue name order (heads() drops the others)
        self.live: list[_Lane] = []

    def add(self, cq: ClusterQueueState, wl: Workload, shape: int) -> None:
        lane = self.lanes.get(cq.name)
        if lane is None:
            lane = self.lanes[cq.name] = _Lane(cq)
        lane.workloads.append(wl)
        lane.shapes.append(shape)

    def seal(self, sticky: Collection[str] = ()) -> None:
        """Each queue in Kueue's order; a BestEffortFIFO queue's `sticky` workloads (preemptors
        whose victims are still going) first, as Kueue keeps its sticky workload at the head."""
        for lane in self.lanes.values():
            # (order, index) pairs sort without a Python key call per workload; the index keeps
            # it stable, as a sort by key alone would be
            wls, shapes = lane.workloads, lane.shapes
            ranked = [i for _, i in sorted(zip(map(_QUEUE_ORDER, wls), range(len(wls)), strict=True))]
            if sticky and not lane.strict:
                heads = [i for i in ranked if wls[i].key in sticky]
                if heads:
                    ranked = heads + [i for i in ranked if wls[i].key not in sticky]
            lane.workloads = [wls[i] for i in ranked]
            lane.shapes = [shapes[i] for i in ranked]
        self.lanes = dict(sorted(self.lanes.items()))
        self.rewind()

    def rewind(self) -> None:
        """Every queue from its first workload again (after quota was freed)."""
        for lane in self.lanes.values():
            lane.pos = 0
        self.live = list(self.lanes.values())


def _beyond(usage: dict[tuple[str, str], int], victims: list[AdmittedWorkload]) -> tuple[tuple[tuple[str, str], int], ...]:
    """What a preemptor uses beyond what its victims hold (positive parts)."""
    freed: dict[tuple[str, str], int] = {}
    for victim in victims:
        for fr, value in victim.usage:
            freed[fr] = freed.get(fr, 0) + value
    return tuple((fr, value - freed.get(fr, 0)) for fr, value in usage.items() if value > freed.get(fr, 0))


def _reserve(e: _Entry) -> list[tuple[tuple[str, str], int]]:
    """Kueue's quotaResourcesToReserve for a preemptor without candidates (positive parts)."""
    assert e.assignment is not None
    node = e.cq.node
    quotas, used = node.quotas, node.usage
    borrowing = e.assignment.borrowing
    out = []
    for fr, value in e.assignment.usage.items():
        quota = quotas.get(fr)
        if borrowing:
            if quota is not None and quota.borrowing_limit is not None:
                room = quota.nominal + quota.borrowing_limit - used.get(fr, 0)
                if room < value:
                    value = room
        else:
            room = (0 if quota is None else quota.nominal) - used.get(fr, 0)
            if room < value:
                value = room
        if value > 0:
            out.append((fr, value))
    return out


class _Scheduler:
    def __init__(self, snapshot: Snapshot, pending: Iterable[Workload], now: float, in_place: bool = False,
                 fast_forward: bool = True, watch: Collection[str] = (), sticky: Collection[str] = ()) -> None:
        self.snap = snapshot if in_place else snapshot.copy()
        self.now = now
        self.fast_forward = fast_forward
        self.cycle_no = 0  # the cycle running (skipped cycles count, as in drain's `ran`)
        self.watch = watch
        self.watched_at: dict[str, int] = {}
        self.last_taking_cycle = 0
        # (drain) the last cycle's heads when nominations alone set every one aside: per entry
        # the reason and message it was set aside with (skip_repeats)
        self.repeats: list[tuple[_Entry, Reason, str]] | None = None
        self.queues = _Queues()
        self.decisions: dict[str, Decision] = {}
        # still waiting in this ClusterQueue, never nominated: its "Queued" decision is made
        # only by result() (most workloads of a drain get another decision first)
        self.queued_in: dict[str, str] = {}
        self.order: list[str] = []
        self.done: set[str] = set()  # admitted or (drain) preempting: out of the queues
        # (drain) preemptors of earlier cycles: Kueue nominates a preemptor again in every cycle
        # until its victims are gone, and so holds its quota in each; a drain evicts nobody, so
        # its nomination stands and only its place in each cycle's order is taken again
        self.holding: list[_Entry] = []
        self.preempted_for: dict[str, tuple[PreemptionTarget, ...]] = {}
        # pod sets -> a small int (a shape id), so nomination memo keys hash an int, not nested
        # dataclasses; and the one copy of each distinct pod sets that nominations use
        self.shape_pod_sets: list[tuple[PodSet, ...]] = []
        shape_ids: dict[tuple[PodSet, ...], int] = {}
        # the same pod sets object (a caller that shares them) is found by identity, without
        # hashing and comparing its PodSets; only objects of workloads kept in a lane are
        # entered, so no id is reused while this runs
        shape_of_object: dict[int, int] = {}
        queue_of: dict[tuple[str, str | None], ClusterQueueState] = {}  # (namespace, queue name)
        for wl in pending:
            if wl.key in self.snap.workloads or wl.key in self.queued_in or wl.admission is not None:
                continue
            if wl.key in self.decisions:
                continue
            self.order.append(wl.key)
            cq = queue_of.get((wl.namespace, wl.queue_name))
            if cq is None:
                cq, rejected = resolve_cluster_queue(self.snap, wl)
                if cq is None:
                    assert rejected is not None
                    self.decisions[wl.key] = rejected
                    continue
                queue_of[(wl.namespace, wl.queue_name)] = cq
            self.queued_in[wl.key] = cq.name
            shape = shape_of_object.get(id(wl.pod_sets))
            if shape is None:
                shape = shape_ids.get(wl.pod_sets)
                if shape is None:
                    shape = shape_ids[wl.pod_sets] = len(self.shape_pod_sets)
                    self.shape_pod_sets.append(wl.pod_sets)
                shape_of_object[id(wl.pod_sets)] = shape
            self.queues.add(cq, wl, shape)
        self.queues.seal(sticky)
        self.fair = self.snap.config.fair_sharing.enabled

    # -- heads

    def heads(self) -> list[tuple[Workload, _Lane, int]]:
        """(workload, its lane, its shape id) for the head of every queue not used up."""
        out = []
        q = self.queues
        done = self.done
        inadmissible = q.inadmissible
        live = []
        for lane in q.live:
            if lane.preempting:
                continue
            wls = lane.workloads
            i = lane.pos
            n = len(wls)
            if lane.strict:
                while i < n and wls[i].key in done:
                    i += 1
            else:  # inadmissible workloads stay aside until evict() resets the positions
                while i < n and (wls[i].key in done or wls[i].key in inadmissible):
                    i += 1
            lane.pos = i
            if i < n:
                out.append((wls[i], lane, lane.shapes[i]))
                live.append(lane)
        q.live = live
        return out

    # -- one cycle

    def cycle(self, drain: bool) -> tuple[bool, list[PreemptionTarget]]:
        """Run one cycle. Returns (progress, victims issued)."""
        self.cycle_no += 1
        snap = self.snap
        now = self.now
        shape_pod_sets = self.shape_pod_sets
        entries: list[_Entry] = []
        # nominations never change the admitted set, so each tree's memo stays valid for them
        caches: dict[str, dict[object, object]] = {}
        for wl, lane, shape in self.heads():
            cq = lane.cq
            e = _Entry(wl, cq)
            e.lane = lane
            matches_all = lane.matches_all
            if not (matches_all or (matches_all is None and _namespace_matches(snap, cq, wl.namespace))):
                e.message, e.reason = NAMESPACE_MISMATCH, Reason.NAMESPACE_MISMATCH
            else:
                # a head re-nominated while its cohort tree is unchanged (StrictFIFO heads,
                # heads that failed after nomination) gets the same nomination: memoised
                # and so does a workload with the same pod sets and the same standing as a
                # preemptor (the nomination reads nothing else of the workload)
                cache = caches.get(cq.root_key)
                if cache is None:
                    cache = caches[cq.root_key] = snap.tree_cache(cq.root_key)
                nkey = _nomination_key(lane, wl, shape)
                hit = cache.get(nkey)
                if hit is None:
                    assignment, targets = _assign(
                        snap, wl, cq, now, pod_sets=shape_pod_sets[shape], cache=cache
                    )
                    hit = (
                        assignment,
                        targets,
                        frozenset(t.workload for t in targets),
                        assignment.message(),
                        assignment.representative_mode(),
                    )
                    cache[nkey] = hit
                e.assignment, e.targets, e.target_keys, e.message, e.mode = hit  # type: ignore[misc]
                if self.fair:
                    e.share = dominant_resource_share(cq.node, e.assignment.usage)[0]
                e.sort_key = (e.assignment.borrowing, e.share, -wl.priority, wl.created_at, wl.key)
            entries.append(e)
        n_heads = len(entries)
        entries += self.holding
        entries.sort(key=_SORT_KEY)

        progress = False
        issued: list[PreemptionTarget] = []
        preempted: dict[str, PreemptionTarget] = {}
        # The cycle's victims stay out of the snapshot until it ends, so each later entry
        # simulates removing only its own targets (Kueue removes all of them again per entry:
        # quadratic in a cycle with many preemptors). Usage is a function of the admitted set,
        # whatever the order of removals and additions, so every check sees the same tree.
        victims_out: list[AdmittedWorkload] = []
        temporary: list[tuple[Node, tuple[str, str], int]] = []
        set_aside: list[_Entry] = []
        # heads that their nomination alone set aside (no fit, no victims, namespace): the same
        # nomination sets the same head aside whatever else the cycle holds (skip_repeats)
        repeats: list[tuple[_Entry, Reason, str]] | None = [] if drain and self.fast_forward else None
        for e in entries:
            wl, cq = e.wl, e.cq
            if e.held is not None:  # not to be taken by an entry after it in this cycle's order
                for fr, value in e.held:
                    add_usage(cq.node, fr, value)
                    temporary.append((cq.node, fr, value))
                continue
            if e.assignment is None:
                self._pending(e, e.reason, e.message)
                set_aside.append(e)
                if repeats is not None:
                    repeats.append((e, e.reason, e.message))
                continue
            mode = e.mode
            if mode is AssignmentMode.NO_FIT:
                reason = e.assignment.no_fit_reason()
                self._pending(e, reason, e.message)
                set_aside.append(e)
                if repeats is not None:
                    repeats.append((e, reason, e.message))
                continue
            if mode is AssignmentMode.PREEMPT and not e.targets:
                self._pending(e, Reason.WAITING_FOR_QUOTA, e.message)
                set_aside.append(e)
                if repeats is not None:
                    repeats.append((e, Reason.WAITING_FOR_QUOTA, e.message))
                if cq.spec.preemption.reclaim_within_cohort is not PreemptionPolicy.ANY:
                    for fr, value in self._reserve_with_victims_in(e, victims_out):
                        add_usage(cq.node, fr, value)
                        temporary.append((cq.node, fr, value))
                continue
            if preempted and not e.target_keys.isdisjoint(preempted):
                self._pending(e, Reason.FAILED_AFTER_NOMINATION, OVERLAPPING_TARGETS)
                continue
            usage = e.assignment.usage
            removed = [snap.remove_workload(t.workload) for t in e.targets]
            fits = fits_in(cq.node, usage)
            if not fits:
                for victim in reversed(removed):
                    snap.add_workload(victim)
                self._pending(e, Reason.FAILED_AFTER_NOMINATION, NO_LONGER_FITS)
                continue
            if drain:
                # A drain evicts nobody: the victims keep their quota until the preemption
                # service has evicted them, and it may refuse (a PreemptionPolicy). Nothing else
                # in the pass may use that quota, or the cohort is overcommitted meanwhile (the
                # property test found 9 GPUs admitted on 8). The preemptor holds what it needs
                # beyond that, as Kueue holds its usage with its victims counted out.
                for victim in reversed(removed):
                    snap.add_workload(victim)
                hold = _beyond(usage, removed)
            else:
                victims_out += removed
                hold = tuple(usage.items())
            for t in e.targets:
                preempted[t.workload] = t
            if mode is AssignmentMode.PREEMPT:
                for fr, value in hold:
                    add_usage(cq.node, fr, value)
                    temporary.append((cq.node, fr, value))
                message = f"{e.message}. Pending the preemption of {len(e.targets)} workload(s)"
                self.decisions[wl.key] = Decision(
                    wl.key,
                    WorkloadStatus.PREEMPTING,
                    cq.name,
                    Reason.PENDING_PREEMPTION,
                    message,
                    e.assignment.flavors(),
                    e.assignment.counts(),
                    tuple(e.targets),
                    e.assignment.borrowing,
                )
                issued.extend(e.targets)
                self.preempted_for[wl.key] = self.preempted_for.get(wl.key, ()) + tuple(e.targets)
                progress = True
                self.last_taking_cycle = self.cycle_no
                if self.watch:
                    self._note_watched(wl.key)
                if drain:
                    self.done.add(wl.key)
                    self.queues.lanes[cq.name].preempting = True
                    e.held = hold
                    self.holding.append(e)
                continue
            snap.add_workload(
                AdmittedWorkload(
                    wl.key, cq.name, wl.priority, tuple(sorted(usage.items())), now, wl.created_at, wl.uid
                )
            )
            waited = (
                f", wait time since queued was {int(now - wl.created_at)}s"
                if 0 < wl.created_at <= now
                else ""
            )
            self.decisions[wl.key] = Decision(
                wl.key,
                WorkloadStatus.ADMITTED,
                cq.name,
                Reason.QUOTA_RESERVED,
                f"Quota reserved in ClusterQueue {cq.name}{waited}",
                e.assignment.flavors(),
                e.assignment.counts(),
                self.preempted_for.get(wl.key, ()),
                e.assignment.borrowing,
            )
            self.done.add(wl.key)
            progress = True
            self.last_taking_cycle = self.cycle_no
            if self.watch:
                self._note_watched(wl.key)
        for node, fr, value in reversed(temporary):
            remove_usage(node, fr, value)
        for victim in reversed(victims_out):
            snap.add_workload(victim)
        inadmissible = self.queues.inadmissible
        for e in set_aside:
            # BestEffortFIFO: the head steps aside until quota is freed; StrictFIFO: it stays.
            if e.cq.spec.queueing_strategy is QueueingStrategy.BEST_EFFORT_FIFO:
                key = e.wl.key
                if key not in inadmissible:
                    inadmissible.add(key)
                    progress = True
        # every head was set aside by its nomination: nothing was admitted, preempted or failed
        self.repeats = repeats if repeats and len(repeats) == n_heads else None
        return progress, issued

    def _reserve_with_victims_in(self, e: _Entry, victims_out: list[AdmittedWorkload]) -> list[tuple[tuple[str, str], int]]:
        """_reserve as Kueue computes it: with the cycle's victims still counted."""
        for victim in victims_out:
            self.snap.add_workload(victim)
        reserved = _reserve(e)
        for victim in victims_out:
            self.snap.remove_workload(victim.key)
        return reserved

    def _note_watched(self, key: str) -> None:
        if key in self.watch and key not in self.watched_at:
            self.watched_at[key] = self.cycle_no

    def _pending(self, e: _Entry, reason: Reason, message: str) -> None:
        key = e.wl.key
        if self.watch:
            self._note_watched(key)
        said = self.decisions.get(key)
        if said is not None and said.reason is reason and said.message == message and said.status is WorkloadStatus.PENDING:
            return  # a head that waits for the same reason again (drain cycles: hundreds of times)
        # the empty mappings passed, not left to their default factories: tens of thousands per drain
        self.decisions[key] = Decision(
            key, WorkloadStatus.PENDING, e.cq.name, reason, message, NO_ENTRIES, NO_ENTRIES
        )

    def skip_repeats(self, limit: int | None) -> int:
        """After a cycle whose heads were all set aside by their nominations alone, skip the
        cycles that would repeat it: set aside, with the same reason and message, the workloads
        that follow each head and would be nominated alike (the same `_nomination_key`, and the
        same namespace where the queue selects by it). Such a head's fate does not depend on the rest of its cycle, and
        nothing is admitted meanwhile, so the tree and each nomination stay as they were. The
        skip stops before the first cycle in which some queue's head is not alike (that one
        must be judged), or when every queue is used up; at most `limit` cycles. Returns the
        cycles skipped, which count as run (the result is the same as running them).

        A drain after quota was freed otherwise sets one of a deep queue's identical workloads
        aside per cycle: most of the cycles of kueue-baseline's last two phases."""
        repeats = self.repeats
        self.repeats = None
        if not repeats or (limit is not None and limit <= 0):
            return 0
        done = self.done
        inadmissible = self.queues.inadmissible
        runs: list[tuple[_Lane, list[Workload], Reason, str]] = []
        stop_at: int | None = None  # the fewest cycles before some queue's head is not alike
        longest = 0
        for e, reason, message in repeats:
            lane = e.lane
            assert lane is not None
            if lane.strict:
                continue  # its head stays, and is set aside alike in every cycle
            head = e.wl
            wls, shapes = lane.workloads, lane.shapes
            nominated_as = _nomination_key(lane, head, shapes[lane.pos])
            by_namespace = lane.matches_all is None  # a namespace check precedes the nomination
            run: list[Workload] = []
            alike = True
            for i in range(lane.pos + 1, len(wls)):
                wl = wls[i]
                if wl.key in done or wl.key in inadmissible:
                    continue
                if _nomination_key(lane, wl, shapes[i]) != nominated_as \
                        or (by_namespace and wl.namespace != head.namespace):
                    alike = False
                    break
                run.append(wl)
            if not alike and (stop_at is None or len(run) < stop_at):
                stop_at = len(run)
            longest = max(longest, len(run))
            runs.append((lane, run, reason, message))
        cycles = longest if stop_at is None else stop_at
        if limit is not None:
            cycles = min(cycles, limit)
        if cycles <= 0:
            return 0
        decisions = self.decisions
        for lane, run, reason, message in runs:
            cq_name = lane.cq.name
            for wl in run[:cycles]:
                decisions[wl.key] = Decision(wl.key, WorkloadStatus.PENDING, cq_name, reason, message,
                                             NO_ENTRIES, NO_ENTRIES)
                inadmissible.add(wl.key)
                if self.watch:  # as of the cycle just run: nothing is taken in the skipped ones
                    self._note_watched(wl.key)
        self.cycle_no += cycles
        return cycles

    def evict(self, victims: list[PreemptionTarget]) -> None:
        """Victims' eviction completes: their quota is freed, inadmissible workloads requeue."""
        for t in victims:
            if t.workload in self.snap.workloads:
                self.snap.remove_workload(t.workload)
        if victims:
            self.queues.inadmissible.clear()
            self.queues.rewind()

    def result(self, cycles: int) -> CycleResult:
        self.snap.drop_caches()
        decisions = self.decisions
        queued_in = self.queued_in
        out = []
        for k in self.order:
            d = decisions.get(k)
            if d is None:
                cq_name = queued_in[k]
                d = Decision(
                    k,
                    WorkloadStatus.PENDING,
                    cq_name,
                    Reason.QUEUED,
                    f"Queued in ClusterQueue {cq_name}",
                    NO_ENTRIES,
                    NO_ENTRIES,
                )
            out.append(d)
        return CycleResult(tuple(out), self.snap, cycles, self.watched_at, self.last_taking_cycle)


def schedule_cycle(snapshot: Snapshot, pending: Iterable[Workload], now: float) -> CycleResult:
    """One Kueue scheduling cycle over the pending workloads (one head per ClusterQueue)."""
    return run_cycles(snapshot, pending, now, cycles=1)


def run_cycles(snapshot: Snapshot, pending: Iterable[Workload], now: float, cycles: int = 1) -> CycleResult:
    """Repeat cycles; after each, preempted victims are removed (their eviction completed)
    and admitted workloads keep their quota."""
    sched = _Scheduler(snapshot, pending, now)
    ran = 0
    for _ in range(max(1, cycles)):
        ran += 1
        _, victims = sched.cycle(drain=False)
        sched.evict(victims)
    return sched.result(ran)


def drain(
    snapshot: Snapshot, pending: Iterable[Workload], now: float, max_cycles: int | None = None,
    *, in_place: bool = False, fast_forward: bool = True, watch: Collection[str] = (),
    sticky: Collection[str] = (),
) -> CycleResult:
    """Cycles until nothing changes: everything that fits is admitted in one pass.

    Preemptions are decided (status Preempting) but not carried out: victims keep their
    quota until the caller removes them from the snapshot, and the preemptor stays its
    queue's head (Kueue's sticky head), so nothing behind it is nominated in this pass; in
    every cycle of the pass it holds what it needs beyond its victims' quota, at its place in
    the cycle's order, as Kueue's preemptor does in every cycle until its victims are gone.

    `in_place`: work on `snapshot` itself instead of a copy; it ends as the result's snapshot,
    with exactly the admitted workloads added. For a caller that keeps one snapshot per cohort
    and takes them back (copying it was O(admitted workloads) per event in the queue-manager).

    `fast_forward`: skip the cycles that would only repeat the last one (`skip_repeats`); off,
    every cycle is run (the tests compare the two).

    `watch`: workload keys whose first decision's cycle the result reports (`watched_at`,
    with `last_taking_cycle`): a caller that gave each queue only the first few workloads of a
    deep run learns whether the pass got past them while it still took quota (ADR 0077).

    `sticky`: keys of preemptors decided in an earlier pass whose victims are still going. Each
    stays its BestEffortFIFO queue's head, ahead of higher priorities and of older workloads
    set aside before, as Kueue's sticky workload does until it is admitted (ADR 0078): the
    quota its victims free is then not taken by a workload that stood behind it.
    """
    sched = _Scheduler(snapshot, pending, now, in_place, fast_forward, watch, sticky)
    ran = 0
    while max_cycles is None or ran < max_cycles:
        ran += 1
        progress, _ = sched.cycle(drain=True)
        if not progress:
            break
        ran += sched.skip_repeats(None if max_cycles is None else max_cycles - ran)
    return sched.result(ran)
