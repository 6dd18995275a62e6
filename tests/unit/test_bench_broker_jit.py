"""bench/common.py: how much the broker's JVM spent compiling during a run, and the note a run
prints when that was a just-started broker's warm-up (ADR 0043)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from common import JIT_WARNING_CPU_S, compiler_cpu_s, jit_note  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _thread(proc: Path, pid: int, tid: int, name: str, utime_ticks: int, stime_ticks: int) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    # /proc/<pid>/task/<tid>/stat: pid (comm) state, then ppid ... utime (14th) stime (15th)
    rest = ["S", "1", str(pid), str(pid), "0", "-1", "4194368", "10", "0", "0", "0",
            str(utime_ticks), str(stime_ticks), "0", "0", "20", "0"]  # fmt: skip
    (task / "stat").write_text(f"{tid} ({name}) {' '.join(rest)}\n")


def test_only_the_compiler_threads_user_and_system_time_count(tmp_path):
    _thread(tmp_path, 42, 43, "C2 CompilerThre", 3 * TICK, 1 * TICK)
    _thread(tmp_path, 42, 44, "C1 CompilerThre", 2 * TICK, 0)
    _thread(tmp_path, 42, 45, "data-plane-kafk", 50 * TICK, 5 * TICK)  # request handling is not compiling
    _thread(tmp_path, 42, 46, "java (main) x", 7 * TICK, 0)  # a parenthesis inside the name
    assert compiler_cpu_s(42, proc=tmp_path) == 6.0


def test_a_process_without_a_jit_compiles_nothing_and_a_missing_one_is_unknown(tmp_path):
    assert compiler_cpu_s(os.getpid()) == 0.0  # this Python process has no compiler threads
    assert compiler_cpu_s(None) is None  # another broker: no pid
    assert compiler_cpu_s(99, proc=tmp_path) is None


def test_the_note_names_the_cpu_and_what_to_do_only_when_the_broker_was_compiling():
    assert jit_note({"broker_jit_cpu_s": 14.1}).startswith("NOTE: the broker spent 14.1 CPU-s compiling")
    assert "make bench-warmup" in jit_note({"broker_jit_cpu_s": 14.1})
    assert jit_note({"broker_jit_cpu_s": JIT_WARNING_CPU_S - 0.1}) == ""
    assert jit_note({"broker_jit_cpu_s": None}) == ""  # not the local broker
    assert jit_note({}) == ""  # a result written before it was measured
