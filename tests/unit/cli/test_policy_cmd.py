"""`qm policy test|check|what-if` end to end through Typer, on files."""

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from services.cli import policy_cmd

ROOT = Path(__file__).resolve().parents[3]
LIBRARY = ROOT / "policies" / "library"
GPU_MAX = LIBRARY / "namespace-gpu-max"


@pytest.fixture
def qm():
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    policy_cmd.register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["policy", *map(str, args)])


def test_library_suites_pass(qm):
    r = qm("test", LIBRARY)
    assert r.exit_code == 0, r.output
    assert "PASS namespace-gpu-max/ml-team-max-32/field-report-8-more-with-28-used-is-refused" in r.output
    assert "PASS k8srequiredlabels/require-cost-center-and-queue/example-disallowed" in r.output
    assert ", 0 failed, 5 suite(s)" in r.output


def test_failing_case_exits_non_zero_and_says_why(qm, tmp_path):
    suite = (GPU_MAX / "suite.yaml").read_text().replace("violations: 1", "violations: 2", 1)
    for f in ("template.yaml", "samples"):
        (tmp_path / f).symlink_to(GPU_MAX / f)
    (tmp_path / "suite.yaml").write_text(suite)
    r = qm("test", tmp_path)
    assert r.exit_code == 1
    assert "FAIL namespace-gpu-max/ml-team-max-32/field-report-8-more-with-28-used-is-refused" in r.output
    assert "want 2 violation(s)" in r.output and "1 failed" in r.output


def test_no_suites_is_an_error(qm, tmp_path):
    assert qm("test", tmp_path).exit_code == 2


def test_check_names_file_object_field(qm, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (LIBRARY / "data-labelling-region" / "policy.yaml")
        .read_text()
        .replace("size(variables.regions) > 0 &&", "size(variables.regions) > 0 &&&")
    )
    r = qm("check", bad)
    assert r.exit_code == 1
    assert (
        f"{bad}: AdmissionPolicy/data-labelling-region: spec.validations[0].expression: invalid CEL"
        in r.output
    )
    assert qm("check", LIBRARY).exit_code == 0


SNAPSHOT = """
apiVersion: v1
kind: List
items:
- apiVersion: batch/v1
  kind: Job
  metadata: {name: running-16, namespace: ml-team, labels: {kueue.x-k8s.io/queue-name: team-ml}}
  spec:
    suspend: false
    parallelism: 2
    template: {spec: {containers: [{name: c, image: i, resources: {limits: {nvidia.com/gpu: "8"}}}]}}
- apiVersion: batch/v1
  kind: Job
  metadata: {name: pending-8, namespace: ml-team, labels: {kueue.x-k8s.io/queue-name: team-ml}}
  spec:
    suspend: true
    parallelism: 1
    template: {spec: {containers: [{name: c, image: i, resources: {limits: {nvidia.com/gpu: "8"}}}]}}
- apiVersion: batch/v1
  kind: Job
  metadata: {name: small-2, namespace: ml-team}
  spec:
    suspend: true
    template: {spec: {containers: [{name: c, image: i, resources: {limits: {nvidia.com/gpu: "2"}}}]}}
- apiVersion: batch/v1
  kind: Job
  metadata: {name: elsewhere, namespace: research}
  spec:
    template: {spec: {containers: [{name: c, image: i, resources: {limits: {nvidia.com/gpu: "64"}}}]}}
"""

USAGE = """
- namespace: ml-team
  reserved: {}
  running: {a100-flavor: {nvidia.com/gpu: 16000}}
  total: {nvidia.com/gpu: 16000}
"""


def test_what_if_tightening_lists_who_would_be_blocked(qm, tmp_path):
    tightened = tmp_path / "tightened.yaml"
    tightened.write_text(
        (GPU_MAX / "samples/ml-team-max-32/constraint.yaml").read_text().replace("maxGpu: 32", "maxGpu: 20")
    )
    (tmp_path / "workloads.yaml").write_text(SNAPSHOT)
    (tmp_path / "usage.yaml").write_text(USAGE)
    r = qm("what-if", "-f", tightened, "--policies", LIBRARY, "--workloads", tmp_path / "workloads.yaml",
           "--usage", tmp_path / "usage.yaml", "-o", "json")  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    rows = {(row["name"], row["message"]) for row in out["rows"]}
    # running-16 is already inside the usage: it is evaluated as 0 (others) + 16 <= 20 → fine.
    assert rows == {("pending-8", "namespace ml-team used 16 GPU, requesting 8, max is 20")}
    assert out["evaluated"] == 4 and out["newlyBlocked"] == 1


def test_what_if_table_and_fail_on_block(qm, tmp_path):
    tightened = tmp_path / "tightened.yaml"
    tightened.write_text(
        (GPU_MAX / "template.yaml").read_text()
        + "---\n"
        + (GPU_MAX / "samples/ml-team-max-32/constraint.yaml").read_text().replace("maxGpu: 32", "maxGpu: 16")
    )
    (tmp_path / "workloads.yaml").write_text(SNAPSHOT)
    (tmp_path / "usage.yaml").write_text(USAGE)
    r = qm("what-if", "-f", tightened, "--workloads", tmp_path / "workloads.yaml", "--usage", tmp_path / "usage.yaml",
           "--fail-on-block")  # fmt: skip
    assert r.exit_code == 3, r.output
    assert "4 workloads evaluated, 2 would be blocked (2 newly)" in r.output
    assert (
        "DENY   ml-team/small-2 [Job] ban-excess-gpu-ml-team: namespace ml-team used 16 GPU, requesting 2, max is 16"
        in r.output
    )


def test_what_if_invalid_policy(qm, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (GPU_MAX / "samples/ml-team-max-32/constraint.yaml").read_text().replace("maxGpu: 32", "maxGpu: many")
    )
    (tmp_path / "w.yaml").write_text(SNAPSHOT)
    r = qm("what-if", "-f", bad, "--policies", LIBRARY, "--workloads", tmp_path / "w.yaml")
    assert r.exit_code == 1 and "spec.parameters.maxGpu" in r.output


WHERE_JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: finetune
  namespace: ml-team
  labels: {kueue.x-k8s.io/queue-name: team-ml, quartermaster.dev/cost-center: cc-ml}
spec:
  parallelism: 2
  template:
    spec:
      containers: [{name: trainer, image: pytorch, resources: {limits: {nvidia.com/gpu: "4"}}}]
"""
TWO_CLASSES = """
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: a100-flavor}
spec: {nodeLabels: {gpu.nvidia.com/class: a100}}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: h100-flavor}
spec: {nodeLabels: {gpu.nvidia.com/class: h100}}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: reserved-flavor}
spec: {nodeTaints: [{key: reserved, value: research, effect: NoSchedule}]}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: gpu-queue}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - {name: reserved-flavor, resources: [{name: nvidia.com/gpu, nominalQuota: 8}]}
    - {name: a100-flavor, resources: [{name: nvidia.com/gpu, nominalQuota: 8}]}
    - {name: h100-flavor, resources: [{name: nvidia.com/gpu, nominalQuota: 8}]}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: team-ml, namespace: ml-team}
spec: {clusterQueue: gpu-queue}
"""


def test_where_says_which_flavors_take_a_job_and_why_not_the_others(qm, tmp_path):
    """ADR 0070-0072: an unapproved ml-team's Job, in a queue of a tainted flavor, A100s and H100s."""
    job = tmp_path / "job.yaml"
    job.write_text(WHERE_JOB)
    config = tmp_path / "config"
    config.mkdir()
    (config / "kueue.yaml").write_text(TWO_CLASSES)
    r = qm("where", job, "--config", config, "--policies", LIBRARY)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "ml-team/finetune in LocalQueue team-ml -> ClusterQueue gpu-queue"
    assert lines[1] == "  main nvidia.com/gpu on reserved-flavor: not offered: untolerated taint reserved=research:NoSchedule"
    assert lines[2].startswith("  main nvidia.com/gpu on a100-flavor: refused by policy: [a100-approved-projects] "
                               "namespace ml-team is not approved for a100")
    assert lines[3:] == ["  main nvidia.com/gpu on h100-flavor: allowed", "it can run on the flavors marked allowed"]
    # the field report's queue has A100s alone: nowhere to run, exit 3; approved, it runs there
    r = qm("where", job, "--config", ROOT / "examples" / "seed", "--policies", LIBRARY, "-o", "json")
    assert r.exit_code == 3 and json.loads(r.output)["canRun"] is False, r.output
    state = tmp_path / "state.yaml"
    state.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: ml-team, labels: "
                     "{quartermaster.dev/approved: 'true'}}\n")
    r = qm("where", job, "--config", ROOT / "examples" / "seed", "--policies", LIBRARY, "--state", state, "-o", "json")
    assert r.exit_code == 0 and json.loads(r.output)["flavors"] == [
        {"pod_set": "main", "resource": "nvidia.com/gpu", "flavor": "a100-flavor", "verdict": "allowed", "why": ""}]


def test_where_keeps_a_job_that_allows_a100_or_h100_off_a100_alone(qm, tmp_path):
    """ADR 0073: the unapproved ml-team's pods may run on A100 or H100 nodes (required node
    affinity). It is not refused as submitted; only the A100 flavor is."""
    job = tmp_path / "job.yaml"
    job.write_text(WHERE_JOB.replace("    spec:\n      containers:", "    spec:\n      affinity: {nodeAffinity: {"
                                     "requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{"
                                     "matchExpressions: [{key: gpu.nvidia.com/class, operator: In, "
                                     "values: [a100, h100]}]}]}}}\n      containers:"))
    assert "values: [a100, h100]" in job.read_text()
    config = tmp_path / "config"
    config.mkdir()
    (config / "kueue.yaml").write_text(TWO_CLASSES)
    r = qm("where", job, "--config", config, "--policies", LIBRARY, "-o", "json")
    assert r.exit_code == 0, r.output
    verdicts = {row["flavor"]: row["verdict"] for row in json.loads(r.output)["flavors"]}
    assert verdicts == {"reserved-flavor": "not offered", "a100-flavor": "refused by policy", "h100-flavor": "allowed"}


def test_where_names_a_missing_local_queue(qm, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(WHERE_JOB.replace("queue-name: team-ml", "queue-name: nope"))
    r = qm("where", job, "--config", ROOT / "examples" / "seed", "--policies", LIBRARY)
    assert r.exit_code == 2 and "no LocalQueue 'nope' in namespace ml-team" in r.output
