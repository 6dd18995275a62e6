"""Quota arithmetic through hierarchical cohorts (Kueue's resource_node_test.go cases)."""

import pytest
from quota_builders import GPU, make_cohort, make_cq, make_flavor, make_lq, make_wl

from services.core.quota import build_snapshot, load_objects
from services.core.quota.tree import available, potential_available

FR = ("f", GPU)


def snap(*docs):
    return build_snapshot(load_objects(("t.yaml", d) for d in docs))


def used(cq, n, name):
    return make_wl(name).queue("lq").gpu(n).admitted(cq, "f").obj()


@pytest.mark.parametrize(
    ("name", "docs", "cq", "want_available", "want_potential"),
    [
        (
            "no cohort: nominal only, limits ignored",
            [make_cq("a").gpu("f", 10, borrowing=5, lending=2).obj(), used("a", 4, "w1")],
            "a",
            6,
            10,
        ),
        (
            "borrows whole cohort without borrowingLimit",
            [make_cq("a").gpu("f", 10).cohort("c").obj(), make_cq("b").gpu("f", 10).cohort("c").obj()],
            "a",
            20,
            20,
        ),
        (
            "borrowingLimit caps borrowing",
            [
                make_cq("a").gpu("f", 10, borrowing=3).cohort("c").obj(),
                make_cq("b").gpu("f", 10).cohort("c").obj(),
            ],
            "a",
            13,
            13,
        ),
        (
            "lendingLimit caps lending",
            [
                make_cq("a").gpu("f", 10).cohort("c").obj(),
                make_cq("b").gpu("f", 10, lending=4).cohort("c").obj(),
            ],
            "a",
            14,
            14,
        ),
        (
            "lender's usage comes out of its local quota first",
            [
                make_cq("a").gpu("f", 10).cohort("c").obj(),
                make_cq("b").gpu("f", 10, lending=4).cohort("c").obj(),
                used("b", 6, "w1"),
            ],
            "a",
            14,
            14,
        ),
        (
            "lender's usage past local quota reduces what others can borrow",
            [
                make_cq("a").gpu("f", 10).cohort("c").obj(),
                make_cq("b").gpu("f", 10, lending=4).cohort("c").obj(),
                used("b", 8, "w1"),
            ],
            "a",
            12,
            14,
        ),
        (
            "borrower at its limit has nothing available",
            [
                make_cq("a").gpu("f", 10, borrowing=2).cohort("c").obj(),
                make_cq("b").gpu("f", 10).cohort("c").obj(),
                used("a", 12, "w1"),
            ],
            "a",
            0,
            12,
        ),
        (
            "hierarchical: cohort quota and parent",
            [
                make_cohort("root").gpu("f", 5).obj(),
                make_cohort("left").parent("root").obj(),
                make_cq("a").gpu("f", 10).cohort("left").obj(),
                make_cq("b").gpu("f", 10).cohort("root").obj(),
                used("b", 12, "w1"),
            ],
            "a",
            13,
            25,
        ),
        (
            "hierarchical: cohort lendingLimit keeps quota in the subtree",
            [
                make_cohort("root").obj(),
                make_cohort("left").parent("root").gpu("f", 6, lending=1).obj(),
                make_cq("a").gpu("f", 0).cohort("left").obj(),
                make_cq("b").gpu("f", 10).cohort("root").obj(),
            ],
            "b",
            11,
            11,
        ),
        (
            "hierarchical: cohort borrowingLimit",
            [
                make_cohort("root").obj(),
                make_cohort("left").parent("root").gpu("f", 0, borrowing=3).obj(),
                make_cq("a").gpu("f", 2).cohort("left").obj(),
                make_cq("b").gpu("f", 10).cohort("root").obj(),
            ],
            "a",
            5,
            5,
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_available_and_potential(name, docs, cq, want_available, want_potential):
    s = snap(make_flavor("f"), make_lq("lq", "a"), *docs)
    node = s.cluster_queues[cq].node
    assert available(node, FR) == want_available * 1000
    assert potential_available(node, FR) == want_potential * 1000


def test_usage_bubbles_up_and_removal_restores():
    s = snap(
        make_flavor("f"),
        make_lq("lq", "a"),
        make_cq("a").gpu("f", 10, lending=4).cohort("c").obj(),
        make_cq("b").gpu("f", 10).cohort("c").obj(),
        used("a", 9, "w1"),
        used("a", 5, "w2"),
    )
    cohort = s.cohorts["c"]
    # a keeps 6 local; 14 used → 8 counted in the cohort
    assert s.cluster_queues["a"].node.usage[FR] == 14_000
    assert cohort.usage[FR] == 8_000
    before = s.usage(), s.cohort_usage()
    undo = s.simulate_removal(["default/w1"])
    assert s.cluster_queues["a"].node.usage[FR] == 5_000
    assert cohort.usage[FR] == 0
    undo()
    assert (s.usage(), s.cohort_usage()) == before
    assert s.usage()["a"] == {"f": {GPU: 14_000}}


def test_unlisted_usage_adds_up_as_its_workloads_would_and_listed_ones_still_come_off():
    """A preemption request sums the usage of workloads that cannot be victims: the tree must
    hold the same usage (bubbling past lending limits included) as with each one listed."""
    docs = [make_flavor("f"), make_lq("lq", "a"),
            make_cq("a").gpu("f", 10, lending=4).cohort("c").obj(), make_cq("b").gpu("f", 10).cohort("c").obj(),
            used("a", 9, "w1"), used("a", 5, "w2"), used("a", 3, "w3"), used("b", 2, "w4")]
    objects = load_objects(("t.yaml", d) for d in docs)
    full = build_snapshot(objects)
    listed = [w for w in full.workloads.values() if w.key in ("default/w2", "default/w4")]
    partial = build_snapshot(objects, listed, {"a": [(FR, 12_000)], "nowhere": [(FR, 1_000)]})
    assert (partial.usage(), partial.cohort_usage()) == (full.usage(), full.cohort_usage())
    partial.remove_workload("default/w2")
    full.remove_workload("default/w2")
    assert (partial.usage(), partial.cohort_usage()) == (full.usage(), full.cohort_usage())


def test_copy_is_independent():
    s = snap(
        make_flavor("f"),
        make_lq("lq", "a"),
        make_cq("a").gpu("f", 10).cohort("c").obj(),
        make_cq("b").gpu("f", 10).cohort("c").obj(),
        used("a", 4, "w1"),
    )
    c = s.copy()
    c.remove_workload("default/w1")
    assert s.cluster_queues["a"].node.usage[FR] == 4000
    assert c.cluster_queues["a"].node.usage[FR] == 0
    assert c.cluster_queues["a"].node.parent is c.cohorts["c"]
