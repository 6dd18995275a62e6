"""ADR 0070: admission judges each flavor with the policies that can read a placement only.
A placement changes the pod templates' nodeSelector, the object's annotations and (a Kueue
Workload's) status, and the workload view's nodeLabels; a policy that reads none of them
judges a placed workload as it judged it unplaced. Wrongly blind would let a refused flavor
through, so every reading of those fields must count."""

from pathlib import Path

import pytest
from policy_builders import policy_set

from services.policy import PolicySet, placement_sensitive

LIBRARY = Path(__file__).resolve().parents[3] / "policies" / "library"


def one(expression: str) -> str:
    return f"""
apiVersion: quartermaster.dev/v1alpha1
kind: AdmissionPolicy
metadata: {{name: p}}
spec:
  validations:
  - expression: {expression!r}
"""


@pytest.mark.parametrize("expression, sensitive", [
    ("workload.gpus <= 8", False),
    ("'team' in object.metadata.labels", False),
    ("object.metadata.name != ''", False),
    ("has(object.spec)", False),
    ("object.spec.parallelism <= 4", False),
    ("'gpu.nvidia.com/class' in workload.nodeLabels", True),
    ("size(workload.nodeLabels) == 0", True),
    ("'x' in object.metadata.annotations", True),
    ("object.spec.template.spec.nodeSelector == {}", True),
    ("object.spec.podSets.all(p, true)", True),
    ("object.spec.tasks.size() > 0", True),
    ("has(object.status)", True),
    ("object.metadata.size() > 0", True),  # metadata read whole
    ("object != null", True),  # the whole object
    ("workload.size() > 0", True),  # the whole view
])
def test_a_policy_reads_a_placement_exactly_when_it_reads_what_a_placement_changes(expression, sensitive):
    assert placement_sensitive(policy_set(one(expression))) == (frozenset({0}) if sensitive else frozenset())


def test_the_librarys_gpu_class_and_region_rules_are_the_ones_judged_per_flavor():
    library = PolicySet.load(LIBRARY)
    names = {library.policies[i].name for i in placement_sensitive(library)}
    assert names == {"a100-approved-projects", "data-labelling-region"}
