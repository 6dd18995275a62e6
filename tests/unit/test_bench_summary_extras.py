"""`make bench`'s table holds only the runs it made: a result kept under another name (an older
commit's diagnostic, a smaller scale) is listed apart, with its commit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import summary  # noqa: E402
from common import row  # noqa: E402


def result(commit: str, figure: str, measured: str) -> dict:
    return {"machine": {"git_commit": commit, "cpus": 2}, "summary_rows": [row(figure, measured, "—", "—", None)]}


def test_a_run_kept_under_another_name_is_listed_apart_with_its_commit(tmp_path, capsys):
    (tmp_path / "kueue-baseline.json").write_text(json.dumps(result("aaaaaaaaaaaa", "kueue-baseline: wall", "80.2 s")))
    (tmp_path / "smalls-phase.json").write_text(json.dumps(result("bbbbbbbbbbbb", "smalls-phase: wall", "31.1 s")))
    (tmp_path / "notes.json").write_text(json.dumps({"no": "summary rows"}))

    assert summary.main(["--results", str(tmp_path)]) == 0

    ours, _, others = capsys.readouterr().out.partition("## Other runs kept in bench/results/")
    assert "| kueue-baseline: wall | 80.2 s |" in ours and "commit aaaaaaaaaa" in ours
    assert "not run (no JSON)" in ours  # the four of the five that are missing say so
    assert "smalls-phase" not in ours
    assert "| smalls-phase: wall | 31.1 s |" in others and "- smalls-phase: 2 cores" in others
    assert "commit bbbbbbbbbb" in others and "notes" not in others


def test_without_other_runs_there_is_no_second_table(tmp_path, capsys):
    (tmp_path / "recovery.json").write_text(json.dumps(result("cccccccccccc", "recovery: ready", "3.7 s")))
    summary.main(["--results", str(tmp_path)])
    assert "Other runs" not in capsys.readouterr().out
