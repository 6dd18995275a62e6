"""Label requirements as Kubernetes reads them: a LabelSelector's, and a node affinity's (which
adds Gt and Lt, integers compared). Flavor assignment reads a flavor's nodeLabels so (ADR 0071),
and its nodeTaints against the pods' tolerations as Kubernetes' ToleratesTaint (ADR 0072)."""

import pytest

from services.core.quota.model import LabelRequirement, Taint, Toleration

LABELS = {"gpu": "a100", "gpu-count": "8"}


@pytest.mark.parametrize("key, operator, values, holds", [
    ("gpu", "In", ("a100", "h100"), True),
    ("gpu", "In", ("h100",), False),
    ("zone", "In", ("z1",), False),
    ("gpu", "NotIn", ("h100",), True),
    ("gpu", "NotIn", ("a100",), False),
    ("zone", "NotIn", ("z1",), True),
    ("gpu", "Exists", (), True),
    ("zone", "Exists", (), False),
    ("zone", "DoesNotExist", (), True),
    ("gpu", "DoesNotExist", (), False),
    ("gpu-count", "Gt", ("4",), True),
    ("gpu-count", "Gt", ("8",), False),
    ("gpu-count", "Lt", ("16",), True),
    ("gpu", "Gt", ("4",), False),  # not an integer: Kubernetes says no
    ("zone", "Lt", ("4",), False),  # absent
    ("gpu-count", "Gt", ("4", "5"), False),  # Gt takes one value
    ("gpu", "Sometimes", ("a100",), False),
])
def test_a_requirement_holds_as_kubernetes_says(key, operator, values, holds):
    assert LabelRequirement(key, operator, values).holds(LABELS) is holds


TAINT = Taint("gpu", "reserved", "NoSchedule")


@pytest.mark.parametrize("toleration, tolerates", [
    (Toleration("gpu", "Equal", "reserved", "NoSchedule"), True),
    (Toleration("gpu", "Equal", "reserved", ""), True),  # every effect
    (Toleration("gpu", "", "reserved", ""), True),  # an empty operator is Equal
    (Toleration("gpu", "Equal", "other", "NoSchedule"), False),
    (Toleration("gpu", "Equal", "reserved", "NoExecute"), False),
    (Toleration("gpu", "Exists", "", "NoSchedule"), True),
    (Toleration("", "Exists", "", ""), True),  # tolerates everything
    (Toleration("zone", "Exists", "", ""), False),
    (Toleration("gpu", "Gt", "1", ""), False),
])
def test_a_toleration_tolerates_a_taint_as_kubernetes_says(toleration, tolerates):
    assert toleration.tolerates(TAINT) is tolerates


def test_a_taint_is_written_as_kubernetes_writes_it():
    assert (str(TAINT), str(Taint("spot", "", "NoExecute"))) == ("gpu=reserved:NoSchedule", "spot:NoExecute")
