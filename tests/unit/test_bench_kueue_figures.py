"""bench/bench_kueue.py's figures computed from the runner's record of pod runs."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_kueue import (  # noqa: E402
    cpu_bound_wall,
    evicted_runs,
    finishing_windows,
    packing_timeline,
    phase_cpu,
    phase_loops,
    phase_loops_line,
    summary_rows,
)
from common import batch_seconds_in  # noqa: E402

from services.sim.kueue_scenarios import BASELINE, SMALLS_PHASE  # noqa: E402


def test_every_run_but_a_workloads_last_was_evicted_and_its_cpu_seconds_are_lost():
    by_uid = {
        "s1": SimpleNamespace(workload_class="small", requests={"cpu": 1000}),
        "m1": SimpleNamespace(workload_class="medium", requests={"cpu": 5000}),
        "l1": SimpleNamespace(workload_class="large", requests={"cpu": 20000}),
    }
    intervals = [
        ("s1", 1.0, 1.1),  # evicted after 0.1 s
        ("m1", 2.0, 2.5),  # ran to its end at once
        ("s1", 3.0, 3.1),  # evicted again
        ("s1", 4.0, 4.2),  # its last run: finished
        ("l1", 5.0, 6.0),
    ]
    assert evicted_runs(intervals, by_uid) == {
        "large": {"runs": 0, "cpu_s_lost": 0.0},
        "medium": {"runs": 0, "cpu_s_lost": 0.0},
        "small": {"runs": 2, "cpu_s_lost": 0.2},
    }


def test_runs_recorded_out_of_order_still_keep_the_last_one():
    by_uid = {"m1": SimpleNamespace(workload_class="medium", requests={"cpu": 5000})}
    assert evicted_runs([("m1", 9.0, 9.5), ("m1", 1.0, 1.2)], by_uid) == {"medium": {"runs": 1, "cpu_s_lost": 1.0}}


def test_a_class_finishes_when_its_workloads_last_runs_end():
    by_uid = {f"s{i}": SimpleNamespace(workload_class="small", requests={"cpu": 1000}) for i in range(20)}
    by_uid["l1"] = SimpleNamespace(workload_class="large", requests={"cpu": 20000})
    intervals = [(f"s{i}", 60.0 + i, 60.2 + i) for i in range(20)] + [("s0", 1.0, 1.1), ("l1", 5.0, 6.0)]
    windows = finishing_windows(intervals, by_uid)
    assert windows["large"] == {"p5_s": 6.0, "p50_s": 6.0, "p95_s": 6.0}
    assert windows["small"]["p5_s"] >= 60.2 and windows["small"]["p95_s"] <= 79.2  # s0's evicted run does not count
    assert windows["small"]["p5_s"] < windows["small"]["p50_s"] < windows["small"]["p95_s"]


def test_packing_splits_each_run_across_the_seconds_it_spans():
    by_uid = {"s1": SimpleNamespace(workload_class="small", requests={"cpu": 1000}),
              "l1": SimpleNamespace(workload_class="large", requests={"cpu": 20000})}
    # 20 cpu of quota; the large runs 0.5-1.5 s, the small 1.9-2.1 s
    rows = packing_timeline([("l1", 0.5, 1.5), ("s1", 1.9, 2.1)], by_uid, quota_cpu=20, elapsed=2.5)
    assert [r["at_s"] for r in rows] == [0, 1, 2]
    assert rows[0] == {"at_s": 0, "large": 50.0, "small": 0.0, "all": 50.0}
    assert rows[1] == {"at_s": 1, "large": 50.0, "small": 0.5, "all": 50.5}
    assert rows[2] == {"at_s": 2, "large": 0.0, "small": 0.5, "all": 0.5}


def _result(**extra):
    classes = {c: {"workloads": 10, "admitted": 10, "mean_s": 1.0, "p50_s": 1.0, "p99_s": 2.0, "max_s": 2.0}
               for c in ("small", "medium", "large")}
    return {"scenario": "kueue-baseline", "scale": 1, "workloads": 15000, "ideal_s": 66.0, "complete": True,
            "services_exited": {}, "stalled": None, "timeout_s": 600, "finished": 15000, "wall_s": 83.5,
            "usage_min_pct": 82.0, "usage_mean_pct": 83.8, "time_to_admission": classes, **extra}


def test_the_summary_table_says_how_much_work_evictions_threw_away():
    lost = {"large": {"runs": 20, "cpu_s_lost": 25.4}, "medium": {"runs": 5921, "cpu_s_lost": 2320.0},
            "small": {"runs": 642, "cpu_s_lost": 37.6}}
    rows = summary_rows(_result(evicted_runs=lost), BASELINE)
    assert rows[-1]["figure"] == "kueue-baseline: runs evictions threw away"
    assert rows[-1]["measured"] == "6,583 (2,383 cpu-s; most: medium, 5,921)" and rows[-1]["met"] is None
    assert all("evictions" not in r["figure"] for r in summary_rows(_result(), BASELINE))  # an older result file


def test_a_diagnostic_scenario_has_figures_but_no_anchor_or_target():
    rows = summary_rows(_result(scenario="smalls-phase", workloads=10530), SMALLS_PHASE)
    assert rows[0]["figure"] == "smalls-phase: wall (creation of first → last finished)"
    assert rows[0]["measured"] == "83.5 s" and rows[0]["target"] == "—" and rows[0]["met"] is None
    assert all(r["met"] is None for r in rows)
    assert summary_rows(_result(scenario="smalls-phase", complete=False, finished=9000), SMALLS_PHASE)[0]["met"] is False


def test_a_phase_costs_the_cpu_of_its_window_per_workload_finished_in_it():
    # 20 smalls finish at 10.0-11.9 s of the run, a large at 2 s.
    by_uid = {f"s{i}": SimpleNamespace(workload_class="small", requests={"cpu": 1000}) for i in range(20)}
    by_uid["l1"] = SimpleNamespace(workload_class="large", requests={"cpu": 20000})
    intervals = [(f"s{i}", 9.0 + i / 10, 10.0 + i / 10) for i in range(20)] + [("l1", 1.0, 2.0)]
    windows = finishing_windows(intervals, by_uid)
    lo, hi = windows["small"]["p5_s"], windows["small"]["p95_s"]
    # The services started 5 s before the run's first creation: the sample at 15 s of the
    # timeline covers 9-10 s of the run. The queue-manager uses 60% of a core from 10 s of the run
    # on, admission 40%; before that nothing.
    timeline = [{"at_s": float(t), "queue-manager": 60 if t > 15 else 0, "admission": 40 if t > 15 else 0}
                for t in range(1, 30)]
    phases = phase_cpu(timeline, offset_s=-5.0, intervals=intervals, windows=windows)
    assert "large" not in phases  # its window is shorter than a sample
    small = phases["small"]
    finished = sum(1 for i in range(20) if lo <= 10.0 + i / 10 <= hi)
    assert small["finished"] == finished and (small["from_s"], small["to_s"]) == (lo, hi)
    per = small["cpu_ms_per_finish"]
    assert per["queue-manager"] == round(1000 * 0.6 * (hi - lo) / finished, 3)
    assert per["admission"] == round(1000 * 0.4 * (hi - lo) / finished, 3)
    assert per["all"] == round(per["queue-manager"] + per["admission"], 3)
    assert list(per)[:2] == ["queue-manager", "admission"]  # the largest first
    assert small["cores_busy"] == 1.0


def test_a_sample_is_split_across_the_window_edge():
    intervals = [(f"s{i}", 0.0, 2.0 + i / 10) for i in range(40)]  # finishes 2.0-5.9 s
    windows = {"small": {"p5_s": 2.5, "p50_s": 4.0, "p95_s": 5.5}}
    timeline = [{"at_s": float(t), "broker (kafka)": 100} for t in range(1, 10)]  # a whole core, always
    small = phase_cpu(timeline, offset_s=0.0, intervals=intervals, windows=windows)["small"]
    assert small["finished"] == 31  # 2.5 .. 5.5 s
    assert small["cpu_ms_per_finish"]["all"] == round(1000 * 3.0 / 31, 3)  # 3 s of one core, half-samples included
    assert phase_cpu(timeline, None, intervals, windows) == {}  # no clock to line them up: nothing


def test_the_cpu_bound_wall_is_the_last_phases_p5_plus_its_workloads_cpu_over_the_cores():
    """Stop 58's make bench: the smalls' p5 at 75.4 s, 1.585 ms each, 10,500 smalls, 2 cores:
    83.7 s, where the run measured 83.6 s."""
    phases = {"medium": {"to_s": 74.8, "cpu_ms_per_finish": {"all": 6.3}},
              "small": {"to_s": 83.1, "cpu_ms_per_finish": {"all": 1.585}}}
    windows = {"medium": {"p5_s": 61.9, "p95_s": 74.8}, "small": {"p5_s": 75.4, "p95_s": 83.1}}
    bound = cpu_bound_wall(phases, windows, {"small": 10_500, "medium": 3_000}, cpus=2)
    assert bound == {"class": "small", "p5_s": 75.4, "workloads": 10_500, "cpu_ms_each": 1.585, "cpus": 2,
                     "wall_s": 83.7}
    assert cpu_bound_wall({}, windows, {"small": 10_500}, cpus=2) is None  # no CPU timeline


def test_a_phase_says_how_busy_each_services_busiest_batch_loop_was():
    # cumulative qm_batch_seconds sums, sampled at at_s from the services' start (offset 2 s)
    def sample(at_s, qm_handle, qm_acks, clock_handle, cost_handle):
        return {"at_s": at_s,
                "queue-manager": {"qm.workloads": {"handle": qm_handle, "acks": qm_acks, "commit": 0.0},
                                  "qm.clock": {"handle": clock_handle, "acks": 0.0, "commit": 0.0}},
                "cost-accounting": {"qm.workloads": {"handle": cost_handle, "acks": 0.0, "commit": 0.0}}}
    timeline = [sample(9.0, 1.0, 0.5, 0.1, 0.0), sample(10.0, 1.5, 0.6, 0.1, 0.0),
                sample(12.0, 3.1, 1.0, 0.2, 0.5), sample(13.0, 3.9, 1.1, 0.2, 0.5)]
    windows = {"small": {"p5_s": 12.0, "p95_s": 14.5}, "tiny": {"p5_s": 12.0, "p95_s": 12.5}}
    phases = phase_loops(timeline, 2.0, windows)
    assert list(phases) == ["small"]  # the tiny window is shorter than a sample
    loops = phases["small"]["loops"]
    # from the sample at 10 s to the one at 13 s (run time 12 → 15 s): 2.4 s handling, 0.5 s acks
    assert loops["queue-manager"] == {"agent": "qm.workloads", "busy_pct": 96.7, "acks_pct": 16.7,
                                      "commit_pct": 0.0, "handle_pct": 80.0}
    assert loops["cost-accounting"]["busy_pct"] == 16.7
    assert list(loops) == ["queue-manager", "cost-accounting"]  # the busiest first
    assert phase_loops_line(phases) == ("batch loops busy in the small window (12.0–14.5 s): "
                                        "queue-manager (qm.workloads) 97% (acks 17%), "
                                        "cost-accounting (qm.workloads) 17% (acks 0%)")
    assert phase_loops([], 2.0, windows) == {} and phase_loops(timeline, None, windows) == {}


def test_the_batch_seconds_are_read_from_a_services_metrics_text():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    registry = CollectorRegistry()
    seconds = Histogram("qm_batch_seconds", "test", ["service", "topic", "step"], registry=registry)
    seconds.labels("queue-manager", "qm.workloads", "handle").observe(0.25)
    seconds.labels("queue-manager", "qm.workloads", "handle").observe(0.5)
    seconds.labels("queue-manager", "qm.workloads", "acks").observe(0.125)
    seconds.labels("queue-manager", "qm.clock", "handle").observe(1.0)
    text = generate_latest(registry).decode()
    assert batch_seconds_in(text) == {"qm.workloads": {"handle": 0.75, "acks": 0.125}, "qm.clock": {"handle": 1.0}}
    assert batch_seconds_in("qm_batch_seconds_count{step=\"handle\",topic=\"t\"} 3.0\n") == {}
