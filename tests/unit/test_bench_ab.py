"""bench/ab_kueue.py's figures and table: a replay run shows when its simulator was done and
whether its ledger reconciled; a Kueue run's table has no such columns."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from ab_kueue import Side, figures, paired_summary, run_once, table  # noqa: E402

REPLAY_REPORT = {
    "wall_s": 69.8, "complete": True, "simulator_s": 27.8,
    "cpu_seconds": {"admission": 16.2, "queue-manager": 24.1, "preemption": 4.4, "cost-accounting": 42.0,
                    "broker (kafka)": 12.4},
    "ledger": {"reconciled": True, "rows": 71136, "difference_gpu_hours": "0E-9"},
    "machine": {"calibration_s": 0.17}, "broker_jit_cpu_s": 0.3,
}


def test_a_replay_run_reports_its_simulator_phase_and_its_ledger(capsys):
    replay = figures(REPLAY_REPORT)
    assert (replay["wall_s"], replay["simulator_s"], replay["services_cpu_s"]) == (69.8, 27.8, 86.7)
    assert replay["ledger"] == "equal (71,136 rows)"
    differs = figures({**REPLAY_REPORT, "ledger": {"reconciled": False, "difference_gpu_hours": "0.5"}})
    assert differs["ledger"] == "differs by 0.5 GPU-h"
    table([("before", 1, differs), ("after", 1, replay)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("| simulator done s | ledger |")
    assert lines[-1].startswith("| after | 1 | 0.17 | 0.3 | 69.8 | 86.7 |")
    assert lines[-1].endswith("| 27.8 | equal (71,136 rows) |")
    assert len({line.count("|") for line in lines}) == 1  # every row has the header's columns


def test_a_kueue_run_has_no_replay_columns(capsys):
    kueue = figures({"wall_s": 88.0, "complete": True, "cpu_seconds": {"admission": 30.0}, "evictions": 3,
                     "usage_min_pct": 80.1, "time_to_admission": {"large": {"mean_s": 0.4}}})
    assert (kueue["simulator_s"], kueue["ledger"]) == (None, "—")
    table([("head", 1, kueue)])
    lines = capsys.readouterr().out.splitlines()
    assert "ledger" not in lines[0] and lines[-1].endswith("| — |")
    assert len({line.count("|") for line in lines}) == 1


def test_a_kueue_run_shows_what_a_workload_cost_in_the_phase_that_ends_last(capsys):
    phases = {
        "medium": {"from_s": 62.0, "to_s": 74.4, "finished": 3400, "cores_busy": 1.6,
                   "cpu_ms_per_finish": {"queue-manager": 1.1, "all": 3.25}},
        "small": {"from_s": 75.1, "to_s": 82.7, "finished": 9900, "cores_busy": 1.94,
                  "cpu_ms_per_finish": {"queue-manager": 0.55, "all": 1.666}},
    }
    kueue = figures({"wall_s": 83.4, "complete": True, "cpu_seconds": {}, "phase_cpu": phases,
                     "time_to_admission": {}})
    assert kueue["last_phase_cpu"] == "small 1.67 (1.94)"
    table([("head", 1, kueue)])
    lines = capsys.readouterr().out.splitlines()
    assert "CPU ms per finish" in lines[0] and lines[-1].endswith("| small 1.67 (1.94) | — |")


def test_a_kueue_run_shows_how_busy_the_queue_managers_loop_was_in_the_last_phase(capsys):
    loops = {
        "medium": {"from_s": 62.0, "to_s": 74.4, "loops": {"queue-manager": {"agent": "qm.workloads", "busy_pct": 57.2,
                                                                            "acks_pct": 14.6}}},
        "small": {"from_s": 75.1, "to_s": 82.7, "loops": {"cost-accounting": {"agent": "qm.workloads", "busy_pct": 86.0},
                                                          "queue-manager": {"agent": "qm.workloads", "busy_pct": 86.4,
                                                                            "acks_pct": 10.6}}},
    }
    kueue = figures({"wall_s": 83.1, "complete": True, "cpu_seconds": {}, "phase_loops": loops,
                     "time_to_admission": {}})
    assert kueue["last_phase_qm_loop"] == "86% (11%)"
    table([("head", 1, kueue)])
    lines = capsys.readouterr().out.splitlines()
    assert "queue-manager loop busy" in lines[0] and lines[-1].endswith("| 86% (11%) |")


def test_the_summary_compares_each_side_with_the_first_rep_by_rep():
    def run(wall, complete=True):
        return figures({"wall_s": wall, "complete": complete, "cpu_seconds": {}})

    rows = [("head", 1, run(82.02)), ("defer", 1, run(81.82)),
            ("head", 2, run(79.70)), ("defer", 2, run(80.65)),
            ("head", 3, run(79.57)), ("defer", 3, run(79.70)),
            ("head", 4, run(90.0, complete=False)), ("defer", 4, run(80.35))]
    head, defer = paired_summary(rows)
    assert head == "head: wall median 79.70 s (79.57–82.02, 3 runs)"
    assert defer == ("defer: wall median 80.50 s (79.70–81.82, 4 runs); against head, rep by rep: "
                     "-0.20, +0.95, +0.13 s (faster in 1 of 3), median ratio 1.002")
    assert paired_summary([("a", 1, run(None)), ("b", 1, run(80.0))]) == ["a: no complete run", "b: wall median 80.00 s (80.00–80.00, 1 run)"]


def _side_tree(tmp_path: Path, script: str) -> Side:
    """A checkout as run_once uses one: bench/bench_kueue.py (here a stand-in) and .venv/bin/python."""
    tree = tmp_path / "tree"
    (tree / "bench" / "results").mkdir(parents=True)
    (tree / "bench" / "bench_kueue.py").write_text(script)
    (tree / ".venv" / "bin").mkdir(parents=True)
    (tree / ".venv" / "bin" / "python").symlink_to(sys.executable)
    return Side("head", tree)


def test_an_ab_run_keeps_its_result_aside_and_leaves_make_bench_s_in_place(tmp_path):
    side = _side_tree(tmp_path, "from pathlib import Path\n"
                                "Path('bench/results/kueue-baseline.json').write_text('{\"wall_s\": 79.5}')\n")
    make_bench_s = side.tree / "bench" / "results" / "kueue-baseline.json"
    make_bench_s.write_text('{"wall_s": 80.16}')
    out = tmp_path / "ab" / "baseline-head-1.json"
    out.parent.mkdir()
    assert run_once(side, "baseline", 1.0, tmp_path / "ab" / "run.log", out) == {"wall_s": 79.5}
    assert out.read_text() == '{"wall_s": 79.5}'
    assert make_bench_s.read_text() == '{"wall_s": 80.16}'
    assert sorted(p.name for p in make_bench_s.parent.iterdir()) == ["kueue-baseline.json"]


def test_a_run_that_writes_no_result_names_its_log_and_reports_no_earlier_figures(tmp_path):
    side = _side_tree(tmp_path, "raise SystemExit(3)\n")
    make_bench_s = side.tree / "bench" / "results" / "kueue-baseline.json"
    make_bench_s.write_text('{"wall_s": 80.16}')
    out = tmp_path / "baseline-head-1.json"
    out.write_text('{"wall_s": 1.0}')  # an earlier ab run's: not this one's figures
    log = tmp_path / "run.log"
    try:
        run_once(side, "baseline", 1.0, log, out)
    except SystemExit as exit_:
        assert str(log) in str(exit_)
    else:
        raise AssertionError("a run without a result must stop the A/B")
    assert not out.exists()
    assert make_bench_s.read_text() == '{"wall_s": 80.16}'
