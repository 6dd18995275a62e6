"""The field report's case on examples/seed/, and reading Kueue YAML (v1beta1/v1beta2, Jobs,
errors that name file, object and field)."""

from pathlib import Path

import pytest
import yaml
from quota_builders import GPU, T0, make_cq, make_flavor, make_lq, make_wl, schedule

from services.core.quota import ConfigError, WorkloadStatus, build_snapshot, load_objects, schedule_cycle

ROOT = Path(__file__).resolve().parents[4]
SEED = ROOT / "examples" / "seed"


def seed_docs(*extra_files):
    docs = []
    for path in [*sorted(SEED.glob("*.yaml")), *(SEED / f for f in extra_files)]:
        docs.extend((str(path), d) for d in yaml.safe_load_all(path.read_text()))
    return docs


def run(docs):
    objects = load_objects(docs)
    result = schedule_cycle(
        build_snapshot(objects), [w for w in objects.workloads if w.admission is None], T0
    )
    return objects, result.by_workload()


def test_seed_4gpu_admitted_with_12_in_use():
    objects, got = run(seed_docs("scenarios/admitted-12gpu.yaml", "scenarios/train-4gpu.yaml"))
    d = got["ml-team/train-4gpu"]
    assert d.status is WorkloadStatus.ADMITTED
    assert d.cluster_queue == "gpu-queue"
    assert d.flavors == {"main": {GPU: "a100-flavor"}}


def test_seed_16gpu_pending_with_24_in_use():
    _, got = run(
        seed_docs(
            "scenarios/admitted-12gpu.yaml", "scenarios/admitted-24gpu.yaml", "scenarios/train-16gpu.yaml"
        )
    )
    d = got["ml-team/train-16gpu"]
    assert d.status is WorkloadStatus.PENDING
    assert d.message == (
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu "
        "in flavor a100-flavor, 8 more needed"
    )


def test_seed_limits_without_cohort_warn_and_have_no_effect():
    objects, _ = run(seed_docs())
    assert len(objects.warnings) == 2
    for field, warning in zip(("borrowingLimit", "lendingLimit"), objects.warnings, strict=True):
        assert "ClusterQueue gpu-queue" in warning
        assert f"spec.resourceGroups[0].flavors[0].resources[0].{field}" in warning
        assert "no effect until the queue joins a cohort" in warning
    # 33 GPUs never fit: without a cohort the borrowingLimit of 8 does not apply
    wl = make_wl("big", "ml-team").queue("team-ml").gpu(33).obj()
    _, got = run([*seed_docs(), ("t", wl)])
    assert "maximum capacity (32)" in got["ml-team/big"].message


def test_seed_with_cohort_borrows_as_written():
    docs = []
    for path in sorted((SEED / "cohort").glob("*.yaml")):
        docs.extend((str(path), d) for d in yaml.safe_load_all(path.read_text()))
    objects = load_objects(docs)
    assert objects.warnings == ()
    from services.core.quota import drain

    got = drain(
        build_snapshot(objects), [w for w in objects.workloads if w.admission is None], T0
    ).by_workload()
    assert got["ml-team/borrow-8gpu"].status is WorkloadStatus.ADMITTED
    assert got["ml-team/borrow-8gpu"].borrowing == 1
    assert got["ml-team/over-limit-4gpu"].message == (
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor "
        "a100-flavor, 4 more needed"
    )


def test_v1beta2_field_names():
    v2 = "kueue.x-k8s.io/v1beta2"
    docs = [
        {"apiVersion": v2, "kind": "ResourceFlavor", "metadata": {"name": "f"}},
        {"apiVersion": v2, "kind": "Cohort", "metadata": {"name": "child"}, "spec": {"parentName": "root"}},
        {
            "apiVersion": v2,
            "kind": "ClusterQueue",
            "metadata": {"name": "a"},
            "spec": {
                "cohortName": "child",
                "namespaceSelector": {},
                "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": "2"}]}],
                    }
                ],
            },
        },
        {"apiVersion": v2, "kind": "WorkloadPriorityClass", "metadata": {"name": "high"}, "value": 1000},
        make_lq("lq", "a"),
        {
            "apiVersion": v2,
            "kind": "Workload",
            "metadata": {"name": "w", "namespace": "default"},
            "spec": {
                "queueName": "lq",
                "priorityClassRef": {"name": "high"},
                "podSets": [
                    {
                        "name": "main",
                        "count": 1,
                        "template": {
                            "spec": {
                                "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]
                            }
                        },
                    }
                ],
            },
        },
    ]
    objects = load_objects(("v2.yaml", d) for d in docs)
    assert objects.cluster_queues["a"].cohort == "child"
    assert objects.cohorts["child"].parent == "root"
    assert objects.workloads[0].priority == 1000
    got = schedule(docs)
    assert got["default/w"].status is WorkloadStatus.ADMITTED


def test_job_becomes_a_workload():
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": {"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": "high"},
            "annotations": {"kueue.x-k8s.io/job-min-parallelism": "2"},
        },
        "spec": {
            "parallelism": 4,
            "completions": 8,
            "template": {
                "spec": {
                    "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "4"}}}],
                    "containers": [
                        {"name": "a", "resources": {"limits": {GPU: 2, "cpu": "1"}}},
                        {"name": "b", "resources": {"requests": {"cpu": "500m"}}},
                    ],
                }
            },
        },
    }
    unlabelled = {**job, "metadata": {"name": "plain", "namespace": "ml"}}
    wpc = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": "high"},
        "value": 50,
    }
    objects = load_objects([("j.yaml", job), ("j.yaml", unlabelled), ("p.yaml", wpc)])
    (wl,) = objects.workloads
    assert wl.key == "ml/train"
    assert wl.priority == 50
    (ps,) = wl.pod_sets
    assert (ps.name, ps.count, ps.min_count) == ("main", 4, 2)
    assert dict(ps.requests) == {GPU: 2000, "cpu": 4000}  # max(init 4, 1 + 0.5)


@pytest.mark.parametrize(
    ("doc", "obj", "field", "problem"),
    [
        (
            make_cq("a").gpu("f", "lots").obj(),
            "ClusterQueue a",
            "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota",
            "not a quantity",
        ),
        (
            make_cq("a").gpu("f", -1).obj(),
            "ClusterQueue a",
            "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota",
            "must not be negative",
        ),
        (
            make_cq("a").gpu("f", 4, lending=5).cohort("c").obj(),
            "ClusterQueue a",
            "spec.resourceGroups[0].flavors[0].resources[0].lendingLimit",
            "less than or equal to nominalQuota",
        ),
        (
            make_cq("a").gpu("f", 4).spec(queueingStrategy="LIFO").obj(),
            "ClusterQueue a",
            "spec.queueingStrategy",
            "must be one of",
        ),
        (
            make_cq("a").gpu("f", 4).preemption(reclaim="Never", borrow_within="LowerPriority").obj(),
            "ClusterQueue a",
            "spec.preemption.borrowWithinCohort.policy",
            "reclaimWithinCohort is Never",
        ),
        (
            make_wl("w").podset("main", 2, min_count=3, gpu=1).obj(),
            "Workload w",
            "spec.podSets[0].minCount",
            "must be <= count",
        ),
        (
            make_wl("w").podset("main", 1, gpu="x").obj(),
            "Workload w",
            "spec.podSets[0].template.spec.containers[0].resources.requests.nvidia.com/gpu",
            "not a quantity",
        ),
        (
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "LocalQueue",
                "metadata": {"name": "q"},
                "spec": {},
            },
            "LocalQueue q",
            "spec.clusterQueue",
            "is required",
        ),
        (
            {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "spot"},
             "spec": {"nodeTaints": [{"key": "spot", "value": "true"}]}},
            "ResourceFlavor spot",
            "spec.nodeTaints[0].effect",
            "required: one of NoSchedule, PreferNoSchedule, NoExecute",
        ),
        (
            {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "spot"},
             "spec": {"nodeTaints": [{"key": "spot", "effect": "NoPlace"}]}},
            "ResourceFlavor spot",
            "spec.nodeTaints[0].effect",
            "must be one of NoSchedule, PreferNoSchedule, NoExecute, got 'NoPlace'",
        ),
    ],
)
def test_invalid_input_names_file_object_field(doc, obj, field, problem):
    with pytest.raises(ConfigError) as err:
        load_objects([("queues.yaml", make_flavor("f")), ("queues.yaml", doc)])
    assert (err.value.source, err.value.obj, err.value.field) == ("queues.yaml", obj, field)
    assert problem in str(err.value)
    assert str(err.value).startswith(f"queues.yaml: {obj}: {field}: ")


def test_duplicate_and_cycle_rejected():
    with pytest.raises(ConfigError, match="duplicate ClusterQueue"):
        load_objects([("a.yaml", make_cq("a").obj()), ("b.yaml", make_cq("a").obj())])
    with pytest.raises(ConfigError, match="cycle"):
        load_objects(
            [
                (
                    "c.yaml",
                    {
                        "apiVersion": "kueue.x-k8s.io/v1beta1",
                        "kind": "Cohort",
                        "metadata": {"name": "x"},
                        "spec": {"parent": "y"},
                    },
                ),
                (
                    "c.yaml",
                    {
                        "apiVersion": "kueue.x-k8s.io/v1beta1",
                        "kind": "Cohort",
                        "metadata": {"name": "y"},
                        "spec": {"parent": "x"},
                    },
                ),
            ]
        )


def test_unknown_kinds_ignored_and_missing_namespace_selector_warns():
    objects = load_objects(
        [
            (
                "x.yaml",
                {
                    "apiVersion": "templates.gatekeeper.sh/v1",
                    "kind": "ConstraintTemplate",
                    "metadata": {"name": "t"},
                },
            ),
            (
                "x.yaml",
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta1",
                    "kind": "ClusterQueue",
                    "metadata": {"name": "a"},
                    "spec": {},
                },
            ),
        ]
    )
    assert list(objects.cluster_queues) == ["a"]
    assert any("namespaceSelector is not set" in w for w in objects.warnings)


def test_fair_sharing_configuration_read():
    cfg = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "fairSharing": {"enable": True, "preemptionStrategies": ["LessThanInitialShare"]},
    }
    objects = load_objects([("config.yaml", cfg)])
    assert objects.config.fair_sharing.enabled
    assert [str(s) for s in objects.config.fair_sharing.preemption_strategies] == ["LessThanInitialShare"]
