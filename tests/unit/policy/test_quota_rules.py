"""QuotaRule loading: every mistake is refused naming the file, the object and the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from services.adapters.kueue_config import KueueConfig
from services.policy.errors import PolicyError
from services.policy.loader import Document, read_documents
from services.policy.quota_rules import evaluate, load_quota_rules

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "dynamic-quota"
OBJECTS = KueueConfig.load(EXAMPLE).objects
SEED_OBJECTS = KueueConfig.load(EXAMPLE.parent / "seed").objects  # gpu-queue has no cohort
RULE = {
    "apiVersion": "quartermaster.dev/v1alpha1", "kind": "QuotaRule", "metadata": {"name": "burst"},
    "spec": {"clusterQueue": "team-a", "rules": [{"when": "cluster.gpuUtilization < 0.4", "borrowingLimit": 16}]},
}


def rule(**spec_changes) -> Document:
    body = copy.deepcopy(RULE)
    body["spec"].update(spec_changes)
    return Document("rules.yaml", 0, body)


def refused(doc: Document, objects=OBJECTS) -> PolicyError:
    with pytest.raises(PolicyError) as error:
        load_quota_rules([doc], objects)
    assert error.value.file == "rules.yaml" and error.value.obj == "QuotaRule/burst"
    return error.value


def test_the_example_loads_with_the_flavor_it_names():
    (loaded,) = load_quota_rules(read_documents(EXAMPLE)[0], OBJECTS)
    assert loaded.key == ("team-a", "a100-flavor", "nvidia.com/gpu")
    assert loaded.rules[0].borrowing_limit == 16_000


def test_the_flavor_may_be_left_out_when_the_queue_has_one():
    (loaded,) = load_quota_rules([rule()], OBJECTS)
    assert loaded.flavor == "a100-flavor"


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"clusterQueue": "team-z"}, "spec.clusterQueue", "no ClusterQueue 'team-z' (known: team-a, team-b)"),
    ({"flavor": "h100-flavor"}, "spec.flavor", "no quota of nvidia.com/gpu in flavor 'h100-flavor'"),
    ({"rules": []}, "spec.rules", "non-empty list"),
    ({"rules": [{"when": "cluster.gpuUtilization <"}]}, "spec.rules[0]", "`when` (CEL) and `borrowingLimit`"),
    ({"rules": [{"when": "cluster.gpuUtilization <", "borrowingLimit": 1}]}, "spec.rules[0].when", "invalid CEL"),
    ({"rules": [{"when": "object.spec.x > 1", "borrowingLimit": 1}]}, "spec.rules[0].when", "unknown variable(s) object"),
    ({"rules": [{"when": "true", "borrowingLimit": "lots"}]}, "spec.rules[0].borrowingLimit", "not a quantity"),
    ({"rules": [{"when": "true", "borrowingLimit": -1}]}, "spec.rules[0].borrowingLimit", "must not be negative"),
])
def test_a_mistake_is_named(change, field, words):
    error = refused(rule(**change))
    assert error.field == field and words in error.reason


def test_a_queue_without_a_cohort_has_nothing_to_borrow_from():
    error = refused(rule(clusterQueue="gpu-queue"), SEED_OBJECTS)
    assert error.field == "spec.clusterQueue" and "has no cohort" in error.reason


def test_two_rules_for_one_queue_are_refused():
    second = Document("rules.yaml", 1, copy.deepcopy(RULE))
    with pytest.raises(PolicyError, match="already has a QuotaRule"):
        load_quota_rules([rule(), second], OBJECTS)


def test_first_true_rule_wins_and_none_true_means_the_configured_limit():
    (loaded,) = load_quota_rules([rule(rules=[
        {"when": "cluster.gpuUtilization < 0.2", "borrowingLimit": 32},
        {"when": "cluster.gpuUtilization < 0.4 && clusterQueue.nominal == 16.0", "borrowingLimit": "8"},
        {"when": "cluster.gpuInUse > 1000", "borrowingLimit": None},
    ])], OBJECTS)

    def effective(utilization):
        outcome = evaluate([loaded], {"gpuUtilization": utilization, "gpuInUse": 10}, OBJECTS)[loaded.key]
        return outcome.effective, outcome.static

    assert effective(0.1) == (32_000, 0)
    assert effective(0.3) == (8_000, 0)
    assert effective(0.9) == (0, 0)
