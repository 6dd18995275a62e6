from fractions import Fraction

import pytest
from policy_builders import make_job, usage

from services.policy._quantity import parse_quantity, parse_quantity_milli
from services.policy.views import budget_view, usage_view, workload_view


@pytest.mark.parametrize(
    "text, value",
    [
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("16Gi", Fraction(16 * 2**30)),
        ("1.5k", Fraction(1500)),
        ("1e3", Fraction(1000)),
        ("2E-3", Fraction(2, 1000)),
        ("100n", Fraction(1, 10**7)),
        ("-4", Fraction(-4)),
        (8, Fraction(8)),
    ],
)
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "Gi", "1.2.3", "12Q", "1 Gi", None, True])
def test_parse_quantity_rejects(bad):
    with pytest.raises(ValueError):
        parse_quantity(bad)


def test_milli_rounds_up_like_kubernetes():
    assert parse_quantity_milli("1n") == 1
    assert parse_quantity_milli("8") == 8000


@pytest.mark.parametrize(
    "obj, gpus",
    [
        (make_job().gpus(4).obj(), 4),
        (make_job().gpus(4).parallelism(2).obj(), 8),
        (make_job().gpus(2, "requests").parallelism(3).obj(), 6),
        (make_job().obj(), 0),
        (
            {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "metadata": {"name": "w"},
             "spec": {"podSets": [
                 {"name": "a", "count": 4, "template": {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "4"}}}]}}},
                 {"name": "b", "count": 1, "template": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
             ]}},
            17,
        ),
        ({"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {"containers": [
            {"resources": {"limits": {"nvidia.com/gpu": 2}}}, {"resources": {"limits": {"nvidia.com/gpu": 1}}}],
            "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": 8}}}]}}, 8),
    ],
)  # fmt: skip
def test_workload_gpu_count(obj, gpus):
    assert workload_view(obj)["gpus"] == gpus


def test_job_completions_cap_parallelism():
    obj = make_job().gpus(1).parallelism(8).obj()
    obj["spec"]["completions"] = 2
    assert workload_view(obj)["gpus"] == 2


def test_usage_view_counts_gpus_from_milli():
    v = usage_view(usage("ml-team", running=20, reserved=8))
    assert (v["gpus"], v["reservedGpus"], v["runningGpus"]) == (28, 8, 20)
    assert v["flavors"]["a100-flavor"]["gpus"] == 28


def test_unknown_usage_and_budget_are_zero_and_not_exhausted():
    assert usage_view(None, "x")["gpus"] == 0
    assert budget_view(None) | {} == budget_view({}) and budget_view(None)["exhausted"] is False


def _placed_on(node_selector=None, terms=None):
    pod_spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if terms is not None:
        pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}
    return workload_view({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"},
                          "spec": {"template": {"spec": pod_spec}}})["nodeLabels"]


def _in(key, *values):
    return {"key": key, "operator": "In", "values": list(values)}


@pytest.mark.parametrize("node_selector, terms, labels", [
    ({"class": "a100"}, None, {"class": ["a100"]}),
    (None, [{"matchExpressions": [_in("class", "a100", "h100")]}], {"class": ["a100", "h100"]}),
    # the nodeSelector AND the affinity: the pods can only land on h100 nodes
    ({"class": "h100"}, [{"matchExpressions": [_in("class", "a100", "h100")]}], {"class": ["h100"]}),
    # terms are ORed: each term's classes are allowed
    (None, [{"matchExpressions": [_in("class", "a100")]}, {"matchExpressions": [_in("class", "h100")]}],
     {"class": ["a100", "h100"]}),
    # a term that leaves the class free lets the pods land on any class: not listed
    (None, [{"matchExpressions": [_in("class", "a100")]}, {"matchExpressions": [_in("zone", "z1")]}], {}),
    # expressions of one term are ANDed
    (None, [{"matchExpressions": [_in("class", "a100", "h100"), _in("class", "h100", "v100")]}],
     {"class": ["h100"]}),
    # NotIn names no value the pods may land on
    (None, [{"matchExpressions": [{"key": "class", "operator": "NotIn", "values": ["v100"]}]}], {}),
    # the two disagree: no node takes the pods, and no class is listed
    ({"class": "h100"}, [{"matchExpressions": [_in("class", "a100")]}], {"class": []}),
])
def test_node_labels_are_the_values_the_pods_may_land_on(node_selector, terms, labels):
    assert _placed_on(node_selector, terms) == labels
