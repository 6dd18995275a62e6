"""`qm status` as a pure function: per-queue counts and GPUs, latest usage and budget."""

from __future__ import annotations

from services.contracts.events import BudgetStatus, UsageSnapshot
from services.explain.status import status
from tests.unit.explain.test_explainer import env, other_holders, pending, submitted, validated


def test_status_counts_queues_usage_and_budgets():
    trail = [*other_holders(), submitted(), validated(), pending("WaitingForQuota", "insufficient unused quota"),
             env(UsageSnapshot(namespace="ml-team", reserved={"a100-flavor": {"nvidia.com/gpu": 8000}},
                               running={"a100-flavor": {"nvidia.com/gpu": 16000}}, total={"nvidia.com/gpu": 24000},
                               as_of="2026-11-29T10:00:05Z"), 5),
             env(BudgetStatus(cost_center="cc-ml", period="2026-11", unit="GPU-Hours", limit="1000", used="10",
                              remaining="990", exhausted=False), 6)]
    s = status(trail)
    assert s.queues["gpu-queue"] == {"pending": 1, "reserved": 1, "running": 1, "gpu_reserved": 8000,
                                     "gpu_running": 16000}
    assert s.usage["ml-team"]["running"] == {"a100-flavor": {"nvidia.com/gpu": 16000}}
    assert s.budgets["cc-ml"]["remaining"] == "990"
    assert s.to_dict()["as_of"] == "2026-11-29T10:00:06Z"
