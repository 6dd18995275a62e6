"""Preemption (Kueue's preemption_test.go, reduced): candidates per policy, minimal victim set,
victim ordering and reasons, borrowWithinCohort, CanAlwaysReclaim reservation."""

import pytest
from quota_builders import T0, make_cq, make_flavor, make_lq, make_wl, schedule, summary

from services.core.quota import Reason, WorkloadStatus, build_snapshot, load_objects, preemption_targets

F = make_flavor("f")
LQS = [make_lq("a", "a"), make_lq("b", "b")]


def running(name, cq, gpus, prio=0, at=0.0, created=0.0):
    return make_wl(name).queue(cq).priority(prio).created(created).gpu(gpus).admitted(cq, "f", at=at).obj()


def pending(name, cq, gpus, prio=0, created=100.0):
    return make_wl(name).queue(cq).priority(prio).created(created).gpu(gpus).obj()


CASES = [
    (
        "withinClusterQueue Never: no preemption",
        [make_cq("a").gpu("f", 4).obj(), running("low", "a", 4), pending("new", "a", 2, prio=10)],
        ("Pending", ""),
    ),
    (
        "withinClusterQueue LowerPriority",
        [
            make_cq("a").gpu("f", 4).preemption(within="LowerPriority").obj(),
            running("low", "a", 4, prio=1),
            pending("new", "a", 2, prio=10),
        ],
        ("Preempting", "f", "default/low:InClusterQueue"),
    ),
    (
        "LowerPriority does not preempt equal priority",
        [
            make_cq("a").gpu("f", 4).preemption(within="LowerPriority").obj(),
            running("same", "a", 4, prio=10),
            pending("new", "a", 2, prio=10),
        ],
        ("Pending", ""),
    ),
    (
        "LowerOrNewerEqualPriority preempts a newer equal-priority workload",
        [
            make_cq("a").gpu("f", 4).preemption(within="LowerOrNewerEqualPriority").obj(),
            running("newer", "a", 4, prio=10, created=200),
            pending("new", "a", 2, prio=10, created=100),
        ],
        ("Preempting", "f", "default/newer:InClusterQueue"),
    ),
    (
        "LowerOrNewerEqualPriority spares an older equal-priority workload",
        [
            make_cq("a").gpu("f", 4).preemption(within="LowerOrNewerEqualPriority").obj(),
            running("older", "a", 4, prio=10, created=50),
            pending("new", "a", 2, prio=10, created=100),
        ],
        ("Pending", ""),
    ),
    (
        "minimal set: lowest priority first, then most recently admitted; fill back",
        [
            make_cq("a").gpu("f", 6).preemption(within="LowerPriority").obj(),
            running("p1-old", "a", 2, prio=1, at=10),
            running("p1-new", "a", 2, prio=1, at=20),
            running("p2", "a", 2, prio=2),
            pending("new", "a", 2, prio=10),
        ],
        ("Preempting", "f", "default/p1-new:InClusterQueue"),
    ),
    (
        "minimal set: a big victim alone suffices after fill back",
        [
            make_cq("a").gpu("f", 6).preemption(within="LowerPriority").obj(),
            running("small", "a", 1, prio=1, at=20),
            running("big", "a", 5, prio=2, at=10),
            pending("new", "a", 5, prio=10),
        ],
        ("Preempting", "f", "default/big:InClusterQueue"),
    ),
    (
        "reclaimWithinCohort Never: borrower keeps the quota",
        [
            make_cq("a").cohort("c").gpu("f", 4).obj(),
            make_cq("b").cohort("c").gpu("f", 4).obj(),
            running("borrower", "b", 8),
            pending("new", "a", 4, prio=10),
        ],
        ("Pending", ""),
    ),
    (
        "reclaimWithinCohort LowerPriority reclaims from a lower-priority borrower",
        [
            make_cq("a").cohort("c").gpu("f", 4).preemption(reclaim="LowerPriority").obj(),
            make_cq("b").cohort("c").gpu("f", 4).obj(),
            running("borrower", "b", 8, prio=1),
            pending("new", "a", 4, prio=10),
        ],
        ("Preempting", "f", "default/borrower:InCohortReclamation"),
    ),
    (
        "reclaimWithinCohort LowerPriority spares a higher-priority borrower",
        [
            make_cq("a").cohort("c").gpu("f", 4).preemption(reclaim="LowerPriority").obj(),
            make_cq("b").cohort("c").gpu("f", 4).obj(),
            running("borrower", "b", 8, prio=20),
            pending("new", "a", 4, prio=10),
        ],
        ("Pending", ""),
    ),
    (
        "reclaimWithinCohort Any reclaims regardless of priority",
        [
            make_cq("a").cohort("c").gpu("f", 4).preemption(reclaim="Any").obj(),
            make_cq("b").cohort("c").gpu("f", 4).obj(),
            running("borrower", "b", 8, prio=20),
            pending("new", "a", 4, prio=10),
        ],
        ("Preempting", "f", "default/borrower:InCohortReclamation"),
    ),
    (
        "reclaim never touches a queue within its nominal quota",
        [
            make_cq("a").cohort("c").gpu("f", 4).preemption(reclaim="Any").obj(),
            make_cq("b").cohort("c").gpu("f", 4).obj(),
            running("own", "b", 4, prio=0),
            running("own2", "a", 2),
            pending("new", "a", 4, prio=10),
        ],
        ("Pending", ""),
    ),
    (
        "other ClusterQueues' borrowers go before own workloads",
        [
            make_cq("a").cohort("c").gpu("f", 4).preemption(within="LowerPriority", reclaim="Any").obj(),
            make_cq("b").cohort("c").gpu("f", 4).obj(),
            running("mine", "a", 2, prio=0),
            running("borrower", "b", 6, prio=5),
            pending("new", "a", 2, prio=10),
        ],
        ("Preempting", "f", "default/borrower:InCohortReclamation"),
    ),
    (
        "staying within nominal may need own workloads too (no borrowing while reclaiming)",
        [
            make_cq("a").cohort("c").gpu("f", 4).preemption(within="LowerPriority", reclaim="Any").obj(),
            make_cq("b").cohort("c").gpu("f", 4).obj(),
            running("mine", "a", 2, prio=0),
            running("borrower", "b", 6, prio=5),
            pending("new", "a", 4, prio=10),
        ],
        ("Preempting", "f", "default/borrower:InCohortReclamation", "default/mine:InClusterQueue"),
    ),
    (
        "borrowWithinCohort: preempt below threshold while borrowing",
        [
            make_cq("a")
            .cohort("c")
            .gpu("f", 4)
            .preemption(reclaim="Any", borrow_within="LowerPriority", threshold=5)
            .obj(),
            make_cq("b").cohort("c").gpu("f", 4).obj(),
            running("mine", "a", 4, prio=10),
            running("borrower", "b", 4 + 4, prio=1),
            pending("new", "a", 2, prio=10),
        ],
        ("Preempting", "f", "default/borrower:InCohortReclaimWhileBorrowing"),
    ),
    (
        "borrowWithinCohort: nobody below the threshold",
        [
            make_cq("a")
            .cohort("c")
            .gpu("f", 4)
            .preemption(reclaim="Any", borrow_within="LowerPriority", threshold=0)
            .obj(),
            make_cq("b").cohort("c").gpu("f", 4).obj(),
            running("mine", "a", 4, prio=10),
            running("borrower", "b", 8, prio=1),
            pending("new", "a", 2, prio=10),
        ],
        ("Pending", ""),
    ),
]


@pytest.mark.parametrize(("name", "docs", "want"), CASES, ids=[c[0] for c in CASES])
def test_preemption(name, docs, want):
    got = summary(schedule([F, *LQS, *docs]))
    assert got["default/new"] == want


def test_preempting_message_and_next_cycle_admits():
    docs = [
        F,
        *LQS,
        make_cq("a").gpu("f", 4).preemption(within="LowerPriority").obj(),
        running("low", "a", 4, prio=1),
        pending("new", "a", 2, prio=10),
    ]
    d = schedule(docs)["default/new"]
    assert d.status is WorkloadStatus.PREEMPTING
    assert d.reason is Reason.PENDING_PREEMPTION
    assert d.message == (
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu "
        "in flavor f, 2 more needed. Pending the preemption of 1 workload(s)"
    )
    d2 = schedule(docs, cycles=2)["default/new"]
    assert d2.status is WorkloadStatus.ADMITTED
    assert [t.workload for t in d2.preempts] == ["default/low"]


def test_overlapping_targets_are_skipped():
    docs = [
        F,
        *LQS,
        make_cq("a").cohort("c").gpu("f", 4).preemption(reclaim="Any").obj(),
        make_cq("b").cohort("c").gpu("f", 4).preemption(reclaim="Any").obj(),
        make_cq("x").cohort("c").gpu("f", 0).obj(),
        make_lq("x", "x"),
        running("hog", "x", 8),
        pending("na", "a", 4, prio=10, created=1),
        pending("nb", "b", 4, prio=10, created=2),
    ]
    got = schedule(docs)
    assert got["default/na"].status is WorkloadStatus.PREEMPTING
    assert got["default/nb"].status is WorkloadStatus.PENDING
    assert got["default/nb"].message == "Workload has overlapping preemption targets with another workload"


def test_cannot_always_reclaim_keeps_unused_nominal_from_borrowers():
    """a's head needs preemption but has no candidates; reclaimWithinCohort is not Any, so a's
    unused nominal quota is held in this cycle and b's borrower does not get it."""

    def docs(reclaim):
        return [
            F,
            *LQS,
            make_cq("a").cohort("c").gpu("f", 4).preemption(reclaim=reclaim).obj(),
            make_cq("b").cohort("c").gpu("f", 0).obj(),
            running("own", "a", 2, prio=50),
            pending("big", "a", 4, prio=100, created=1),
            pending("borrower", "b", 2, prio=0, created=2),
        ]

    held = schedule(docs("LowerPriority"))
    assert held["default/big"].status is WorkloadStatus.PENDING
    assert held["default/borrower"].status is WorkloadStatus.PENDING
    assert held["default/borrower"].message == "Workload no longer fits after processing another workload"
    lent = schedule(docs("Any"))
    assert lent["default/borrower"].status is WorkloadStatus.ADMITTED


def test_preemption_targets_api_leaves_snapshot_unchanged():
    docs = [
        F,
        *LQS,
        make_cq("a").gpu("f", 4).preemption(within="LowerPriority").obj(),
        running("low1", "a", 2, prio=1, at=1),
        running("low2", "a", 2, prio=1, at=2),
        pending("new", "a", 4, prio=10),
    ]
    objects = load_objects(("t", d) for d in docs)
    snap = build_snapshot(objects)
    before = snap.usage()
    wl = next(w for w in objects.workloads if w.name == "new")
    plan = preemption_targets(snap, wl, T0)
    assert sorted(t.workload for t in plan.targets) == ["default/low1", "default/low2"]
    assert {str(t.reason) for t in plan.targets} == {"InClusterQueue"}
    assert snap.usage() == before
