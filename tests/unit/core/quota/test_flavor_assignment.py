"""Flavor assignment (Kueue's flavorassigner_test.go, reduced): order, fungibility, messages."""

import pytest
from quota_builders import GPU, make_cq, make_flavor, make_lq, make_wl, schedule

from services.core.quota import Reason, WorkloadStatus

BASE = [
    make_flavor("a100", **{"gpu.nvidia.com/class": "a100"}),
    make_flavor("h100", **{"gpu.nvidia.com/class": "h100"}),
    make_flavor("spot"),
    make_lq("main", "cq"),
]


RESERVED = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "reserved"},
            "spec": {"nodeTaints": [{"key": "reserved", "value": "research", "effect": "NoSchedule"}]}}


def other_cq_using(n, flavor="a100"):
    """A lender 'other' in cohort c, plus a workload 'hog' in cq using n of flavor."""
    return make_wl("hog").queue("main").gpu(n).admitted("cq", flavor).obj()


CASES = [
    # name, cq, extra docs, workload, want status, want flavors {res: flavor}, want message substring
    (
        "first flavor fits",
        make_cq("cq").gpu("a100", 8).gpu("h100", 8).obj(),
        [],
        make_wl("w").gpu(4),
        "Admitted",
        {GPU: "a100"},
        "",
    ),
    (
        "first flavor full, second fits",
        make_cq("cq").gpu("a100", 8).gpu("h100", 8).obj(),
        [other_cq_using(6)],
        make_wl("w").gpu(4),
        "Admitted",
        {GPU: "h100"},
        "",
    ),
    (
        "node selector picks the matching flavor",
        make_cq("cq").gpu("a100", 8).gpu("h100", 8).obj(),
        [],
        make_wl("w").podset("main", 1, node_selector={"gpu.nvidia.com/class": "h100"}, gpu=2),
        "Admitted",
        {GPU: "h100"},
        "",
    ),
    (
        "node selector matches nothing",
        make_cq("cq").gpu("a100", 8).obj(),
        [],
        make_wl("w").podset("main", 1, node_selector={"gpu.nvidia.com/class": "v100"}, gpu=2),
        "Pending",
        {},
        "couldn't assign flavors to pod set main: flavor a100 doesn't match node affinity",
    ),
    (
        # Kueue's flavorSelector keeps the selector's keys that some flavor of the group has:
        # "spot" has no GPU class label, and another flavor has one, so spot is ruled out
        "a selector key only another flavor has rules a flavor out",
        make_cq("cq").gpu("spot", 8).gpu("h100", 8).obj(),
        [],
        make_wl("w").podset("main", 1, node_selector={"gpu.nvidia.com/class": "h100"}, gpu=2),
        "Admitted",
        {GPU: "h100"},
        "",
    ),
    (
        "a selector key no flavor has is left to the node scheduler",
        make_cq("cq").gpu("a100", 8).obj(),
        [],
        make_wl("w").podset("main", 1, node_selector={"topology.kubernetes.io/zone": "z1"}, gpu=2),
        "Admitted",
        {GPU: "a100"},
        "",
    ),
    (
        # ADR 0071: required node affinity, as Kueue reads it
        "node affinity In picks the first flavor it allows",
        make_cq("cq").gpu("a100", 8).gpu("h100", 8).obj(),
        [],
        make_wl("w").podset("main", 1, gpu=2, node_affinity=[
            [{"key": "gpu.nvidia.com/class", "operator": "In", "values": ["h100", "v100"]}]]),
        "Admitted",
        {GPU: "h100"},
        "",
    ),
    (
        "node affinity NotIn rules a flavor out",
        make_cq("cq").gpu("a100", 8).gpu("h100", 8).obj(),
        [],
        make_wl("w").podset("main", 1, gpu=2, node_affinity=[
            [{"key": "gpu.nvidia.com/class", "operator": "NotIn", "values": ["a100"]}]]),
        "Admitted",
        {GPU: "h100"},
        "",
    ),
    (
        "node affinity terms: any one may hold",
        make_cq("cq").gpu("a100", 8).gpu("h100", 8).obj(),
        [],
        make_wl("w").podset("main", 1, gpu=2, node_affinity=[
            [{"key": "gpu.nvidia.com/class", "operator": "In", "values": ["v100"]}],
            [{"key": "gpu.nvidia.com/class", "operator": "In", "values": ["h100"]}]]),
        "Admitted",
        {GPU: "h100"},
        "",
    ),
    (
        "node affinity on keys no flavor has is left to the node scheduler",
        make_cq("cq").gpu("a100", 8).obj(),
        [],
        make_wl("w").podset("main", 1, gpu=2, node_affinity=[
            [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}]]),
        "Admitted",
        {GPU: "a100"},
        "",
    ),
    (
        "node affinity no flavor meets",
        make_cq("cq").gpu("a100", 8).gpu("h100", 8).obj(),
        [],
        make_wl("w").podset("main", 1, gpu=2, node_affinity=[
            [{"key": "gpu.nvidia.com/class", "operator": "DoesNotExist"}]]),
        "Pending",
        {},
        "couldn't assign flavors to pod set main: flavor a100 doesn't match node affinity, "
        "flavor h100 doesn't match node affinity",
    ),
    # ADR 0072: a flavor's nodeTaints, as Kueue reads them (the pods' own tolerations)
    (
        "an untolerated NoSchedule taint rules a flavor out",
        make_cq("cq").gpu("reserved", 8).gpu("a100", 8).obj(),
        [RESERVED],
        make_wl("w").gpu(2),
        "Admitted",
        {GPU: "a100"},
        "",
    ),
    (
        "a tolerated taint does not",
        make_cq("cq").gpu("reserved", 8).gpu("a100", 8).obj(),
        [RESERVED],
        make_wl("w").podset("main", 1, gpu=2, tolerations=[
            {"key": "reserved", "operator": "Equal", "value": "research", "effect": "NoSchedule"}]),
        "Admitted",
        {GPU: "reserved"},
        "",
    ),
    (
        "an untolerated taint says which",
        make_cq("cq").gpu("reserved", 8).obj(),
        [RESERVED],
        make_wl("w").podset("main", 1, gpu=2, tolerations=[
            {"key": "reserved", "operator": "Equal", "value": "other", "effect": "NoSchedule"}]),
        "Pending",
        {},
        "couldn't assign flavors to pod set main: untolerated taint reserved=research:NoSchedule in flavor reserved",
    ),
    (
        "PreferNoSchedule asks nothing of a pod",
        make_cq("cq").gpu("preferred", 8).obj(),
        [{**RESERVED, "metadata": {"name": "preferred"}, "spec": {"nodeTaints": [
            {"key": "reserved", "value": "research", "effect": "PreferNoSchedule"}]}}],
        make_wl("w").gpu(2),
        "Admitted",
        {GPU: "preferred"},
        "",
    ),
    (
        "request above maximum capacity",
        make_cq("cq").gpu("a100", 8).obj(),
        [],
        make_wl("w").gpu(10),
        "Pending",
        {},
        "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor a100, "
        "previously considered podsets requests (0) + current podset request (10) > maximum capacity (8)",
    ),
    (
        "resource not in the ClusterQueue",
        make_cq("cq").gpu("a100", 8).obj(),
        [],
        make_wl("w").podset("main", 1, gpu=1, memory="1Gi"),
        "Pending",
        {},
        "couldn't assign flavors to pod set main: resource memory unavailable in ClusterQueue",
    ),
    (
        "insufficient unused quota, Kueue's words",
        make_cq("cq").gpu("a100", 8).obj(),
        [other_cq_using(6)],
        make_wl("w").gpu(4),
        "Pending",
        {},
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in "
        "flavor a100, 2 more needed",
    ),
    (
        "two flavors insufficient: reasons sorted and joined",
        make_cq("cq").gpu("a100", 2).gpu("h100", 1).obj(),
        [],
        make_wl("w").gpu(3),
        "Pending",
        {},
        "maximum capacity (2), insufficient quota for nvidia.com/gpu in flavor h100",
    ),
    (
        "pod sets accumulate usage in the same flavor",
        make_cq("cq").gpu("a100", 8).obj(),
        [],
        make_wl("w").podset("a", 1, gpu=5).podset("b", 1, gpu=4),
        "Pending",
        {},
        "pod set b: insufficient quota for nvidia.com/gpu in flavor a100, previously considered "
        "podsets requests (5) + current podset request (4) > maximum capacity (8)",
    ),
    (
        "cpu and gpu in one resource group share the flavor",
        make_cq("cq").gpu("a100", 8).cpu("a100", 16).gpu("spot", 8).cpu("spot", 64).obj(),
        [],
        make_wl("w").podset("main", 2, gpu=2, cpu=10),
        "Admitted",
        {GPU: "spot", "cpu": "spot"},
        "",
    ),
    (
        "independent resource groups pick flavors separately",
        make_cq("cq").gpu("a100", 8).group().cpu("spot", 64).obj(),
        [],
        make_wl("w").podset("main", 2, gpu=2, cpu="500m"),
        "Admitted",
        {GPU: "a100", "cpu": "spot"},
        "",
    ),
    (
        "pods resource counted when covered",
        make_cq("cq").gpu("a100", 8).resource("a100", "pods", 2).obj(),
        [],
        make_wl("w").podset("main", 3, gpu=1),
        "Pending",
        {},
        "insufficient quota for pods in flavor a100",
    ),
]


@pytest.mark.parametrize(
    ("name", "cq", "extra", "wl", "status", "flavors", "message"), CASES, ids=[c[0] for c in CASES]
)
def test_flavor_assignment(name, cq, extra, wl, status, flavors, message):
    decisions = schedule([*BASE, cq, *extra, wl.obj()])
    d = decisions["default/w"]
    assert d.status == status, d.message
    if flavors:
        assert d.flavors["main"] == flavors
    assert message in d.message


FUNGIBILITY = [
    # whenCanBorrow, whenCanPreempt, want flavor
    ("MayStopSearch", None, "a100"),  # v1beta2 spelling
    ("Borrow", None, "a100"),  # default: stop at a flavor that borrows
    ("TryNextFlavor", None, "h100"),  # look for one that does not borrow
]


@pytest.mark.parametrize(("when_can_borrow", "when_can_preempt", "want"), FUNGIBILITY)
def test_flavor_fungibility_when_can_borrow(when_can_borrow, when_can_preempt, want):
    docs = [
        *BASE,
        make_cq("cq").cohort("c").gpu("a100", 2).gpu("h100", 8).fungibility(when_can_borrow).obj(),
        make_cq("lender").cohort("c").gpu("a100", 8).obj(),
        make_wl("w").gpu(4),
    ]
    d = schedule([*docs[:-1], docs[-1].obj()])["default/w"]
    assert d.status is WorkloadStatus.ADMITTED
    assert d.flavors["main"][GPU] == want
    assert d.borrowing == (1 if want == "a100" else 0)


@pytest.mark.parametrize(
    ("when_can_preempt", "want_status", "want_flavor"),
    [("Preempt", "Preempting", "a100"), ("TryNextFlavor", "Admitted", "h100")],
)
def test_flavor_fungibility_when_can_preempt(when_can_preempt, want_status, want_flavor):
    docs = [
        *BASE,
        make_cq("cq")
        .gpu("a100", 4)
        .gpu("h100", 4)
        .preemption(within="LowerPriority")
        .fungibility(when_can_preempt=when_can_preempt)
        .obj(),
        make_wl("low").queue("main").priority(0).gpu(4).admitted("cq", "a100").obj(),
        make_wl("w").priority(10).gpu(4).obj(),
    ]
    d = schedule(docs)["default/w"]
    assert d.status == want_status
    assert d.flavors["main"][GPU] == want_flavor


def test_pending_reasons():
    d = schedule([*BASE, make_cq("cq").gpu("a100", 2).obj(), make_wl("w").gpu(3).obj()])["default/w"]
    assert d.reason is Reason.EXCEEDS_MAX_QUOTA
    d = schedule(
        [
            *BASE,
            make_cq("cq").gpu("a100", 2).obj(),
            make_wl("w").podset("main", 1, node_selector={"gpu.nvidia.com/class": "x"}, gpu=1).obj(),
        ]
    )["default/w"]
    assert d.reason is Reason.NO_MATCHING_FLAVOR
