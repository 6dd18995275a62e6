"""ADR 0051: a policy that passed is not evaluated again for a request that reads the same.

The memo may only ever skip work: every test here is a request whose verdict would be wrong if
the key left out something a deciding expression reads."""

from policy_builders import GPU_MAX_TEMPLATE, gpu_max_constraint, make_job, make_namespace, policy_set, usage

from services.policy import evaluate
from services.policy.evaluate import _per_thread


def remembered() -> int:
    return len(_per_thread.held.passes)


def test_a_pass_is_remembered_once_for_requests_that_differ_only_where_no_decision_reads():
    ps = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint())  # its message reads request.namespace
    for name in ("a", "b", "c"):
        assert evaluate(ps, make_job(name, "ml-team").gpus(4).obj(), None, usage("ml-team", running=8)).allowed
    assert remembered() == 1
    # another namespace: only the message reads it, so the pass is the same one
    assert evaluate(ps, make_job("d", "vision").gpus(4).obj(), None, usage("vision", running=8)).allowed
    assert remembered() == 1


def test_what_a_decision_reads_is_in_the_key():
    ps = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint(max_gpu=32))
    job = make_job("train", "ml-team").gpus(8).obj()
    assert evaluate(ps, job, None, usage("ml-team", running=24)).allowed  # 24 + 8
    assert not evaluate(ps, job, None, usage("ml-team", running=25)).allowed  # the live usage moved
    assert not evaluate(ps, make_job("train", "ml-team").gpus(9).obj(), None, usage("ml-team", running=24)).allowed
    assert evaluate(ps, job, None, usage("ml-team", running=24)).allowed


def test_a_refusal_is_never_remembered_and_names_each_request():
    ps = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint(max_gpu=4))
    for namespace in ("ml-team", "vision"):
        decision = evaluate(ps, make_job("big", namespace).gpus(8).obj(), None, usage(namespace))
        assert not decision.allowed and f"namespace {namespace} used 0 GPU" in decision.violations[0].message
    assert remembered() == 0


def test_labels_and_namespace_labels_decide():
    ps = policy_set("""
apiVersion: quartermaster.dev/v1alpha1
kind: AdmissionPolicy
metadata: {name: approved}
spec:
  validations:
  - expression: "namespaceObject.metadata.labels['approved'] == 'true' && 'team' in object.metadata.labels"
""")
    labelled = make_job("a", "ml-team").label("team", "x").obj()
    assert evaluate(ps, labelled, make_namespace("ml-team", approved="true")).allowed
    assert not evaluate(ps, labelled, make_namespace("ml-team", approved="no")).allowed
    assert not evaluate(ps, make_job("b", "ml-team").obj(), make_namespace("ml-team", approved="true")).allowed
    assert evaluate(ps, make_job("c", "ml-team").label("team", "y").obj(), make_namespace("ml-team", approved="true")).allowed


def test_each_policy_set_remembers_its_own():
    lenient = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint(max_gpu=64))
    strict = policy_set(GPU_MAX_TEMPLATE + gpu_max_constraint(max_gpu=4))
    job = make_job("train", "ml-team").gpus(8).obj()
    assert evaluate(lenient, job, None, usage("ml-team")).allowed
    assert not evaluate(strict, job, None, usage("ml-team")).allowed
    assert evaluate(lenient, job, None, usage("ml-team")).allowed
