"""bench/hops.py: the two hops between a finish and the quota it frees, from record timestamps."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from hops import finish_hops, hops_line, quota_cycle  # noqa: E402


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


def envelope(event_type: str, **payload) -> bytes:
    return orjson.dumps({"event_type": event_type, "payload": payload})


def test_a_quotas_turn_is_split_into_its_legs_per_phase():
    workloads = [
        (99.0, envelope("workload.quota_reserved.v1", uid="a", cohort="c", cluster_queue="q")),  # preempted
        (99.5, envelope("workload.quota_reserved.v1", uid="a", cohort="c", cluster_queue="q")),
        (99.4, envelope("pod.running.v1", uid="pod-a0", workload_uid="a")),  # the preempted run's pod
        (99.52, envelope("pod.running.v1", uid="pod-a1", workload_uid="a")),
        (99.75, envelope("queue.drain_due.v1", cohort="c")),
        (99.85, envelope("queue.drain_due.v1", cohort="c")),  # intervals count from the first finish
        (99.72, envelope("workload.finished.v1", uid="a")),
        (99.8, envelope("workload.released.v1", uid="a", reason="Finished", cohort="c", cluster_queue="q")),
        (99.83, envelope("workload.quota_reserved.v1", uid="b", cohort="other", cluster_queue="q2")),  # not its cohort
        (99.85, envelope("workload.quota_reserved.v1", uid="b2", cohort="c", cluster_queue="q")),
        # a bundle (ADR 0034): one record, two envelopes
        (105.0, b"[" + envelope("workload.quota_reserved.v1", uid="d", cohort="c", cluster_queue="q") + b","
         + envelope("pod.running.v1", uid="pod-d", workload_uid="d") + b"]"),
        (105.25, envelope("workload.finished.v1", uid="d")),
        (105.3, envelope("workload.released.v1", uid="d", reason="Finished", cohort="c", cluster_queue="q")),
    ]
    phases = quota_cycle(workloads, window_s=5.0)
    assert [p["finished_from_s"] for p in phases] == [0.0, 5.0]
    first, second = phases
    assert first["to_running"] == {"n": 1, "p50_ms": 20, "p90_ms": 20}  # 99.5 -> 99.52, not the older pod
    assert first["running"] == {"n": 1, "p50_ms": 200, "p90_ms": 200}
    assert first["to_release"] == {"n": 1, "p50_ms": 80, "p90_ms": 80}
    assert first["to_reuse"] == {"n": 1, "p50_ms": 50, "p90_ms": 50}  # b2 in its cohort, not b
    assert first["drain_every"] == {"n": 1, "p50_ms": 100, "p90_ms": 100}
    assert second["to_running"]["p50_ms"] == 0 and second["running"]["p50_ms"] == 250
    assert second["to_reuse"]["n"] == 0  # nothing reserved after it


def test_a_runs_line_shows_the_quotas_turn_where_the_release_was_slowest():
    workloads = [
        (99.5, record("workload.quota_reserved.v1", "a", cohort="c", cluster_queue="q")),
        (99.52, envelope("pod.running.v1", uid="pod-a", workload_uid="a")),
        (99.72, record("workload.finished.v1", "a")),
        (99.8, record("workload.released.v1", "a", reason="Finished", cohort="c", cluster_queue="q")),
        (99.85, record("workload.quota_reserved.v1", "b", cohort="c", cluster_queue="q")),
    ]
    hops = finish_hops([], workloads)
    hops["quota_cycle"] = quota_cycle(workloads)
    assert ("a quota's turn there (p50 ms): reserved → running 20, running → finished 200, "
            "finished → released 80, released → reserved again 50") in hops_line(hops)
    assert quota_cycle([]) == []
