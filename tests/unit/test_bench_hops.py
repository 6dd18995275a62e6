"""bench/hops.py: the two hops between a finish and the quota it frees, from record timestamps."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from hops import finish_hops, hops_line  # noqa: E402


def record(event_type: str, uid: str, **payload) -> bytes:
    return orjson.dumps({"event_type": event_type, "payload": {"uid": uid, **payload}})


def test_hops_are_measured_per_workload_and_per_phase_of_the_run():
    cluster = [
        (100.0, record("workload.submitted.v1", "a")),
        (100.0, record("workload.finished.v1", "a", succeeded=True)),
        (106.0, record("workload.finished.v1", "b", succeeded=True)),
        (107.0, record("workload.finished.v1", "unforwarded", succeeded=True)),
    ]
    workloads = [
        (99.0, record("workload.quota_reserved.v1", "a")),  # preempted: not the reservation that finished
        (99.5, record("workload.quota_reserved.v1", "a")),
        (105.8, record("workload.quota_reserved.v1", "b")),
        (100.02, record("workload.finished.v1", "a")),
        (100.30, record("workload.released.v1", "c", reason="Preempted")),  # not a finish: not counted
        (100.32, record("workload.released.v1", "a", reason="Finished")),
        (106.05, record("workload.finished.v1", "b")),
        (106.10, record("workload.released.v1", "b", reason="Finished")),
        (106.20, record("workload.finished.v1", "a")),  # forwarded again (at-least-once): the first counts
    ]
    hops = finish_hops(cluster, workloads, window_s=5.0)
    assert hops["forwarded_by_admission"] == {"n": 2, "p50_ms": 50, "p90_ms": 50}
    assert hops["released_by_queue_manager"]["n"] == 2
    assert [p["finished_from_s"] for p in hops["by_phase"]] == [0.0, 5.0]
    assert hops["by_phase"][0]["released"] == {"n": 1, "p50_ms": 300, "p90_ms": 300}
    assert hops["by_phase"][1]["released"] == {"n": 1, "p50_ms": 50, "p90_ms": 50}
    assert hops["quota_held"]["n"] == 2
    assert hops["by_phase"][0]["held"] == {"n": 1, "p50_ms": 820, "p90_ms": 820}  # 99.5 -> 100.32
    assert hops["by_phase"][1]["held"] == {"n": 1, "p50_ms": 300, "p90_ms": 300}  # 105.8 -> 106.10
    assert "slowest release in the finishes from 0 s: 300 / 300 ms" in hops_line(hops)
    assert "(820 / 820 ms in that phase)" in hops_line(hops)


def test_a_run_without_finishes_says_so():
    assert finish_hops([], []) == {}
    assert hops_line({}) == "finish hops: no finishes"


def test_a_finish_sent_to_the_cohorts_stream_by_its_source_has_no_forwarding_hop():
    # ADR 0075: the simulated cluster (the watcher) puts the finish on qm.workloads itself
    workloads = [
        (99.5, record("workload.quota_reserved.v1", "a")),
        (100.0, record("workload.finished.v1", "a")),
        (100.2, record("workload.released.v1", "a", reason="Finished")),
    ]
    hops = finish_hops([], workloads, window_s=5.0)
    assert hops["forwarded_by_admission"]["n"] == 0
    assert hops["released_by_queue_manager"] == {"n": 1, "p50_ms": 200, "p90_ms": 200}
    assert hops["quota_held"] == {"n": 1, "p50_ms": 700, "p90_ms": 700}
    assert "each finish sent to its cohort's stream by the cluster itself" in hops_line(hops)
