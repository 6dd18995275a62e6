"""A drain skips the cycles that would only repeat the last one (`_Scheduler.skip_repeats`):
deep queues of alike workloads, each set aside one per cycle. Skipping must never change a
decision, the number of cycles, or what is admitted."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quota_builders import T0, make_cq, make_flavor, make_lq, make_wl

from services.core.quota import build_snapshot, drain, load_objects
from services.core.quota.model import WorkloadStatus
from services.core.quota.scheduler import _Scheduler

FLAVORS = ("f1", "f2")
NAMESPACES = ("team-a", "team-b")


@st.composite
def deep_queues(draw):
    """A cohort whose queues hold long runs of alike workloads (few shapes, priorities and
    creation times), some already admitted, with every queueing and preemption setting and
    namespace selectors that split the runs."""
    n_cqs = draw(st.integers(1, 4))
    docs = [make_flavor(f) for f in FLAVORS]
    for i in range(n_cqs):
        name = f"cq{i}"
        cq = make_cq(name).cohort("c")
        for f in FLAVORS:
            nominal = draw(st.integers(0, 5))
            borrowing = draw(st.one_of(st.none(), st.integers(0, 4)))
            cq = cq.gpu(f, nominal, borrowing)
        within = draw(st.sampled_from([None, "LowerPriority", "LowerOrNewerEqualPriority"]))
        reclaim = draw(st.sampled_from([None, "LowerPriority", "Any"]))
        if within or reclaim:
            cq = cq.preemption(within=within, reclaim=reclaim)
        if draw(st.integers(0, 4)) == 0:
            cq = cq.strict_fifo()
        selector = draw(st.sampled_from(["all", "all", "one", "none"]))
        if selector == "one":
            cq = cq.spec(namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": NAMESPACES[0]}})
        elif selector == "none":
            cq = cq.spec(namespaceSelector=None)
        docs.append(cq.obj())
        for ns in NAMESPACES:
            docs.append(make_lq(name, name, ns=ns))
    for j in range(draw(st.integers(0, 5))):
        q = f"cq{draw(st.integers(0, n_cqs - 1))}"
        wl = make_wl(f"a{j}", ns=draw(st.sampled_from(NAMESPACES))).queue(q).priority(draw(st.sampled_from([0, 5])))
        wl = wl.created(j).gpu(draw(st.integers(1, 2))).admitted(q, draw(st.sampled_from(FLAVORS)), at=j)
        docs.append(wl.obj())
    for j in range(draw(st.integers(1, 60))):
        q = f"cq{draw(st.integers(0, n_cqs - 1))}"
        ns = NAMESPACES[0] if draw(st.integers(0, 3)) else NAMESPACES[1]
        wl = make_wl(f"w{j}", ns=ns).queue(q).priority(draw(st.sampled_from([0, 0, 5]))).created(100 + j % 2)
        wl = wl.podset("main", draw(st.sampled_from([1, 1, 2])), min_count=draw(st.sampled_from([None, None, 1])),
                       gpu=draw(st.sampled_from([1, 1, 3])))
        docs.append(wl.obj())
    return docs


def _drain(docs, fast_forward):
    objects = load_objects(("m.yaml", d) for d in docs)
    snap = build_snapshot(objects)
    pending = [w for w in objects.workloads if w.admission is None]
    return drain(snap, pending, T0, fast_forward=fast_forward)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deep_queues())
def test_skipping_repeated_cycles_decides_as_running_them(docs):
    skipped = _drain(docs, fast_forward=True)
    run = _drain(docs, fast_forward=False)
    assert skipped.decisions == run.decisions
    assert skipped.cycles == run.cycles
    assert skipped.snapshot.usage() == run.snapshot.usage()


def _full_cohort(per_queue: int) -> tuple[list[dict], list[str]]:
    """Two queues of a cohort with no quota left, `per_queue` alike workloads waiting in each,
    then one of another shape at the end of the first."""
    docs = [make_flavor("f1")]
    for name in ("a", "b"):
        docs += [make_cq(name).cohort("c").gpu("f1", 2).obj(), make_lq(name, name)]
        docs.append(make_wl(f"{name}-running").queue(name).gpu(2).admitted(name, "f1").obj())
    waiting = []
    for name in ("a", "b"):
        for j in range(per_queue):
            docs.append(make_wl(f"{name}{j}").queue(name).created(10 + j).gpu(1).obj())
            waiting.append(f"default/{name}{j}")
    docs.append(make_wl("a-big").queue("a").created(99).gpu(2).obj())
    return docs, waiting


def test_the_cycles_that_repeat_are_skipped_up_to_the_first_head_not_alike():
    docs, waiting = _full_cohort(per_queue=30)
    objects = load_objects(("m.yaml", d) for d in docs)
    pending = [w for w in objects.workloads if w.admission is None]
    sched = _Scheduler(build_snapshot(objects), pending, T0)
    progress, _ = sched.cycle(drain=True)
    assert progress  # each queue's first waiting workload stepped aside
    # queue a's 29 alike ones come before its 2-GPU one, queue b's 29 are all it has left
    assert sched.skip_repeats(None) == 29
    assert all(sched.decisions[key].status is WorkloadStatus.PENDING for key in waiting)
    assert "default/a-big" not in sched.decisions  # its turn is a cycle of its own
    assert sched.skip_repeats(None) == 0  # asked again without a cycle between: nothing known


def test_a_skip_stops_at_the_cycle_limit_and_counts_as_run():
    docs, _ = _full_cohort(per_queue=30)
    limited = _drain_with_limit(docs, 10)
    assert limited.cycles == 10
    assert limited.decisions == _drain_with_limit(docs, 10, fast_forward=False).decisions


def _drain_with_limit(docs, max_cycles, fast_forward=True):
    objects = load_objects(("m.yaml", d) for d in docs)
    pending = [w for w in objects.workloads if w.admission is None]
    return drain(build_snapshot(objects), pending, T0, max_cycles, fast_forward=fast_forward)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deep_queues())
def test_shared_or_copied_pod_sets_decide_alike(docs):
    """The scheduler finds a workload's shape by its pod sets object first (the queue-manager
    shares one per distinct pod sets), else by equality: both ways give the same pass."""
    objects = load_objects(("m.yaml", d) for d in docs)
    pending = [w for w in objects.workloads if w.admission is None]
    shared: dict[tuple, tuple] = {}
    one_each = [dataclasses.replace(w, pod_sets=shared.setdefault(w.pod_sets, w.pod_sets)) for w in pending]
    copied = [dataclasses.replace(w, pod_sets=tuple(dataclasses.replace(ps) for ps in w.pod_sets)) for w in pending]
    by_object = drain(build_snapshot(objects), one_each, T0)
    by_equality = drain(build_snapshot(objects), copied, T0)
    assert by_object.decisions == by_equality.decisions
    assert by_object.cycles == by_equality.cycles
    assert by_object.snapshot.usage() == by_equality.snapshot.usage()
