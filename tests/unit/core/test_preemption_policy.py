"""The PreemptionPolicy filter over the core's candidates (table tests), and the core's
minimal victim search run over allowed candidates only."""

from __future__ import annotations

import pytest

from services.core.preemption_policy import (
    DEFAULT_POLICY,
    BlockReason,
    Candidate,
    History,
    PolicyError,
    filter_victims,
    over_budget,
    parse_policy,
)
from services.core.quota import (
    AdmittedWorkload,
    PodSet,
    Workload,
    build_snapshot,
    load_objects,
    preemption_targets,
)

NOW = 1_800_000_000.0
MIN = 60.0
HOUR = 3600.0


def wl(name, cls=None, prio=0, ns="default", ran_s=2 * HOUR):
    """A candidate (or preemptor) of a class, started `ran_s` seconds before NOW."""
    labels = {"quartermaster.dev/class": cls} if cls else {}
    return Candidate(uid=f"uid-{name}", namespace=ns, name=name, priority=prio, labels=labels, started_at=NOW - ran_s)


def hist(preempted=None, namespaces=None):
    return History(
        preemptions={f"uid-{k}": tuple(NOW - ago for ago in v) for k, v in (preempted or {}).items()},
        namespace_preemptions={k: tuple(NOW - ago for ago in v) for k, v in (namespaces or {}).items()},
    )


INF_HIGH = wl("chat", "inference", prio=1000)
BATCH_HIGH = wl("etl", "batch", prio=500)
TRAIN_HIGH = wl("pretrain", "training", prio=1000)

CASES = [
    # (name, preemptor, candidate, history, allowed?, block reason)
    ("training is never chosen by default, not even by high inference", INF_HIGH, wl("llm-ft", "training"), hist(),
     False, BlockReason.NOT_PREEMPTIBLE),
    ("training is not chosen by higher-priority training", TRAIN_HIGH, wl("llm-ft", "training"), hist(),
     False, BlockReason.NOT_PREEMPTIBLE),
    ("inference-high preempts batch-low", INF_HIGH, wl("b", "batch", prio=0), hist(), True, None),
    ("inference-high preempts lower inference", INF_HIGH, wl("old-chat", "inference", prio=10), hist(), True, None),
    ("inference does not preempt equal-priority batch", INF_HIGH, wl("b", "batch", prio=1000), hist(),
     False, BlockReason.NOT_ALLOWED_BY_PREEMPTOR),
    ("batch does not preempt inference, even of lower priority", BATCH_HIGH, wl("chat-low", "inference", prio=0),
     hist(), False, BlockReason.NOT_ALLOWED_BY_PREEMPTOR),
    ("batch preempts lower batch (Kueue's behaviour)", BATCH_HIGH, wl("b", "batch"), hist(), True, None),
    ("training may preempt lower batch", TRAIN_HIGH, wl("b", "batch"), hist(), True, None),
    ("an unlabelled workload is batch", INF_HIGH, wl("plain"), hist(), True, None),
    ("minimum runtime: started 2 minutes ago is not a candidate", INF_HIGH, wl("b", "batch", ran_s=2 * MIN), hist(),
     False, BlockReason.MIN_RUNTIME),
    ("minimum runtime: 5 minutes reached", INF_HIGH, wl("b", "batch", ran_s=5 * MIN), hist(), True, None),
    ("cap: preempted 3 times within the hour", INF_HIGH, wl("b", "batch"), hist({"b": [5 * MIN, 20 * MIN, 40 * MIN]}),
     False, BlockReason.MAX_PREEMPTIONS),
    ("cap: 2 within the hour, 1 older", INF_HIGH, wl("b", "batch"), hist({"b": [5 * MIN, 20 * MIN, 61 * MIN]}),
     True, None),
    ("namespace budget (20/hour) used up", INF_HIGH, wl("b", "batch", ns="batch-team"),
     hist(namespaces={"batch-team": [MIN] * 20}), False, BlockReason.NAMESPACE_BUDGET),
    ("namespace budget: 19 used", INF_HIGH, wl("b", "batch", ns="batch-team"),
     hist(namespaces={"batch-team": [MIN] * 19}), True, None),
]


@pytest.mark.parametrize(("preemptor", "candidate", "history", "ok", "reason"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_default_policy(preemptor, candidate, history, ok, reason):
    allowed, blocked = filter_victims([candidate], preemptor, history, NOW)
    assert bool(allowed) is ok
    if ok:
        assert allowed[0].candidate == candidate
        assert allowed[0].grace_period_s == DEFAULT_POLICY.class_of(candidate.labels).grace_period_s
    else:
        assert blocked[0].reason is reason


def test_messages_name_the_blocking_policy():
    _, blocked = filter_victims([wl("llm-ft", "training", ns="ml-team")], INF_HIGH, hist(), NOW)
    assert blocked[0].message.startswith("would need to preempt training job ml-team/llm-ft, which is not preemptible")
    _, blocked = filter_victims([wl("b", "batch")], INF_HIGH, hist({"b": [MIN, 2 * MIN, 3 * MIN]}), NOW)
    assert "already preempted 3 times in the last 1h (maxPreemptionsPerWorkload 3" in blocked[0].message
    _, blocked = filter_victims([wl("b", "batch", ran_s=90)], INF_HIGH, hist(), NOW)
    assert "has run 1m30s of its minRuntimeBeforePreemption 5m" in blocked[0].message


def test_allowed_victims_carry_the_rule_and_grace_period():
    allowed, _ = filter_victims([wl("b", "batch"), wl("c", "inference", prio=1)], INF_HIGH, hist(), NOW)
    assert [(a.candidate.name, a.rule, a.grace_period_s) for a in allowed] == [
        ("b", "default: inference mayPreempt batch of lower priority", 120),
        ("c", "default: inference mayPreempt inference of lower priority", 30),
    ]


def test_a_chosen_set_larger_than_the_namespace_budget_left_is_refused():
    victims = [wl(f"b{i}", "batch", ns="batch-team") for i in range(3)]
    assert over_budget(victims, hist(namespaces={"batch-team": [MIN] * 17}), NOW) is None
    message = over_budget(victims, hist(namespaces={"batch-team": [MIN] * 18}), NOW)
    assert message.startswith("would need to preempt 3 workloads in namespace batch-team, which has 2 of its")


# --------------------------------------------------------------------------- parsing


def policy_doc(**spec):
    return {"apiVersion": "quartermaster.dev/v1alpha1", "kind": "PreemptionPolicy", "metadata": {"name": "p"},
            "spec": spec}


def test_parse_overrides_defaults_and_keeps_the_rest():
    policy = parse_policy(policy_doc(
        classes=[{"name": "training", "preemptible": True, "gracePeriod": "15m", "minRuntimeBeforePreemption": "1h"},
                 {"name": "inference", "mayPreempt": [{"class": "training", "priority": "Lower"}, "batch"]}],
        preemptionBudgetPerHour=5, namespaces={"ml-team": {"preemptionBudgetPerHour": 1}}))
    training = policy.by_name("training")
    assert (training.preemptible, training.grace_period_s, training.min_runtime_s) == (True, 900, 3600)
    assert policy.by_name("batch") == DEFAULT_POLICY.by_name("batch")
    assert (policy.budget_of("ml-team"), policy.budget_of("other")) == (1, 5)
    allowed, _ = filter_victims([wl("llm-ft", "training")], INF_HIGH, hist(), NOW, policy=policy)
    assert allowed[0].rule == "p: inference mayPreempt training of lower priority"


def test_selectors_with_expressions_and_first_match_wins():
    policy = parse_policy(policy_doc(classes=[
        {"name": "training", "selector": {"matchExpressions": [
            {"key": "app.kubernetes.io/component", "operator": "In", "values": ["trainer", "finetune"]}]}}]))
    assert policy.class_of({"app.kubernetes.io/component": "finetune"}).name == "training"
    assert policy.class_of({"quartermaster.dev/class": "inference"}).name == "inference"
    assert policy.class_of({}).name == "batch"


@pytest.mark.parametrize(("spec", "field"), [
    ({"classes": [{"name": "batch", "gracePeriod": "soon"}]}, "spec.classes[0].gracePeriod"),
    ({"classes": [{"name": "batch", "mayPreempt": [{"class": "gpu-hogs"}]}]}, "spec.classes[batch].mayPreempt"),
    ({"classes": [{"name": "batch", "mayPreempt": [{"class": "batch", "priority": "Higher"}]}]},
     "spec.classes[0].mayPreempt[0].priority"),
    ({"classes": [{"name": "batch", "maxPreemptionsPerWorkload": -1}]}, "spec.classes[0].maxPreemptionsPerWorkload"),
    ({"defaultClass": "nope"}, "spec.defaultClass"),
])
def test_invalid_policies_name_file_object_and_field(spec, field):
    with pytest.raises(PolicyError) as error:
        parse_policy(policy_doc(**spec), source="policy.yaml")
    assert error.value.field == field
    assert str(error.value).startswith("policy.yaml: PreemptionPolicy p: ")


# --------------------------------------------------------------------------- with the quota core


def kueue(nominal=10):
    docs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "f"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "cq"},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                      {"name": "f", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": nominal}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "q", "namespace": "default"},
         "spec": {"clusterQueue": "cq"}},
    ]
    return load_objects(("kueue.yaml", d) for d in docs)


def admitted(name, gpus, prio, reserved_ago):
    return AdmittedWorkload(key=f"default/{name}", cluster_queue="cq", priority=prio,
                            usage=((("f", "nvidia.com/gpu"), gpus * 1000),), quota_reserved_at=NOW - reserved_ago,
                            uid=f"uid-{name}")


def plan(objects, running, candidates, preemptor, gpus, history=None):
    allowed, _ = filter_victims(candidates, preemptor, history or hist(), NOW)
    ok = {a.candidate.uid for a in allowed}
    pending = Workload(namespace="default", name=preemptor.name, queue_name="q", priority=preemptor.priority,
                       pod_sets=(PodSet("main", 1, (("nvidia.com/gpu", gpus * 1000),)),), created_at=NOW,
                       uid=preemptor.uid)
    snapshot = build_snapshot(objects, running)
    unfiltered = preemption_targets(snapshot, pending, NOW)
    filtered = preemption_targets(snapshot, pending, NOW, may_preempt=lambda w: w.uid in ok)
    return ([t.workload.split("/")[1] for t in unfiltered.targets],
            sorted(t.workload.split("/")[1] for t in filtered.targets))


def test_the_minimal_set_is_searched_among_allowed_candidates_only():
    # Kueue alone takes the most recently admitted lowest-priority workload: the training run.
    # Filtering that set afterwards leaves nothing; searching the allowed ones finds one batch
    # victim (the 4-GPU one) and not the removal-order prefix {b-small, b-big}.
    running = [admitted("llm-ft", 4, 0, 10 * MIN), admitted("b-small", 2, 0, 2 * HOUR), admitted("b-big", 4, 1, HOUR)]
    cands = [wl("llm-ft", "training"), wl("b-small", "batch"), wl("b-big", "batch", prio=1)]
    unfiltered, filtered = plan(kueue(10), running, cands, INF_HIGH, 4)
    assert unfiltered == ["llm-ft"]
    assert filtered == ["b-big"]


def test_the_filtered_set_takes_several_small_victims_when_needed():
    running = [admitted("llm-ft", 4, 0, 10 * MIN), admitted("b1", 2, 0, 2 * HOUR), admitted("b2", 2, 0, HOUR),
               admitted("b3", 2, 0, 3 * HOUR)]
    cands = [wl("llm-ft", "training"), wl("b1", "batch"), wl("b2", "batch"), wl("b3", "batch")]
    _, filtered = plan(kueue(10), running, cands, INF_HIGH, 4)
    assert filtered == ["b1", "b2"]  # most recently admitted first, and no more than needed


def test_protected_by_cap_or_runtime_means_no_set_rather_than_a_protected_victim():
    running = [admitted("llm-ft", 4, 0, 10 * MIN), admitted("b1", 6, 0, HOUR)]
    cands = [wl("llm-ft", "training"), wl("b1", "batch")]
    _, filtered = plan(kueue(10), running, cands, INF_HIGH, 6)
    assert filtered == ["b1"]
    _, filtered = plan(kueue(10), running, cands, INF_HIGH, 6, hist({"b1": [MIN, 2 * MIN, 3 * MIN]}))
    assert filtered == []


def test_default_behaviour_of_the_core_is_unchanged_without_a_predicate():
    running = [admitted("llm-ft", 4, 0, 10 * MIN), admitted("b1", 6, 0, HOUR)]
    pending = Workload(namespace="default", name="x", queue_name="q", priority=5,
                       pod_sets=(PodSet("main", 1, (("nvidia.com/gpu", 4000),)),), created_at=NOW, uid="uid-x")
    snapshot = build_snapshot(kueue(10), running)
    assert preemption_targets(snapshot, pending, NOW) == preemption_targets(snapshot, pending, NOW, may_preempt=None)
