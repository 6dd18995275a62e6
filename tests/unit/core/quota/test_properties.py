"""Invariants over random cohorts and workloads (hypothesis):

* no ClusterQueue above nominal + borrowingLimit;
* no lender below nominal − lendingLimit of its own (others use at most what it lends);
* no cohort above its capacity (subtree quota);
* identical inputs give identical decisions.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quota_builders import T0, make_cq, make_flavor, make_lq, make_wl

from services.core.quota import build_snapshot, drain, load_objects, run_cycles
from services.core.quota.tree import available

FLAVORS = ("f1", "f2")
FR_KEYS = [(f, "nvidia.com/gpu") for f in FLAVORS]


@st.composite
def scenarios(draw):
    n_cqs = draw(st.integers(2, 5))
    docs = [make_flavor(f) for f in FLAVORS]
    limits = {}
    for i in range(n_cqs):
        name = f"cq{i}"
        cq = make_cq(name).cohort("c")
        for f in FLAVORS:
            nominal = draw(st.integers(0, 8))
            borrowing = draw(st.one_of(st.none(), st.integers(0, 6)))
            lending = draw(st.one_of(st.none(), st.integers(0, nominal)))
            cq = cq.gpu(f, nominal, borrowing, lending)
            limits[(name, f)] = (nominal, borrowing, lending)
        policy = draw(st.sampled_from([None, "LowerPriority", "Any"]))
        if policy:
            cq = cq.preemption(within="LowerPriority", reclaim=policy)
        if draw(st.booleans()):
            cq = cq.strict_fifo()
        docs.append(cq.obj())
        docs.append(make_lq(name, name))
    n_wls = draw(st.integers(1, 14))
    for j in range(n_wls):
        q = f"cq{draw(st.integers(0, n_cqs - 1))}"
        wl = make_wl(f"w{j}").queue(q).priority(draw(st.sampled_from([0, 5, 10]))).created(j)
        count = draw(st.integers(1, 3))
        min_count = draw(st.one_of(st.none(), st.integers(1, count)))
        wl = wl.podset("main", count, min_count=min_count, gpu=draw(st.integers(1, 4)))
        docs.append(wl.obj())
    mode = draw(st.sampled_from(["cycle", "cycles", "drain"]))
    return docs, limits, mode


def run(docs, mode):
    objects = load_objects(("p.yaml", d) for d in docs)
    snap = build_snapshot(objects)
    pending = list(objects.workloads)
    if mode == "drain":
        return drain(snap, pending, T0)
    return run_cycles(snap, pending, T0, cycles=1 if mode == "cycle" else 4)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_quota_invariants_hold(scenario):
    docs, limits, mode = scenario
    result = run(docs, mode)
    snap = result.snapshot
    total_lendable = {}
    for (_name, f), (nominal, _, lending) in limits.items():
        total_lendable[f] = total_lendable.get(f, 0) + (nominal if lending is None else lending)
    for (name, f), (nominal, borrowing, _lending) in limits.items():
        used = snap.cluster_queues[name].node.usage.get((f, "nvidia.com/gpu"), 0)
        if borrowing is not None:
            assert used <= (nominal + borrowing) * 1000, (name, f, used)
        # what others can use of this queue's quota is bounded by its lendingLimit:
        others_cap = sum(
            (n if ll is None else ll) for (m, g), (n, _, ll) in limits.items() if g == f and m != name
        )
        assert used <= (nominal + others_cap) * 1000
    for f in FLAVORS:
        cohort = snap.cohorts["c"]
        fr = (f, "nvidia.com/gpu")
        assert cohort.usage.get(fr, 0) <= cohort.subtree.get(fr, 0), (f, cohort.usage, cohort.subtree)
        assert cohort.subtree.get(fr, 0) == total_lendable[f] * 1000
        # no lender below nominal - lendingLimit: that guaranteed part stays available to it
        for (name, g), (nominal, _, lending) in limits.items():
            if g != f or lending is None:
                continue
            node = snap.cluster_queues[name].node
            guaranteed_unused = max(0, (nominal - lending) * 1000 - node.usage.get(fr, 0))
            assert available(node, fr) >= guaranteed_unused, (name, f)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_identical_inputs_identical_decisions(scenario):
    docs, _, mode = scenario
    first = run(docs, mode)
    second = run(docs, mode)
    assert first.decisions == second.decisions
    assert first.snapshot.usage() == second.snapshot.usage()
    # and the input order of pending workloads does not change the decisions
    third = run(list(reversed(docs)), mode)
    assert sorted(first.decisions, key=lambda d: d.workload) == sorted(
        third.decisions, key=lambda d: d.workload
    )
