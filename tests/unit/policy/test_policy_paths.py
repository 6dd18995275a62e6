"""What a policy set reads of each CEL variable, and the cut-down copies the evaluator binds
(services/policy/paths.py, ADR 0048). A cut may only ever drop fields no expression names."""

import pytest
from policy_builders import make_job, make_namespace, policy_set

from services.policy import evaluate
from services.policy.paths import PRESENT, WHOLE, cut, shapes, split_literals


def read(source: str, *names: str):
    return shapes([(source, names or ("object",))])


@pytest.mark.parametrize(
    "source, shape",
    [
        ("object.metadata.labels['team'] == 'a'", {"metadata": {"labels": WHOLE}}),
        ("object . metadata\n  . name == 'a'", {"metadata": {"name": WHOLE}}),
        # a method or macro is called on what comes before it, which is kept whole
        ("object.spec.containers.all(c, c.image != '')", {"spec": {"containers": WHOLE}}),
        ("object.metadata.labels.size() > 1", {"metadata": {"labels": WHOLE}}),
        # a presence test keeps the field present, not what is in it
        ("has(object.metadata) && has( object.spec.suspend )", {"metadata": PRESENT, "spec": {"suspend": PRESENT}}),
        # ... unless something else reads it
        ("has(object.metadata) && object.metadata.name != ''", {"metadata": {"name": WHOLE}}),
        ("has(object.spec) ? size(object.spec) : 0", {"spec": WHOLE}),
        # the ternary's ? is not an optional selection; an optional selection keeps what it is on
        ("object.spec.suspend ? 1 : 2", {"spec": {"suspend": WHOLE}}),
        ("object.metadata.?labels.orValue({}) == {}", {"metadata": WHOLE}),
        # names inside string literals are not reads
        ("'object.status' == object.kind", {"kind": WHOLE}),
        ('"""object.status""" + object.kind == ""', {"kind": WHOLE}),
    ],
)
def test_the_fields_an_expression_selects(source, shape):
    assert read(source) == {"object": shape}


@pytest.mark.parametrize(
    "source",
    [
        "size(object) > 0",  # the variable itself
        "object['metadata'].name == ''",  # an index, not a selection
        "object.?spec.hasValue()",  # optional selection off the variable
        "[object].all(o, o.spec.x == 1)",  # bound to a comprehension variable
        "object.kind == 'Job' // object.kind only",  # a comment: anything goes
        "other.object.kind == ''",  # not a read of the variable at all, which the program says it reads
    ],
)
def test_anything_but_a_plain_selection_reads_the_whole_variable(source):
    assert read(source) == {"object": WHOLE}


def test_the_set_reads_the_union_of_its_expressions():
    assert shapes([
        ("object.metadata.labels['a'] == ''", ["object"]),
        ("object.metadata.name == '' && workload.gpus > 0", ["object", "workload"]),
        ("has(object.spec)", ["object"]),
        ("request.namespace == ''", []),  # the program does not read it: not the caller's variable
    ]) == {"object": {"metadata": {"labels": WHOLE, "name": WHOLE}, "spec": PRESENT}, "workload": {"gpus": WHOLE}}


def test_a_cut_keeps_what_is_named_and_copies():
    job = make_job("j", "ml-team").label("team", "a").gpus(2).obj()
    shape = {"metadata": {"labels": WHOLE, "uid": WHOLE}, "spec": {"template": PRESENT, "suspend": WHOLE}}
    assert cut(job, shape) == {"metadata": {"labels": {"team": "a"}}, "spec": {"template": {}}}
    assert job["spec"]["template"]["spec"]["containers"]  # the original is untouched
    assert cut(job, WHOLE) is job
    # where the shape selects fields of something that is not a map, it is kept: CEL words the error
    assert cut({"metadata": "text"}, {"metadata": {"labels": WHOLE}}) == {"metadata": "text"}


@pytest.mark.parametrize(
    "expression, job, allowed",
    [
        ("has(object.spec.suspend)", make_job().suspend(True), True),
        ("has(object.spec.suspend)", make_job(), False),
        ("has(object.metadata.labels) && object.metadata.labels['team'] == 'a'", make_job().label("team", "a"), True),
        ("object.spec.template.spec.containers.all(c, c.image == 'img')", make_job(), True),
        ("size(object.metadata.labels) == 2", make_job().label("a", "1").label("b", "2"), True),
        ("object.metadata.labels.exists(k, k == 'a')", make_job().label("a", "1"), True),
        ("object.spec.template.spec.containers[0].name == 'c' && object.spec.parallelism == 1", make_job(), True),
    ],
)
def test_policies_decide_on_the_cut_object_as_on_the_whole_one(expression, job, allowed):
    """One set holding several policies, so each is evaluated on a cut made for all of them."""
    text = "".join(f"""
---
apiVersion: quartermaster.dev/v1alpha1
kind: AdmissionPolicy
metadata: {{name: p{i}}}
spec:
  validations:
  - expression: {source!r}
""" for i, source in enumerate([expression, "object.metadata.name != ''", "has(object.metadata)"]))
    assert evaluate(policy_set(text), job.obj()).allowed is allowed


def test_a_refusals_message_reads_what_the_decision_did_not():
    """`request` is bound only to word a refusal (every policy of policies/library reads it
    only there), and then it is this request's, not the one before."""
    text = """
apiVersion: quartermaster.dev/v1alpha1
kind: AdmissionPolicy
metadata: {name: small}
spec:
  validations:
  - expression: object.spec.parallelism < 4
    messageExpression: '"job " + request.name + " in " + request.namespace + " asks for too many pods"'
"""
    ps = policy_set(text)
    assert evaluate(ps, make_job("a", "team-a").parallelism(8).obj()).message == "[small] job a in team-a asks for too many pods"
    assert evaluate(ps, make_job("b", "team-b").parallelism(1).obj()).allowed
    assert evaluate(ps, make_job("c", "team-c").parallelism(9).obj(), make_namespace("team-c")).message == (
        "[small] job c in team-c asks for too many pods")


@pytest.mark.parametrize(
    "source, literals",
    [
        ("a == 'x' && b == \"y\"", ["'x'", '"y"']),
        ("'''it's''' + \"\\\"q\\\"\"", ["'''it's'''", '"\\"q\\""']),
        ("no literal at all", []),
        ("'unterminated", ["'unterminated"]),
    ],
)
def test_a_source_splits_into_code_and_string_literals_and_joins_back(source, literals):
    parts = split_literals(source)
    assert "".join(text for _, text in parts) == source
    assert [text for literal, text in parts if literal] == literals
