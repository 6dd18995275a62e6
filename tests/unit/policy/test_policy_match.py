import pytest
from policy_builders import make_job, make_namespace

from services.policy.match import MatchError, matches, parse_match


def m(raw):
    return parse_match(raw, "f.yaml", "K/x", "spec.match")


JOB = make_job("train", "ml-team").label("app", "trainer").obj()
NS = make_namespace("ml-team", approved="true")
CLUSTER_OBJ = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}}


@pytest.mark.parametrize(
    "raw, obj, ns, expected",
    [
        (None, JOB, NS, True),
        ({"kinds": [{"apiGroups": ["batch"], "kinds": ["Job"]}]}, JOB, NS, True),
        ({"kinds": [{"apiGroups": [""], "kinds": ["Job"]}]}, JOB, NS, False),
        ({"kinds": [{"apiGroups": ["*"], "kinds": ["*"]}]}, JOB, NS, True),
        ({"kinds": [{"kinds": ["Job"]}]}, JOB, NS, True),
        ({"kinds": [{"apiGroups": ["batch"], "kinds": ["CronJob"]}]}, JOB, NS, False),
        ({"namespaces": ["ml-*"]}, JOB, NS, True),
        ({"namespaces": ["*-team"]}, JOB, NS, True),
        ({"namespaces": ["research"]}, JOB, NS, False),
        ({"namespaces": ["research"]}, CLUSTER_OBJ, None, True),  # cluster-scoped: not filtered
        ({"excludedNamespaces": ["ml-team"]}, JOB, NS, False),
        ({"excludedNamespaces": ["kube-*"]}, JOB, NS, True),
        ({"scope": "Namespaced"}, JOB, NS, True),
        ({"scope": "Cluster"}, JOB, NS, False),
        ({"scope": "Cluster"}, CLUSTER_OBJ, None, True),
        ({"scope": "Cluster"}, NS, None, True),  # a Namespace is cluster-scoped
        ({"labelSelector": {"matchLabels": {"app": "trainer"}}}, JOB, NS, True),
        ({"labelSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["trainer"]}]}}, JOB, NS, False),
        ({"labelSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}}, JOB, NS, True),
        ({"namespaceSelector": {"matchLabels": {"approved": "true"}}}, JOB, NS, True),
        ({"namespaceSelector": {"matchLabels": {"approved": "false"}}}, JOB, NS, False),
        ({"namespaceSelector": {"matchLabels": {"approved": "true"}}}, NS, None, True),  # the Namespace itself
        ({"namespaceSelector": {"matchLabels": {"approved": "true"}}}, CLUSTER_OBJ, None, True),
        ({"name": "tr*"}, JOB, NS, True),
        ({"name": "other"}, JOB, NS, False),
    ],
)  # fmt: skip
def test_gatekeeper_match_semantics(raw, obj, ns, expected):
    assert matches(m(raw), obj, ns) is expected


def test_namespace_selector_without_namespace_object_is_an_error():
    with pytest.raises(MatchError, match="ml-team"):
        matches(m({"namespaceSelector": {"matchLabels": {"a": "b"}}}), JOB, None)


def test_operations_extension():
    assert matches(m({"operations": ["CREATE"]}), JOB, NS, "UPDATE") is False
    assert matches(m({"operations": ["CREATE"]}), JOB, NS, "CREATE") is True
