"""Cluster signals and effective borrowingLimits: pure arithmetic over facts."""

from __future__ import annotations

from pathlib import Path

from services.adapters.kueue_config import KueueConfig
from services.core.quota.dynamic import cluster_signals, static_borrowing_limit, with_borrowing_limits

OBJECTS = KueueConfig.load(Path(__file__).resolve().parents[4] / "examples" / "dynamic-quota").objects
KEY = ("team-a", "a100-flavor", "nvidia.com/gpu")


def test_utilization_counts_reserved_and_running_gpus_against_the_nodes():
    nodes = {"n1": {"flavor": "a100-flavor", "gpu": 8000}, "n2": {"flavor": "a100-flavor", "gpu": 8000}}
    usages = [
        {"reserved": {"a100-flavor": {"nvidia.com/gpu": 2000, "cpu": 64000}}, "running": {}},
        {"reserved": {}, "running": {"a100-flavor": {"nvidia.com/gpu": 4000}}},
    ]
    signals = cluster_signals(nodes, usages, OBJECTS)
    assert (signals["gpuCapacity"], signals["gpuReserved"], signals["gpuRunning"], signals["gpuInUse"]) == (16, 2, 4, 6)
    assert signals["gpuUtilization"] == 0.375 and signals["capacitySource"] == "nodes"
    assert signals["byFlavor"]["a100-flavor"]["utilization"] == 0.375


def test_without_nodes_the_nominal_quota_stands_in_for_capacity():
    signals = cluster_signals({}, [], OBJECTS)
    assert signals["gpuCapacity"] == 64 and signals["capacitySource"] == "quota"
    assert signals["gpuUtilization"] == 0


def test_nothing_at_all_reads_as_full():
    from services.core.quota import Objects

    assert cluster_signals({}, [], Objects())["gpuUtilization"] == 1.0


def test_only_the_named_limit_changes():
    changed = with_borrowing_limits(OBJECTS, {KEY: 16_000})
    assert static_borrowing_limit(OBJECTS, KEY) == (True, 0)
    assert static_borrowing_limit(changed, KEY) == (True, 16_000)
    assert changed.cluster_queues["team-b"] is OBJECTS.cluster_queues["team-b"]
    assert with_borrowing_limits(OBJECTS, {}) is OBJECTS
