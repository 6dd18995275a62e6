"""Issue 9's must-show: `qm demo --scenario seed --json` plays the field report step by step on
the full stack (admission, queue-manager, preemption, cost-accounting), and `qm explain` on each
seed workload answers from the event trail alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seed(kafka_bootstrap) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "demo", "--scenario", "seed", "--json", "--bootstrap",
         kafka_bootstrap],
        cwd=REPO, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    outcome = json.loads(result.stdout)
    outcome["_stderr"] = result.stderr
    return outcome


def _step(seed: dict, n: int) -> dict:
    found = [s for s in seed["steps"] if s["step"] == n]
    assert len(found) == 1, seed["steps"]
    assert found[0]["ok"], json.dumps(found[0], indent=2)
    return found[0]


def _verdict(seed: dict, workload: str, at: str) -> dict:
    found = [e for e in seed["explain"] if e["workload"] == workload and e["at"] == at]
    assert found, f"no explanation of {workload} {at}: {seed['explain']}"
    return found[0]


def test_every_step_is_played_and_ok(seed):
    assert seed["ok"] is True
    assert sorted(s["step"] for s in seed["steps"]) == [1, 2, 3, 4, 5, 6]
    assert all(s["ok"] for s in seed["steps"])
    assert seed["wall_s"] < 90
    assert any(d["object"] == "Cohort ai-platform" for d in seed["config"]["differences"])


def test_step1_four_gpu_training_job_is_admitted_with_12_in_use(seed):
    s = _step(seed, 1)
    assert s["observed"]["event"] == "workload.quota_reserved.v1"
    assert s["observed"]["flavors"] == ["a100-flavor"] and s["observed"]["cluster_queue"] == "gpu-queue"
    assert s["observed"]["gpus"] == 4 and s["observed"]["in_use_before_gpus"] == 12


def test_step2_sixteen_gpu_job_pends_with_the_insufficient_quota_message(seed):
    s = _step(seed, 2)
    assert s["observed"]["event"] == "workload.pending.v1"
    assert "insufficient unused quota for nvidia.com/gpu in flavor a100-flavor, 8 more needed" in s["message"]
    e = _verdict(seed, "ml-team/train-16gpu", "after step 2")
    assert e["verdict"] == "waiting-for-quota"
    assert "8 more needed" in e["answer"]


def test_step3_namespace_maximum_refuses_with_live_usage(seed):
    s = _step(seed, 3)
    assert s["observed"]["event"] == "workload.rejected.v1"
    assert s["message"] == "namespace ml-team used 28 GPU, requesting 8, max is 32"
    assert s["observed"]["ml_team_usage_gpus"]["total"] == 28
    e = _verdict(seed, "ml-team/extra-8gpu", "after step 3")
    assert e["verdict"] == "rejected"
    assert "namespace ml-team used 28 GPU, requesting 8, max is 32" in e["answer"]
    assert _verdict(seed, "ml-team/extra-8gpu", "end")["verdict"] == "rejected"


def test_step4_reservation_that_never_starts_expires_and_is_billed_reserved_idle(seed):
    s = _step(seed, 4)
    expired = s["observed"]["expired"]
    assert expired["reserved_at"] == "2026-11-29T10:00:00Z" and expired["expired_at"] == "2026-11-29T10:05:00Z"
    assert expired["idle_s"] == 300 and expired["gpus"] == 16
    assert Decimal(s["observed"]["reserved_idle_gpu_hours"]) == Decimal("1.333333333")
    assert all(r["cost_center"] == "cc-ml" for r in s["observed"]["reserved_idle_rows"])
    # its Job is stopped (Kueue evicts on waitForPodsReady's timeout): no pod starts on released quota
    assert s["observed"]["stopped"] == [{"reason": "PodsReadyTimeout", "grace_period_s": 0}]
    e = _verdict(seed, "ml-team/stuck-16gpu", "after step 4")
    assert e["verdict"] == "prefreeze-expired"
    assert "16 GPU sat idle 300 s" in e["answer"]


def test_step5_inference_preempts_batch_but_not_training(seed):
    s = _step(seed, 5)
    o = s["observed"]
    assert o["inference_reserved"] is True and o["training_evicted"] is False
    assert o["evicted"] and all(v["workload"].startswith("ml-team/batch-") for v in o["evicted"])
    assert all(v["preemptor"] == "ml-serving/infer-8gpu" for v in o["evicted"])
    assert o["evict_actions"] and all(a["grace_period_s"] == 120 for a in o["evict_actions"])  # batch: 2m
    victim = o["evicted"][0]["workload"]
    e = _verdict(seed, victim, "after step 5")
    assert e["verdict"] == "preempted" and "by ml-serving/infer-8gpu" in e["answer"]
    assert _verdict(seed, "ml-team/train-long-16gpu", "after step 5")["verdict"] == "running"
    assert _verdict(seed, "ml-serving/infer-8gpu", "after step 5")["verdict"] in ("reserved-not-running", "running")


def test_step6_two_teams_borrow_and_lend_within_their_limits(seed):
    s = _step(seed, 6)
    o = s["observed"]
    assert o["borrow"]["event"] == "workload.quota_reserved.v1" and o["borrow"]["borrowing"] is True
    assert o["beyond_lending_limit"]["event"] == "workload.pending.v1"
    assert "insufficient unused quota" in o["beyond_lending_limit"]["message"]
    assert o["lender_own_use"]["event"] == "workload.quota_reserved.v1" and o["lender_own_use"]["gpus"] == 24
    usage = o["usage_gpus"]
    assert usage["research (nominal 16)"]["total"] == 24  # 16 nominal + 8 borrowed = gpu-queue's lendingLimit
    assert usage["ml-team (gpu-queue nominal 32)"]["total"] == 24  # 32 - 8 lent
    assert _verdict(seed, "research/research-more-4gpu", "after step 6")["verdict"] == "waiting-for-quota"
