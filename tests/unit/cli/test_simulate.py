"""`qm simulate` end to end through Typer (CliRunner), on the seed and on bad input."""

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from services.cli import simulate_cmd

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "examples" / "seed"


def app() -> typer.Typer:
    a = typer.Typer()
    simulate_cmd.register(a)

    @a.callback()
    def _root() -> None:  # keep "simulate" as a sub-command
        pass

    return a


def invoke(*args: str):
    runner = CliRunner()
    return runner.invoke(app(), ["simulate", *args])


def workloads(result) -> dict:
    return {w["workload"]: w for w in json.loads(result.stdout)["workloads"]}


def test_seed_4gpu_admitted():
    r = invoke(
        "-f",
        str(SEED),
        "-f",
        str(SEED / "scenarios/admitted-12gpu.yaml"),
        "-f",
        str(SEED / "scenarios/train-4gpu.yaml"),
    )
    assert r.exit_code == 0, r.output
    w = workloads(r)["ml-team/train-4gpu"]
    assert w["status"] == "Admitted"
    assert w["clusterQueue"] == "gpu-queue"
    assert w["flavors"] == {"main": {"nvidia.com/gpu": "a100-flavor"}}
    assert w["counts"] == {"main": 1}
    assert w["preempts"] == []
    assert "no effect until the queue joins a cohort" in r.stderr


def test_seed_16gpu_pending_message():
    r = invoke(
        "-f",
        str(SEED),
        "-f",
        str(SEED / "scenarios/admitted-12gpu.yaml"),
        "-f",
        str(SEED / "scenarios/admitted-24gpu.yaml"),
        "-f",
        str(SEED / "scenarios/train-16gpu.yaml"),
    )
    assert r.exit_code == 0, r.output
    w = workloads(r)["ml-team/train-16gpu"]
    assert w["status"] == "Pending"
    assert w["message"].endswith(
        "insufficient unused quota for nvidia.com/gpu in flavor a100-flavor, 8 more needed"
    )


def test_drain_and_cycles_modes():
    r = invoke("-f", str(SEED / "cohort"), "--mode", "drain")
    assert r.exit_code == 0, r.output
    got = workloads(r)
    assert got["ml-team/borrow-8gpu"]["status"] == "Admitted"
    assert got["ml-team/over-limit-4gpu"]["message"].endswith("4 more needed")
    one = workloads(invoke("-f", str(SEED / "cohort")))
    assert one["ml-team/over-limit-4gpu"]["status"] == "Pending"
    assert one["ml-team/over-limit-4gpu"]["reason"] == "Queued"
    two = workloads(invoke("-f", str(SEED / "cohort"), "--cycles", "2"))
    assert two["ml-team/over-limit-4gpu"]["message"].endswith("4 more needed")


def test_invalid_input_exit_2_with_file_object_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata:\n  name: q\nspec:\n"
        "  namespaceSelector: {}\n  resourceGroups:\n  - coveredResources: [cpu]\n    flavors:\n"
        "    - name: f\n      resources:\n      - name: cpu\n        nominalQuota: lots\n"
    )
    r = invoke("-f", str(bad))
    assert r.exit_code == 2
    assert f"{bad}: ClusterQueue q: spec.resourceGroups[0].flavors[0].resources[0].nominalQuota:" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_invalid_yaml_and_missing_path(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed\n")
    r = invoke("-f", str(broken))
    assert r.exit_code == 2
    assert "invalid YAML" in r.stderr
    r = invoke("-f", str(tmp_path / "nope.yaml"))
    assert r.exit_code == 2
    assert "no such file or directory" in r.stderr
