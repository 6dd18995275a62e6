"""What admission tells the queue-manager about a submission (services/admission/translate.py)."""

from __future__ import annotations

import pytest

from services.admission.translate import kubernetes_object, priority_of, validated
from services.contracts.events import WorkloadSubmitted

CLASSES = {"urgent": 1000, "batch-low": -10}


def submitted(priority=None, priority_class=None) -> WorkloadSubmitted:
    return WorkloadSubmitted(uid="u", namespace="ml-team", name="train", kind="Job", queue_name="team-ml",
                             created_at="2026-11-29T10:00:00Z", priority=priority, priority_class=priority_class,
                             pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": 4000}}])


@pytest.mark.parametrize(("priority", "priority_class", "expected"), [
    (None, "urgent", 1000),     # a real Job: the kueue.x-k8s.io/priority-class label's WorkloadPriorityClass
    (None, "batch-low", -10),
    (5, "urgent", 1000),        # the class wins over a value carried, as Kueue syncs it from the class
    (5, None, 5),               # simulated clusters give values, no class
    (None, None, 0),
])
def test_the_priority_comes_from_the_priority_class(priority, priority_class, expected):
    assert priority_of(submitted(priority, priority_class), CLASSES) == (expected, None)
    record = validated(submitted(priority, priority_class), "gpu-queue", None, (), CLASSES)
    assert record.priority == expected and record.warnings == []


def test_an_unknown_priority_class_is_priority_0_with_a_warning():
    priority, warning = priority_of(submitted(None, "nope"), CLASSES)
    assert priority == 0 and "priority class nope is not configured" in warning
    record = validated(submitted(None, "nope"), "gpu-queue", None, ("policy warning",), CLASSES)
    assert record.priority == 0 and record.warnings == ["policy warning", warning]
    assert priority_of(submitted(7, "nope"), CLASSES) == (7, None)  # a value given: no guess made


def test_policies_on_the_bus_see_the_jobs_node_selector():
    """As the webhook sees the Job itself: a rule on the GPU class reads the same nodeSelector."""
    w = submitted()
    w.pod_sets[0]["node_selector"] = {"gpu.nvidia.com/class": "a100"}
    obj = kubernetes_object(w)
    assert obj["spec"]["template"]["spec"]["nodeSelector"] == {"gpu.nvidia.com/class": "a100"}
    assert "nodeSelector" not in kubernetes_object(submitted())["spec"]["template"]["spec"]
