"""The scheduler's memos (nominations, flavor searches, oracle answers, reclaim candidates,
all keyed by the cohort tree's fingerprint) must never change a decision."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quota_builders import T0, make_cq, make_flavor, make_lq, make_wl

from services.core.quota import build_snapshot, drain, load_objects, run_cycles
from services.core.quota.model import PreemptionTarget
from services.core.quota.preemption import (
    Preemptor,
    _cq_is_borrowing,
    _minimal_preemptions,
    _own_candidates,
    _own_queue_only,
    _under_nominal,
    get_targets,
    ordered_candidates,
)
from services.core.quota.snapshot import AdmittedWorkload

FLAVORS = ("f1", "f2")


@st.composite
def crowded(draw):
    """Few distinct workload shapes, many copies: the memos hit often."""
    n_cqs = draw(st.integers(2, 4))
    docs = [make_flavor(f) for f in FLAVORS]
    for i in range(n_cqs):
        name = f"cq{i}"
        cq = make_cq(name).cohort("c")
        for f in FLAVORS:
            nominal = draw(st.integers(0, 6))
            borrowing = draw(st.one_of(st.none(), st.integers(0, 4)))
            cq = cq.gpu(f, nominal, borrowing, draw(st.one_of(st.none(), st.integers(0, nominal))))
        within = draw(st.sampled_from([None, "LowerPriority", "LowerOrNewerEqualPriority"]))
        reclaim = draw(st.sampled_from([None, "LowerPriority", "Any"]))
        borrow = draw(st.sampled_from([None, "LowerPriority"])) if reclaim else None
        if within or reclaim or borrow:
            cq = cq.preemption(within=within, reclaim=reclaim, borrow_within=borrow)
        if draw(st.booleans()):
            cq = cq.strict_fifo()
        docs.append(cq.obj())
        docs.append(make_lq(name, name))
    n_admitted = draw(st.integers(0, 6))
    for j in range(n_admitted):
        q = f"cq{draw(st.integers(0, n_cqs - 1))}"
        wl = make_wl(f"a{j}").queue(q).priority(draw(st.sampled_from([0, 5]))).created(j)
        wl = wl.gpu(draw(st.integers(1, 2))).admitted(q, draw(st.sampled_from(FLAVORS)), at=j)
        docs.append(wl.obj())
    for j in range(draw(st.integers(1, 30))):
        q = f"cq{draw(st.integers(0, n_cqs - 1))}"
        wl = make_wl(f"w{j}").queue(q).priority(draw(st.sampled_from([0, 5, 10]))).created(100 + j % 3)
        count = draw(st.integers(1, 2))
        wl = wl.podset("main", count, min_count=draw(st.sampled_from([None, 1])), gpu=draw(st.integers(1, 3)))
        docs.append(wl.obj())
    return docs, draw(st.sampled_from(["drain", "cycles"]))


def _run(docs, mode, memoise=True):
    objects = load_objects(("m.yaml", d) for d in docs)
    snap = build_snapshot(objects)
    snap.memoise = memoise
    pending = [w for w in objects.workloads if w.admission is None]
    if mode == "drain":
        return drain(snap, pending, T0)
    return run_cycles(snap, pending, T0, cycles=5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded())
def test_memoised_and_uncached_runs_decide_identically(scenario):
    docs, mode = scenario
    cached = _run(docs, mode)
    uncached = _run(docs, mode, memoise=False)  # every memo lookup misses
    assert cached.decisions == uncached.decisions
    assert cached.cycles == uncached.cycles
    assert cached.snapshot.usage() == uncached.snapshot.usage()


def _snapshot():
    docs = [make_flavor("f1")]
    for name in ("a", "b"):
        docs += [make_cq(name).cohort("c").gpu("f1", 4).obj(), make_lq(name, name)]
    docs.append(make_wl("x").queue("a").gpu(2).admitted("a", "f1").obj())
    return build_snapshot(load_objects(("m.yaml", d) for d in docs))


def test_fingerprint_follows_the_admitted_set_and_survives_simulation():
    snap = _snapshot()
    root = snap.cluster_queues["a"].root_key
    assert root == snap.root_name("a") == snap.cluster_queues["b"].root_key
    before = snap.fingerprint(root)
    memo = snap.tree_cache(root)
    memo["k"] = 1
    undo = snap.simulate_removal(list(snap.workloads))
    assert snap.fingerprint(root) != before
    undo()
    assert snap.fingerprint(root) == before
    assert snap.tree_cache(root) == {"k": 1}  # same admitted set, same state: memo still valid
    extra = AdmittedWorkload("ns/y", "b", 0, ((("f1", "nvidia.com/gpu"), 1000),))
    snap.add_workload(extra)
    assert snap.tree_cache(root) == {}
    copy = snap.copy()
    assert copy.fingerprint(root) == snap.fingerprint(root)
    assert copy.tree_cache(root) == {}  # memos are never shared with copies


def _order_key(cq_name, now):
    """Kueue's candidate order for a preemptor in ``cq_name``: evicted first, other queues'
    first, lower priority, most recently admitted, uid."""

    def key(c):
        reserved = c.quota_reserved_at if c.quota_reserved_at is not None else now
        return (not c.evicted, c.cluster_queue == cq_name, c.priority, -reserved, c.uid or c.key, c.key)

    return key


def _reference_candidates(snap, preemptor, cq, frs, now):
    """Kueue's candidate list the plain way: every candidate, one sort by _order_key."""
    cands = list(_own_candidates(preemptor, cq, frs))
    policy = cq.spec.preemption
    if cq.node.parent is not None and str(policy.reclaim_within_cohort) != "Never":
        only_lower = str(policy.reclaim_within_cohort) != "Any"
        for other in snap.tree_members(cq):
            if other is cq or not _cq_is_borrowing(other, frs):
                continue
            cands += [
                c for c in other.workloads.values()
                if not (only_lower and c.priority >= preemptor.priority) and any(fr in frs for fr, _ in c.usage)
            ]
    return sorted(cands, key=_order_key(cq.name, now))


def _snapshot_some_evicted(scenario, data):
    """The scenario's snapshot, with some admitted workloads being evicted already."""
    docs, _ = scenario
    snap = build_snapshot(load_objects(("m.yaml", d) for d in docs))
    for key in list(snap.workloads):
        if data.draw(st.booleans()):
            wl = snap.remove_workload(key)
            snap.add_workload(dataclasses.replace(wl, evicted=True))
    return snap


def _searches(snap):
    """(ClusterQueue, preemptor, flavor, flavor-resources) for every queue, priority and flavor."""
    for cq in snap.cluster_queues.values():
        for priority in (0, 5, 10):
            preemptor = Preemptor("default/p", cq.name, priority, T0)
            for flavor in FLAVORS:
                yield cq, preemptor, flavor, {(flavor, "nvidia.com/gpu")}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded(), st.data())
def test_ordered_candidates_are_the_candidates_sorted_in_kueues_order(scenario, data):
    """ordered_candidates merges lists sorted once per tree state; it must give exactly the
    order of one sort by _order_key (evicted first, other queues first, priority, newest)."""
    snap = _snapshot_some_evicted(scenario, data)
    for cq, preemptor, _flavor, frs in _searches(snap):
        want = _reference_candidates(snap, preemptor, cq, frs, T0)
        assert ordered_candidates(snap, preemptor, cq, frs, T0) == want
        assert ordered_candidates(snap, preemptor, cq, frs, T0) == want  # memoised: the same


def test_a_snapshot_without_memos_keeps_nothing_and_its_copies_neither():
    snap = _snapshot()
    snap.memoise = False
    root = snap.cluster_queues["a"].root_key
    memo = snap.tree_cache(root)
    memo["k"] = 1
    assert memo == {} and snap.tree_cache(root) == {}
    copy = snap.copy()
    copy.tree_cache(root)["k"] = 1
    assert copy.tree_cache(root) == {}


def _reference_targets(snap, preemptor, wl_req, frs, now):
    """Kueue's getTargets over every candidate, without _own_queue_only's shortcut."""
    cq = snap.cluster_queues[preemptor.cluster_queue]
    candidates = _reference_candidates(snap, preemptor, cq, frs, now)
    if not candidates:
        return []
    same_queue = [c for c in candidates if c.cluster_queue == cq.name]
    policy = cq.spec.preemption
    if len(same_queue) == len(candidates):
        chosen = _minimal_preemptions(snap, wl_req, cq, frs, candidates, True, None)
    elif str(policy.borrow_within_cohort) != "Never":
        threshold = preemptor.priority
        if policy.max_priority_threshold is not None and policy.max_priority_threshold < threshold:
            threshold = policy.max_priority_threshold + 1
        if not _under_nominal(cq, frs):
            candidates = [c for c in candidates if c.cluster_queue == cq.name or c.priority < threshold]
        chosen = _minimal_preemptions(snap, wl_req, cq, frs, candidates, True, threshold)
    else:
        chosen = _minimal_preemptions(snap, wl_req, cq, frs, candidates, False, None) if _under_nominal(cq, frs) else []
        chosen = chosen or _minimal_preemptions(snap, wl_req, cq, frs, same_queue, True, None)
    return [PreemptionTarget(wl.key, reason, wl.cluster_queue) for wl, reason in chosen]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded(), st.data())
def test_a_queue_at_its_nominal_quota_searches_its_own_workloads_only_with_the_same_victims(scenario, data):
    """get_targets skips gathering the cohort's borrowed workloads for a ClusterQueue at or over
    its nominal quota without borrowWithinCohort (_own_queue_only): Kueue would only preempt
    in that queue. The victims must be exactly those of the search over every candidate."""
    snap = _snapshot_some_evicted(scenario, data)
    for _cq, preemptor, flavor, frs in _searches(snap):
        for need in (1000, 3000):
            wl_req = {(flavor, "nvidia.com/gpu"): need}
            want = _reference_targets(snap, preemptor, wl_req, frs, T0)
            assert get_targets(snap, preemptor, wl_req, frs, T0) == want


def test_a_queue_over_its_nominal_quota_preempts_its_own_lower_priority_workload_not_a_borrower():
    """cq a (nominal 2) holds 3 GPUs, one of them borrowed from b (nominal 2, using none):
    a's new priority-10 workload can take only a's own priority-0 one, even under
    reclaimWithinCohort Any; b, under its nominal quota, reclaims from the borrower a."""
    docs = [make_flavor("f1")]
    for name in ("a", "b"):
        cq = make_cq(name).cohort("c").gpu("f1", 2).preemption(within="LowerPriority", reclaim="Any")
        docs += [cq.obj(), make_lq(name, name)]
    docs.append(make_wl("low").queue("a").priority(0).gpu(1).admitted("a", "f1", at=1).obj())
    docs.append(make_wl("mid").queue("a").priority(5).gpu(2).admitted("a", "f1", at=2).obj())
    snap = build_snapshot(load_objects(("m.yaml", d) for d in docs))
    frs = {("f1", "nvidia.com/gpu")}
    need = {("f1", "nvidia.com/gpu"): 1000}
    assert _own_queue_only(snap, snap.cluster_queues["a"], frs)
    assert [t.workload for t in get_targets(snap, Preemptor("default/p", "a", 10, T0), need, frs, T0)] == ["default/low"]
    assert not _own_queue_only(snap, snap.cluster_queues["b"], frs)
    two = {("f1", "nvidia.com/gpu"): 2000}  # one GPU is free: one more from the borrower
    taken = get_targets(snap, Preemptor("default/q", "b", 0, T0), two, frs, T0)
    assert [(t.workload, t.cluster_queue) for t in taken] == [("default/low", "a")]
