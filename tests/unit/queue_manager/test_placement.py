"""Placement (``_place``): each pod goes to the node of its flavor with the most free GPUs, the
largest node name among equals; pod sets of one flavor share its nodes; a pod that fits nowhere
refuses the whole workload, naming the flavor and the GPUs it asked for."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.queue_manager.state import GPU, _place


def reference_placement(nodes, node_used, workload, flavors, counts):
    """The rule as first written: a max over the flavor's nodes keyed by (free, name)."""
    free: dict[str, int] = {}
    placement = []
    for ps in workload["pod_sets"]:
        per_pod = ps["requests"].get(GPU, 0)
        flavor = flavors.get(ps["name"], {}).get(GPU)
        candidates = [name for name, spec in nodes.items() if spec["flavor"] == flavor]
        if not per_pod or not candidates:
            continue
        for name in candidates:
            free.setdefault(name, nodes[name]["gpu"] - node_used.get(name, 0))
        for _ in range(counts.get(ps["name"], ps["count"])):
            best = max(candidates, key=lambda name: (free[name], name))
            if free[best] < per_pod:
                return [], f"quota available, but no {flavor} node has {per_pod / 1000:g} free {GPU}"
            free[best] -= per_pod
            placement.append((best, per_pod))
    return placement, ""


node = st.tuples(st.sampled_from(["a100", "v100"]), st.sampled_from([0, 1000, 2000, 4000, 8000]), st.sampled_from([0, 0, 1000, 2000]))
pod_set = st.tuples(st.sampled_from(["a100", "v100", "t4"]), st.integers(1, 4), st.sampled_from([0, 500, 1000, 2000, 4000]))


@settings(max_examples=400, deadline=None)
@given(
    fleet=st.dictionaries(st.text("abc123-", min_size=1, max_size=4), node, max_size=12),
    pod_sets=st.lists(pod_set, min_size=1, max_size=3),
)
def test_placement_is_the_most_free_node_first_and_the_largest_name_among_equals(fleet, pod_sets):
    nodes = {name: {"flavor": flavor, "gpu": gpu} for name, (flavor, gpu, _) in fleet.items()}
    node_used = {name: min(used, gpu) for name, (_, gpu, used) in fleet.items() if used}
    workload = {"pod_sets": [
        {"name": f"ps{index}", "count": count, "requests": {GPU: per_pod}}
        for index, (_, count, per_pod) in enumerate(pod_sets)
    ]}
    flavors = {f"ps{index}": {GPU: flavor} for index, (flavor, _, _) in enumerate(pod_sets)}
    counts = {"ps0": pod_sets[0][1] + 1}  # a count that overrides the pod set's own
    state = {"nodes": nodes}
    assert _place(state, node_used, workload, flavors, counts) == reference_placement(
        nodes, node_used, workload, flavors, counts
    )


def test_equal_free_nodes_take_the_largest_name_first():
    state = {"nodes": {name: {"flavor": "a100", "gpu": 8000} for name in ("node-a", "node-c", "node-b")}}
    workload = {"pod_sets": [{"name": "main", "count": 3, "requests": {GPU: 8000}}]}
    placement, message = _place(state, {}, workload, {"main": {GPU: "a100"}}, {})
    assert placement == [("node-c", 8000), ("node-b", 8000), ("node-a", 8000)] and message == ""
    placement, message = _place(state, {}, workload | {"pod_sets": [{"name": "main", "count": 4, "requests": {GPU: 8000}}]},
                                {"main": {GPU: "a100"}}, {})
    assert placement == [] and message == "quota available, but no a100 node has 8 free nvidia.com/gpu"
