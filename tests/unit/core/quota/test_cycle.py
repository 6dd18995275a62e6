"""The scheduling cycle (Kueue's scheduler_test.go, reduced): heads, ordering, strategies,
no over-admission, partial admission, gang, drain."""

import pytest
from quota_builders import GPU, make_cq, make_flavor, make_lq, make_wl, schedule, summary

from services.core.quota import Reason, WorkloadStatus

F = make_flavor("f")


def lqs(*cqs):
    return [make_lq(cq, cq) for cq in cqs]


CASES = [
    (
        "one head per ClusterQueue per cycle",
        [
            make_cq("a").gpu("f", 10).obj(),
            make_wl("w1").queue("a").gpu(1).created(1).obj(),
            make_wl("w2").queue("a").gpu(1).created(2).obj(),
        ],
        {"default/w1": ("Admitted", "f"), "default/w2": ("Pending", "")},
    ),
    (
        "priority before FIFO within a queue",
        [
            make_cq("a").gpu("f", 10).obj(),
            make_wl("old").queue("a").gpu(1).created(1).obj(),
            make_wl("vip").queue("a").priority(5).gpu(1).created(9).obj(),
        ],
        {"default/old": ("Pending", ""), "default/vip": ("Admitted", "f")},
    ),
    (
        "no over-admission: cohort entries not borrowing go first",
        [
            make_cq("a").cohort("c").gpu("f", 5).obj(),
            make_cq("b").cohort("c").gpu("f", 5).obj(),
            make_wl("borrower").queue("a").priority(100).gpu(8).created(1).obj(),
            make_wl("nominal").queue("b").gpu(5).created(2).obj(),
        ],
        {"default/borrower": ("Pending", ""), "default/nominal": ("Admitted", "f")},
    ),
    (
        "same borrowing level: higher priority first, the other no longer fits",
        [
            make_cq("a").cohort("c").gpu("f", 5).obj(),
            make_cq("b").cohort("c").gpu("f", 5).obj(),
            make_wl("low").queue("a").priority(1).gpu(6).created(1).obj(),
            make_wl("high").queue("b").priority(9).gpu(6).created(2).obj(),
        ],
        {"default/low": ("Pending", ""), "default/high": ("Admitted", "f")},
    ),
    (
        "same level and priority: FIFO",
        [
            make_cq("a").cohort("c").gpu("f", 5).obj(),
            make_cq("b").cohort("c").gpu("f", 5).obj(),
            make_wl("first").queue("a").gpu(6).created(1).obj(),
            make_wl("second").queue("b").gpu(6).created(2).obj(),
        ],
        {"default/first": ("Admitted", "f"), "default/second": ("Pending", "")},
    ),
    (
        "gang: all pod sets or none",
        [
            make_cq("a").gpu("f", 4).obj(),
            make_wl("gang").queue("a").podset("driver", 1, gpu=1).podset("workers", 4, gpu=1).obj(),
        ],
        {"default/gang": ("Pending", "")},
    ),
]


@pytest.mark.parametrize(("name", "docs", "want"), CASES, ids=[c[0] for c in CASES])
def test_cycle(name, docs, want):
    got = summary(schedule([F, *lqs("a", "b"), *docs]))
    assert {k: v[:2] for k, v in got.items()} == want


def test_no_longer_fits_message_and_reason():
    docs = [
        F,
        *lqs("a", "b"),
        make_cq("a").cohort("c").gpu("f", 5).obj(),
        make_cq("b").cohort("c").gpu("f", 5).obj(),
        make_wl("low").queue("a").priority(1).gpu(6).obj(),
        make_wl("high").queue("b").priority(9).gpu(6).obj(),
    ]
    d = schedule(docs)["default/low"]
    assert d.reason is Reason.FAILED_AFTER_NOMINATION
    assert d.message == "Workload no longer fits after processing another workload"


def strict_vs_best_effort(strict):
    cq = make_cq("a").gpu("f", 4)
    if strict:
        cq = cq.strict_fifo()
    return [
        F,
        *lqs("a"),
        cq.obj(),
        make_wl("big").queue("a").priority(5).gpu(8).created(1).obj(),  # can never fit
        make_wl("small").queue("a").gpu(2).created(2).obj(),
    ]


def test_best_effort_fifo_lets_the_next_workload_through():
    got = schedule(strict_vs_best_effort(False), cycles=2)
    assert got["default/big"].status is WorkloadStatus.PENDING
    assert got["default/small"].status is WorkloadStatus.ADMITTED


def test_strict_fifo_head_blocks_the_queue():
    got = schedule(strict_vs_best_effort(True), cycles=3)
    assert got["default/big"].status is WorkloadStatus.PENDING
    assert got["default/small"].status is WorkloadStatus.PENDING
    assert got["default/small"].reason is Reason.QUEUED


def test_drain_admits_everything_that_fits():
    docs = [
        F,
        *lqs("a", "b"),
        make_cq("a").cohort("c").gpu("f", 4).obj(),
        make_cq("b").cohort("c").gpu("f", 4).obj(),
    ]
    docs += [make_wl(f"w{i}").queue("a" if i % 2 else "b").gpu(1).created(i).obj() for i in range(10)]
    got = schedule(docs, mode="drain")
    admitted = [k for k, d in got.items() if d.status is WorkloadStatus.ADMITTED]
    assert len(admitted) == 8
    # FIFO within each queue; the cohort's borrowers come from the earliest entries
    assert {"default/w8", "default/w9"} == {k for k, d in got.items() if d.status is WorkloadStatus.PENDING}


@pytest.mark.parametrize(
    ("quota", "count", "min_count", "want_status", "want_count"),
    [
        (10, 8, 2, "Admitted", 8),  # fits fully
        (5, 8, 2, "Admitted", 5),  # largest count that fits
        (1, 8, 2, "Pending", None),  # even minCount does not fit
        (5, 8, None, "Pending", None),  # no minCount: all or nothing
    ],
)
def test_partial_admission(quota, count, min_count, want_status, want_count):
    docs = [
        F,
        *lqs("a"),
        make_cq("a").gpu("f", quota).obj(),
        make_wl("w").queue("a").podset("main", count, min_count=min_count, gpu=1).obj(),
    ]
    d = schedule(docs)["default/w"]
    assert d.status == want_status
    if want_count is not None:
        assert d.counts == {"main": want_count}


def test_admission_problems_named():
    docs = [
        F,
        make_lq("a", "a"),
        make_lq("stopped", "stopped"),
        make_lq("sel", "sel"),
        make_lq("ghost", "nope"),
        make_cq("a").gpu("f", 4).obj(),
        make_cq("stopped").gpu("f", 4).spec(stopPolicy="Hold").obj(),
        make_cq("sel").gpu("f", 4).spec(namespaceSelector={"matchLabels": {"team": "x"}}).obj(),
        make_wl("no-lq").queue("missing").gpu(1).obj(),
        make_wl("no-cq").queue("ghost").gpu(1).obj(),
        make_wl("held").queue("stopped").gpu(1).obj(),
        make_wl("ns").queue("sel").gpu(1).obj(),
    ]
    got = schedule(docs)
    assert got["default/no-lq"].message == "LocalQueue missing doesn't exist"
    assert got["default/no-cq"].message == "ClusterQueue nope doesn't exist"
    assert got["default/held"].message == "ClusterQueue stopped is inactive"
    assert got["default/ns"].message == "Workload namespace doesn't match ClusterQueue selector"
    assert got["default/ns"].reason is Reason.NAMESPACE_MISMATCH


def test_schedule_does_not_mutate_the_snapshot():
    from quota_builders import T0

    from services.core.quota import build_snapshot, load_objects, schedule_cycle

    objects = load_objects(
        ("t", d) for d in [F, *lqs("a"), make_cq("a").gpu("f", 4).obj(), make_wl("w").queue("a").gpu(2).obj()]
    )
    snap = build_snapshot(objects)
    result = schedule_cycle(snap, objects.workloads, T0)
    assert snap.usage() == {"a": {}}
    assert result.snapshot.usage() == {"a": {"f": {GPU: 2000}}}
    assert result.snapshot.workloads["default/w"].quota_reserved_at == T0


def test_drain_keeps_a_preempting_head_at_the_head_of_its_queue():
    """Kueue requeues a workload that issued preemptions at once and keeps it at the head
    (sticky) until its victims are gone: nothing behind it is nominated meanwhile, even what
    would fit in what the victims leave."""
    docs = [
        F,
        *lqs("a"),
        make_cq("a").gpu("f", 4).preemption(within="LowerPriority").obj(),
        make_wl("low").queue("a").gpu(3).admitted("a", "f").obj(),
        make_wl("vip").queue("a").priority(10).gpu(4).created(1).obj(),
        make_wl("small").queue("a").priority(5).gpu(1).created(2).obj(),
    ]
    got = schedule(docs, mode="drain")
    assert got["default/vip"].status is WorkloadStatus.PREEMPTING
    assert [t.workload for t in got["default/vip"].preempts] == ["default/low"]
    assert got["default/small"].status is WorkloadStatus.PENDING
    assert got["default/small"].reason is Reason.QUEUED
    # a cycle at a time, the victims' eviction completes after the first: vip, then small
    cycles = schedule(docs, cycles=3)
    assert cycles["default/vip"].status is WorkloadStatus.ADMITTED


def test_a_standing_preemptor_stays_its_queues_head_ahead_of_a_higher_priority_arrival():
    """Kueue's sticky workload (ADR 0078): a preemptor decided in an earlier pass stays its
    BestEffortFIFO queue's head until it is admitted, ahead even of a higher priority. Without
    it, the newcomer took the GPU left free, and the preemptor could never get its 4."""
    docs = [
        F,
        *lqs("a"),
        make_cq("a").gpu("f", 4).preemption(within="LowerPriority").obj(),
        make_wl("low").queue("a").gpu(3).admitted("a", "f").obj(),
        make_wl("vip").queue("a").priority(10).gpu(4).created(1).obj(),
        make_wl("urgent").queue("a").priority(20).gpu(1).created(2).obj(),
    ]
    unstuck = schedule(docs, mode="drain")
    assert unstuck["default/urgent"].status is WorkloadStatus.ADMITTED  # what the order alone decides
    got = schedule(docs, mode="drain", sticky=("default/vip",))
    assert got["default/vip"].status is WorkloadStatus.PREEMPTING
    assert [t.workload for t in got["default/vip"].preempts] == ["default/low"]
    assert (got["default/urgent"].status, got["default/urgent"].reason) == (WorkloadStatus.PENDING, Reason.QUEUED)


def test_once_its_victims_are_gone_a_standing_preemptor_takes_their_quota_before_older_workloads():
    """Kueue#6929, the reason for the sticky workload: when the victims' quota is freed, the
    workloads set aside earlier requeue, and an older one of the same priority came back ahead
    of the preemptor and took the quota it had evicted for (it then had to preempt again)."""
    docs = [
        F,
        *lqs("a"),
        make_cq("a").gpu("f", 4).preemption(within="LowerPriority").obj(),
        make_wl("older").queue("a").priority(10).gpu(2).created(0).obj(),
        make_wl("vip").queue("a").priority(10).gpu(4).created(1).obj(),
    ]
    assert schedule(docs, mode="drain")["default/older"].status is WorkloadStatus.ADMITTED
    got = schedule(docs, mode="drain", sticky=("default/vip",))
    assert got["default/vip"].status is WorkloadStatus.ADMITTED
    assert got["default/older"].status is WorkloadStatus.PENDING


def test_a_strict_fifo_queue_has_no_sticky_head():
    """Kueue keeps a sticky workload only in BestEffortFIFO queues: StrictFIFO's head is its
    queue's first by priority and time, whatever preempted before."""
    docs = [
        F,
        *lqs("a"),
        make_cq("a").gpu("f", 4).strict_fifo().preemption(within="LowerPriority").obj(),
        make_wl("older").queue("a").priority(10).gpu(2).created(0).obj(),
        make_wl("vip").queue("a").priority(10).gpu(4).created(1).obj(),
    ]
    got = schedule(docs, mode="drain", sticky=("default/vip",))
    assert got["default/older"].status is WorkloadStatus.ADMITTED
    assert got["default/vip"].status is WorkloadStatus.PENDING


def test_a_drain_lets_nothing_else_use_the_quota_of_victims_it_only_asked_for():
    """Found by the property test: in a drain pass nobody is evicted (the preemption service may
    refuse), so a preemptor's victims keep their quota for the rest of the pass. Before, w0's
    victim w1 stepped out of the snapshot for the cycle, and w3 (and others) were admitted into
    its 4 GPUs: 9 GPUs of cohort c admitted on 8 of quota."""
    f1, f2 = make_flavor("f1"), make_flavor("f2")
    docs = [
        f1, f2,
        make_cq("cq0").cohort("c").gpu("f1", 0).gpu("f2", 0).obj(), make_lq("cq0", "cq0"),
        make_cq("cq1").cohort("c").gpu("f1", 4, None, 2).gpu("f2", 0).obj(), make_lq("cq1", "cq1"),
        make_cq("cq2").cohort("c").gpu("f1", 4, None, 3).gpu("f2", 0)
        .preemption(within="LowerPriority", reclaim="Any").obj(), make_lq("cq2", "cq2"),
    ]
    for j, (queue, priority, count, gpus) in enumerate(
        [("cq2", 0, 1, 2), ("cq0", 0, 1, 4), ("cq1", 0, 2, 4), ("cq0", 0, 1, 1), ("cq1", 0, 1, 3), ("cq0", 0, 1, 1),
         ("cq2", 5, 1, 1)]
    ):
        docs.append(make_wl(f"w{j}").queue(queue).priority(priority).created(j).podset("main", count, gpu=gpus).obj())
    got = schedule(docs, mode="drain")
    assert got["default/w0"].status is WorkloadStatus.PREEMPTING
    assert [t.workload for t in got["default/w0"].preempts] == ["default/w1"]
    admitted = {k: d for k, d in got.items() if d.status is WorkloadStatus.ADMITTED}
    gpus = {"default/w1": 4, "default/w3": 1, "default/w4": 3, "default/w5": 1, "default/w6": 1}
    assert sum(gpus[k] for k in admitted) <= 8, sorted(admitted)


def test_a_drain_holds_a_preemptors_quota_in_every_later_cycle_of_the_pass():
    """Kueue nominates a preemptor again in every cycle until its victims are gone, so its
    quota is held in each, not only in the first: a BestEffortFIFO queue of small borrowers
    put a new head forward every cycle, and the second one took the GPU the preemptor was
    waiting for (kueue-baseline's 20-cpu workloads waited behind 1-cpu ones this way)."""
    docs = [
        F,
        *lqs("a", "b"),
        make_cq("a").cohort("c").gpu("f", 4).preemption(within="LowerPriority").obj(),
        make_cq("b").cohort("c").gpu("f", 0).obj(),
        make_wl("low").queue("a").gpu(3).admitted("a", "f").obj(),
        make_wl("vip").queue("a").priority(10).gpu(4).created(1).obj(),
        *[make_wl(f"s{i}").queue("b").gpu(1).created(2 + i).obj() for i in range(3)],
    ]
    got = schedule(docs, mode="drain")
    assert got["default/vip"].status is WorkloadStatus.PREEMPTING
    assert all(got[f"default/s{i}"].status is WorkloadStatus.PENDING for i in range(3)), summary(got)
