"""Fair sharing (Kueue's fair_sharing_test.go / preemption_fair_test.go, reduced)."""

import pytest
from quota_builders import fair_sharing_config, make_cq, make_flavor, make_lq, make_wl, schedule, summary

from services.core.quota import build_snapshot, dominant_resource_share, load_objects

F = make_flavor("f")


def running(name, cq, gpus, prio=0, at=0.0):
    return make_wl(name).queue(cq).priority(prio).gpu(gpus).admitted(cq, "f", at=at).obj()


@pytest.mark.parametrize(
    ("weights", "usage", "want"),
    [
        ((None, None), {"a": 4}, {"a": 0, "b": 0}),  # within nominal: share 0
        ((None, None), {"a": 7}, {"a": 375, "b": 0}),  # borrows 3 of 8 lendable → 375‰
        (("2", None), {"a": 7}, {"a": 188, "b": 0}),  # weight 2 halves it (rounded up)
        (("0", None), {"a": 7}, {"a": 2**63 - 1, "b": 0}),  # zero weight borrowing: infinite
        ((None, None), {"a": 5, "b": 3}, {"a": 125, "b": 0}),
    ],
)
def test_dominant_resource_share(weights, usage, want):
    docs = [F, make_lq("a", "a"), make_lq("b", "b")]
    for name, w in zip(("a", "b"), weights, strict=True):
        cq = make_cq(name).cohort("c").gpu("f", 4)
        if w is not None:
            cq = cq.weight(w)
        docs.append(cq.obj())
    for name, n in usage.items():
        docs.append(running(f"u-{name}", name, n))
    snap = build_snapshot(load_objects(("t", d) for d in docs))
    got = {n: dominant_resource_share(snap.cluster_queues[n].node)[0] for n in ("a", "b")}
    assert got == want


def test_fair_sharing_orders_admission_by_share():
    """Both heads borrow; the queue with the lower share after admission goes first."""
    docs = [
        F,
        fair_sharing_config(),
        make_lq("a", "a"),
        make_lq("b", "b"),
        make_lq("lender", "lender"),
        make_cq("a").cohort("c").gpu("f", 2).obj(),
        make_cq("b").cohort("c").gpu("f", 2).obj(),
        make_cq("lender").cohort("c").gpu("f", 4).obj(),
        running("a-run", "a", 4),  # a already borrows 2
        make_wl("wa").queue("a").priority(100).gpu(2).created(1).obj(),
        make_wl("wb").queue("b").priority(0).gpu(4).created(2).obj(),
    ]
    got = summary(schedule(docs))
    assert got["default/wb"][0] == "Admitted"
    assert got["default/wa"][0] == "Pending"
    # without fair sharing, priority decides
    got = summary(schedule([d for d in docs if d.get("kind") != "Configuration"]))
    assert got["default/wa"][0] == "Admitted"


@pytest.mark.parametrize(
    ("strategies", "want"),
    [
        ((), ("Preempting", "f", "default/b-2:InCohortFairSharing")),
        (("LessThanOrEqualToFinalShare",), ("Preempting", "f", "default/b-2:InCohortFairSharing")),
        (("LessThanInitialShare",), ("Preempting", "f", "default/b-2:InCohortFairSharing")),
    ],
)
def test_fair_preemption_takes_from_the_highest_share(strategies, want):
    docs = [
        F,
        fair_sharing_config(*strategies),
        make_lq("a", "a"),
        make_lq("b", "b"),
        make_cq("a").cohort("c").gpu("f", 4).preemption(reclaim="Any").obj(),
        make_cq("b").cohort("c").gpu("f", 4).obj(),
        running("b-1", "b", 4, at=1),
        running("b-2", "b", 4, at=2),
        make_wl("new").queue("a").gpu(4).obj(),
    ]
    assert summary(schedule(docs))["default/new"] == want


def test_fair_preemption_spares_queue_that_would_drop_below_preemptor():
    """a borrowing 1 already would, after admission, have a higher share than b after losing
    its workload: LessThanOrEqualToFinalShare refuses, LessThanInitialShare too."""
    docs = [
        F,
        fair_sharing_config("LessThanOrEqualToFinalShare"),
        make_lq("a", "a"),
        make_lq("b", "b"),
        make_cq("a").cohort("c").gpu("f", 4).preemption(reclaim="Any").obj(),
        make_cq("b").cohort("c").gpu("f", 4).obj(),
        running("a-1", "a", 4),
        running("b-1", "b", 3, at=1),
        running("b-2", "b", 1, at=2),
        make_wl("new").queue("a").gpu(1).obj(),
    ]
    got = summary(schedule(docs))
    assert got["default/new"][0] == "Pending"
