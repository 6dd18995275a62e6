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
