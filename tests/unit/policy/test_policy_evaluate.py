"""The evaluator: messages, deny/warn/dryrun, scoped actions, errors, the CEL libraries."""

import pytest
from policy_builders import GPU_MAX_TEMPLATE, gpu_max_constraint, make_job, make_namespace, policy_set, usage

from services.policy import AdmissionDecision, EnforcementAction, EnforcementPoint, evaluate

JOB8 = make_job("train", "ml-team").gpus(4).parallelism(2).obj()


def test_field_report_message():
    ps = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint())
    d = evaluate(ps, JOB8, None, usage("ml-team", running=20, reserved=8), None, None, "CREATE")
    assert isinstance(d, AdmissionDecision) and not d.allowed
    assert [tuple(v) for v in d.violations] == [
        ("max-32", EnforcementAction.DENY, "namespace ml-team used 28 GPU, requesting 8, max is 32")
    ]
    assert d.message == "[max-32] namespace ml-team used 28 GPU, requesting 8, max is 32"


@pytest.mark.parametrize(
    "action, allowed, warnings",
    [
        ("deny", False, ()),
        ("warn", True, ("[max-32] namespace ml-team used 28 GPU, requesting 8, max is 32",)),
        ("dryrun", True, ()),
    ],
)
def test_enforcement_actions_like_gatekeeper(action, allowed, warnings):
    ps = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint(action=action))
    d = evaluate(ps, JOB8, None, usage("ml-team", running=28), None, None, "CREATE")
    assert (d.allowed, d.warnings) == (allowed, warnings)
    assert [v.enforcement_action for v in d.violations] == [EnforcementAction(action)]


SCOPED = """
  scopedEnforcementActions:
  - action: warn
    namespaces: ["ml-team"]
  - action: deny
    excludedNamespaces: ["ml-team"]
  - action: dryrun
    enforcementPoints: [{name: "bus.quartermaster.dev"}]
"""


@pytest.mark.parametrize(
    "namespace, point, allowed, actions",
    [
        ("ml-team", EnforcementPoint.WEBHOOK, True, ["warn"]),
        ("research", EnforcementPoint.WEBHOOK, False, ["deny"]),
        ("ml-team", EnforcementPoint.BUS, True, ["warn"]),  # most severe applicable action wins
    ],
)
def test_scoped_enforcement_per_namespace_for_rollout(namespace, point, allowed, actions):
    ps = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint(action="scoped", extra=SCOPED))
    job = make_job("j", namespace).gpus(8).obj()
    d = evaluate(ps, job, None, usage(namespace, running=30), None, None, "CREATE", enforcement_point=point)
    assert d.allowed is allowed
    assert [v.enforcement_action.value for v in d.violations] == actions


def test_scoped_action_not_applicable_at_point_skips_policy():
    extra = "  scopedEnforcementActions:\n  - action: deny\n    enforcementPoints: [{name: audit.gatekeeper.sh}]\n"
    ps = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint(action="scoped", extra=extra))
    d = evaluate(
        ps, JOB8, None, usage("ml-team", running=30), None, None, enforcement_point=EnforcementPoint.WEBHOOK
    )
    assert d.allowed and not d.violations


def qm_policy(expression: str, extra: str = "", message: str = "") -> str:
    return f"""
apiVersion: quartermaster.dev/v1alpha1
kind: AdmissionPolicy
metadata: {{name: p}}
spec:
{extra}
  params: {{maxGpu: 16, labels: ["a", "b"], limit: "64Gi"}}
  validations:
  - expression: {expression!r}
{message}
"""


@pytest.mark.parametrize(
    "expression, ok",
    [
        ("workload.gpus <= params.maxGpu", True),
        ("quantity('1Gi') == quantity('1024Mi')", True),
        ("quantity('1500m').isGreaterThan(quantity('1'))", True),
        ("quantity('64Gi').compareTo(quantity(params.limit)) == 0", True),
        ("quantity('1.5').asApproximateFloat() == 1.5", True),
        ("quantity('2k').asInteger() == 2000", True),
        ("isQuantity('12Gi') && !isQuantity('twelve')", True),
        ("quantity('1').add(quantity('500m')) == quantity('1500m')", True),
        ("quantityMilli('250m') == 250", True),
        ("[1, 2, 3].sum() == 6 && [3, 1].min() == 1 && [3, 1].max() == 3", True),
        ("['a', 'b'].indexOf('b') == 1 && 'abc'.indexOf('c') == 2", True),
        ("[1, 2, 2].isSorted() && ![2, 1].isSorted()", True),
        ("'cc-ml-42'.find('[0-9]+') == '42' && 'a1b22'.findAll('[0-9]+') == ['1', '22']", True),
        ("params.labels.join(', ') == 'a, b'", True),
        ("'ML'.lowerAscii() == 'ml' && 'a,b'.split(',').size() == 2", True),
        ("gpuCount(object) == 8", True),
        ("workload.podSets[0].count == 2 && workload.podSets[0].gpusPerPod == 4", True),
        ("object.metadata.labels.all(k, k.startsWith('kueue'))", True),
        ("workload.gpus > params.maxGpu", False),
    ],
)
def test_cel_environment(expression, ok):
    ps = policy_set(qm_policy(expression))
    job = make_job("train").queue("team-ml").gpus(4).parallelism(2).obj()
    d = evaluate(ps, job, None, None, None, None)
    assert d.allowed is ok, d.violations


def test_message_fallbacks():
    no_msg = policy_set(qm_policy("false"))
    assert evaluate(no_msg, JOB8).violations[0].message == "failed expression: false"
    static = policy_set(qm_policy("false", message="    message: static"))
    assert evaluate(static, JOB8).violations[0].message == "static"
    bad_expr = policy_set(
        qm_policy("false", message="    message: static\n    messageExpression: 'object.nope'")
    )
    assert evaluate(bad_expr, JOB8).violations[0].message == "static"


def test_evaluation_error_fails_closed_by_default_and_open_when_ignored():
    closed = evaluate(policy_set(qm_policy("object.spec.nope > 1")), JOB8)
    assert not closed.allowed and "policy evaluation failed" in closed.violations[0].message
    opened = evaluate(policy_set(qm_policy("object.spec.nope > 1", extra="  failurePolicy: Ignore")), JOB8)
    assert opened.allowed and not opened.violations and opened.errors


def test_non_bool_result_is_an_error():
    d = evaluate(policy_set(qm_policy("workload.gpus")), JOB8)
    assert not d.allowed and "must evaluate to bool" in d.violations[0].message


def test_match_conditions_skip_policy():
    extra = "  matchConditions:\n  - name: big\n    expression: workload.gpus > 100"
    assert evaluate(policy_set(qm_policy("false", extra=extra)), JOB8).allowed


DELETE_TEMPLATE = """
apiVersion: templates.gatekeeper.sh/v1
kind: ConstraintTemplate
metadata: {name: k8sprotect}
spec:
  crd: {spec: {names: {kind: K8sProtect}}}
  targets:
  - target: admission.k8s.gatekeeper.sh
    code:
    - engine: K8sNativeValidation
      source:
        validations:
        - expression: "object == null && variables.anyObject.metadata.name == 'train' && params.spec.parameters.keep == variables.params.keep"
          message: "ok"
        - expression: "variables.anyObject.metadata.name != variables.params.keep"
          messageExpression: "'cannot delete ' + variables.anyObject.metadata.name"
---
apiVersion: constraints.gatekeeper.sh/v1beta1
kind: K8sProtect
metadata: {name: protect}
spec:
  match: {operations: ["DELETE"]}
  parameters: {keep: train}
"""


def test_gatekeeper_variables_params_and_any_object_on_delete():
    ps = policy_set(DELETE_TEMPLATE)
    d = evaluate(ps, None, None, None, None, None, "DELETE", old_object=JOB8)
    assert [v.message for v in d.violations] == ["cannot delete train"]
    assert evaluate(ps, JOB8, None, None, None, None, "CREATE").allowed


def test_template_variables_chain():
    text = """
apiVersion: quartermaster.dev/v1alpha1
kind: AdmissionPolicy
metadata: {name: chain}
spec:
  variables:
  - {name: a, expression: workload.gpus}
  - {name: b, expression: variables.a * 2}
  validations:
  - expression: variables.b < 10
    messageExpression: '"b is " + string(variables.b)'
"""
    d = evaluate(policy_set(text), JOB8)
    assert d.violations[0].message == "b is 16"


def test_namespace_object_is_bound():
    text = qm_policy("namespaceObject.metadata.labels['approved'] == 'true'")
    assert evaluate(policy_set(text), JOB8, make_namespace("ml-team", approved="true")).allowed
    assert not evaluate(policy_set(text), JOB8, make_namespace("ml-team", approved="no")).allowed


def test_every_violated_rule_is_reported():
    ps = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint("max-32") + gpu_max_constraint("max-4", 4, "warn"))
    d = evaluate(ps, JOB8, None, usage("ml-team", running=28))
    assert [(v.policy, v.enforcement_action.value) for v in d.violations] == [
        ("max-32", "deny"),
        ("max-4", "warn"),
    ]


def test_one_requests_values_never_leak_into_the_next_one():
    """Each evaluation sees its own request's object and usage (an absent usage included), and
    its policy set's own params, whatever was evaluated before (a guard for any reuse of CEL
    contexts between requests: wip/admission-cheaper)."""
    ps = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint())
    over = usage("ml-team", running=28)
    assert not evaluate(ps, JOB8, None, over, None, None, "CREATE").allowed
    assert evaluate(ps, JOB8, None, None, None, None, "CREATE").allowed  # no usage: 0 used, 8 of 32
    assert not evaluate(ps, JOB8, None, over, None, None, "CREATE").allowed
    assert evaluate(ps, make_job("small", "ml-team").gpus(1).obj(), None, usage("ml-team", running=24),
                    None, None, "CREATE").allowed  # 24 + 1: this request's object and usage
    other = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint(max_gpu=64))  # another set: its own params
    assert evaluate(other, JOB8, None, over, None, None, "CREATE").allowed
    assert not evaluate(ps, JOB8, None, over, None, None, "CREATE").allowed


def test_a_value_python_calls_equal_but_cel_does_not_is_bound_again():
    """The evaluator keeps one CEL context and rebinds only what changed (ADR 0047): 1, 1.0 and
    True are equal in Python but not in CEL, so each must reach the policy as itself."""
    ps = policy_set(qm_policy("type(object.spec.parallelism) == int"))

    def job(parallelism):
        obj = make_job("j", "ml-team").obj()
        obj["spec"]["parallelism"] = parallelism
        return obj

    assert [evaluate(ps, job(value)).allowed for value in (1, True, 1, 1.0, 1)] == [True, False, True, False, True]


def test_a_request_that_cannot_be_converted_leaves_nothing_behind():
    """CEL binds a request's variables one by one and stops at one it cannot convert; the next
    request's values are then bound again, not taken for those bound before the failure."""
    ps = policy_set(qm_policy("usage.gpus + workload.gpus <= 32 && cluster.gpuUtilization < 0.9"))
    over = usage("ml-team", running=28)
    assert not evaluate(ps, JOB8, None, over, cluster={"gpuUtilization": 0.1}).allowed
    with pytest.raises(ValueError, match="set"):  # usage (none) is bound before cluster fails
        evaluate(ps, JOB8, None, None, cluster={"gpuUtilization": {0.1}})
    assert not evaluate(ps, JOB8, None, over, cluster={"gpuUtilization": 0.1}).allowed


def test_cluster_signals_are_asked_for_only_when_an_applying_policy_reads_them():
    asked = []

    def signals():
        asked.append(1)
        return {"gpuUtilization": 0.9}

    busy = policy_set(qm_policy("cluster.gpuUtilization < 0.5"))
    assert not evaluate(busy, JOB8, cluster=signals).allowed and asked == [1]
    assert evaluate(busy, JOB8, cluster={"gpuUtilization": 0.1}).allowed  # a value still works
    asked.clear()
    assert evaluate(policy_set(qm_policy("workload.gpus <= params.maxGpu")), JOB8, cluster=signals).allowed
    not_matching = qm_policy("cluster.gpuUtilization < 0.5",
                             extra="  matchConstraints: {namespaces: [other-team]}")
    assert evaluate(policy_set(not_matching), JOB8, cluster=signals).allowed
    assert asked == []
