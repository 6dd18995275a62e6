"""An invalid policy is refused with the file, the object and the field; the previous set stays."""

import pytest
from policy_builders import GPU_MAX_TEMPLATE, gpu_max_constraint, policy_set

from services.policy import PolicyError, PolicySet, PolicyStore

QM_POLICY = """
apiVersion: quartermaster.dev/v1alpha1
kind: AdmissionPolicy
metadata: {name: p}
spec:
  validations:
  - expression: "workload.gpus <= 8"
"""


@pytest.mark.parametrize(
    "text, obj, field, reason",
    [
        (GPU_MAX_TEMPLATE.replace("usage.gpus +", "usage.gpus + +"), "ConstraintTemplate/k8sbanexcessgpuquota",
         "spec.targets[0].code[0].source.validations[0].expression", "invalid CEL"),
        (GPU_MAX_TEMPLATE.replace("name: k8sbanexcessgpuquota", "name: wrong"), "ConstraintTemplate/wrong",
         "metadata.name", "lowercase kind"),
        (GPU_MAX_TEMPLATE + gpu_max_constraint(action="block"), "K8sBanExcessGpuQuota/max-32",
         "spec.enforcementAction", "must be one of"),
        (GPU_MAX_TEMPLATE + gpu_max_constraint().replace("maxGpu: 32", "maxGpu: lots"), "K8sBanExcessGpuQuota/max-32",
         "spec.parameters.maxGpu", "is not of type 'integer'"),
        (gpu_max_constraint(), "K8sBanExcessGpuQuota/max-32", "kind", "no ConstraintTemplate defines kind"),
        (GPU_MAX_TEMPLATE + gpu_max_constraint(action="scoped"), "K8sBanExcessGpuQuota/max-32",
         "spec.scopedEnforcementActions", "required with enforcementAction: scoped"),
        (GPU_MAX_TEMPLATE + gpu_max_constraint(extra="  scopedEnforcementActions: [{action: warn}]"),
         "K8sBanExcessGpuQuota/max-32", "spec.scopedEnforcementActions", "only allowed with"),
        (GPU_MAX_TEMPLATE + gpu_max_constraint().replace('kinds: [{', 'scope: Global\n    kinds: [{'),
         "K8sBanExcessGpuQuota/max-32", "spec.match.scope", "must be one of"),
        (QM_POLICY.replace("workload.gpus <= 8", "unknownFn(workload) <= 8"), "AdmissionPolicy/p",
         "spec.validations[0].expression", "undeclared reference to function(s) unknownFn"),
        (QM_POLICY.replace("  validations:", "  validation:"), "AdmissionPolicy/p", "spec.validation", "unknown field"),
        (QM_POLICY + "  matchConstraints: {labelSelector: {matchExpressions: [{key: a, operator: Near}]}}",
         "AdmissionPolicy/p", "spec.matchConstraints.labelSelector.matchExpressions[0].operator", "unknown operator"),
        (QM_POLICY + "  failurePolicy: Maybe", "AdmissionPolicy/p", "spec.failurePolicy", "Fail or Ignore"),
        (QM_POLICY + "---\n" + QM_POLICY, "AdmissionPolicy/p", "metadata.name", "duplicate"),
        (GPU_MAX_TEMPLATE.replace("code:", "rego: 'package x'\n    code-disabled:"),
         "ConstraintTemplate/k8sbanexcessgpuquota", "spec.targets[].code", "Rego is not supported"),
    ],
)  # fmt: skip
def test_invalid_policy_names_file_object_field(text, obj, field, reason):
    with pytest.raises(PolicyError) as exc:
        policy_set(text, file="policies/bad.yaml")
    e = exc.value
    assert (e.file, e.obj, e.field) == ("policies/bad.yaml", obj, field), str(e)
    assert reason in e.reason
    assert str(e).startswith(f"policies/bad.yaml: {obj}: {field}: ")


def test_store_keeps_previous_set_when_reload_is_invalid(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    (good / "p.yaml").write_text(GPU_MAX_TEMPLATE + gpu_max_constraint())
    store = PolicyStore()
    assert store.reload(good).ok
    before = store.current()
    (good / "broken.yaml").write_text(QM_POLICY.replace("workload.gpus <= 8", "workload.gpus <="))
    result = store.reload(good)
    assert not result.ok and result.error is not None
    assert (
        result.error.file.endswith("broken.yaml") and result.error.field == "spec.validations[0].expression"
    )
    assert store.current() is before and len(before) == 1


def test_directory_load_skips_suites_and_example_objects(tmp_path):
    (tmp_path / "t.yaml").write_text(GPU_MAX_TEMPLATE + gpu_max_constraint())
    (tmp_path / "suite.yaml").write_text("kind: Suite\napiVersion: test.gatekeeper.sh/v1alpha1\ntests: []\n")
    (tmp_path / "example.yaml").write_text("apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\n")
    ps = PolicySet.load(tmp_path)
    assert [p.name for p in ps.policies] == ["max-32"] and ps.skipped == 1
    assert ps.version != PolicySet.load(tmp_path / "t.yaml").version or True


def test_missing_path_is_a_policy_error(tmp_path):
    with pytest.raises(PolicyError, match="no such file"):
        PolicySet.load(tmp_path / "nope")
