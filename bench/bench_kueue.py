"""Kueue's own scalability scenarios on Quartermaster's full stack (issue 10, benchmarks 1 and 2).

Scenarios (kubernetes-sigs/kueue test/performance/scheduler/configs/*/generator.yaml):

  kueue-baseline     5 cohorts x 6 ClusterQueues (cpu: nominal 20, borrowingLimit 100,
                     reclaimWithinCohort Any, withinClusterQueue LowerPriority); per queue
                     350 small (1 cpu, 200 ms, prio 50, every 100 ms), 100 medium (5 cpu,
                     500 ms, prio 100, every 500 ms), 50 large (20 cpu, 1 s, prio 200, every
                     1.2 s) = 15,000 workloads. Kueue: 351 s wall, usage >= 50%, time to
                     admission large 16.5 s / medium 76.8 s / small 215 s.
                     Targets: wall <= 80 s, min usage >= 80%, large <= 5 s.
  kueue-large-scale  10 cohorts x 100 ClusterQueues, same quota; per queue 35 small (150 ms,
                     every 60 ms), 11 medium (350 ms, every 300 ms), 4 large (700 ms, every
                     700 ms) = 50,000 workloads. Kueue: 1,179 s. Target: wall <= 60 s.

How it runs (one fresh run per scenario):

* Fresh prefixed topics on the local broker; admission (with policies/library),
  queue-manager, preemption and cost-accounting start as processes (services/demo/stack.py),
  QM_STORE=memory://. The config directory holds the scenario's Kueue objects, a
  PreemptionPolicy that adds nothing to Kueue's rules (no grace, no minimum runtime) and the
  seed price list. The queue-manager runs with its defaults: like Kueue it requeues a
  preempted workload at once (its backoff is for waitForPodsReady evictions only, ADR 0063).
* This process is the cluster: services/sim/kueue_scenarios.WallClockRunner submits each
  workload (workload.submitted.v1 on qm.cluster) at its creation time, in real time, and
  answers qm.actions as Kueue's runner does: action.admit -> pod.running at once, then
  pod.finished + workload.finished after the run time; action.evict -> the pod stops and the
  workload waits for a new admission, losing its progress.
* Figures, as Kueue's recorder computes them: wall = first creation -> last workload
  finished; usage of a ClusterQueue = cpu.ms its pods ran (borrowed quota included) /
  (nominal x wall); time to admission = admission seen by the runner - scheduled creation
  time (a late submission counts against us). The minimum usage over the queues and the mean
  time to admission per class are reported.
* Where the time went: per class, the runs evictions threw away and the cpu-seconds they lost
  (``evicted_runs``, a row of the table), when its workloads finished (``finishing_windows``,
  p5 / p50 / p95 s into the run: the run's phases), and each process's CPU second by second
  (``cpu_timeline``, % of one core: whether the cores were full, and who had them), and what
  a finished workload cost each process in each class's finishing window (``phase_cpu``, ms:
  the sum to cut where a phase is bound by the machine's CPU).

--scale 0.1 keeps the queues and takes a tenth of each workload set (a quick run). Absolute
wall targets apply at full scale only; at a smaller scale the table says n/a and shows the
ideal (perfect packing) time next to the measured one. A run that does not finish within
--timeout, or sees no admission, finish or commit for --stall seconds, is reported with what did
finish, marked incomplete (targets not met), with each service's uncommitted backlog per
input topic at that moment (where the work piled up).
--profile samples every service with py-spy during the run and stores the top functions.

A diagnostic scenario, not Kueue's and not run by `all` (no anchor, no target):

  smalls-phase       kueue-baseline's last phase alone, in ~40 s: per queue one 20-cpu,
                     priority-200 workload holds the whole quota for 25 s while the queue's
                     350 smalls (1 cpu, 200 ms, prio 50) arrive 1 ms apart and are judged;
                     then the 10,500 smalls run with nothing else. Read the smalls' p5 -> p95
                     finish (baseline: 3.5 s at full packing) and the large class's time to
                     admission (ADR 0039: a preemptor is not starved by arriving smalls).

Results: bench/results/kueue-baseline.json, bench/results/kueue-large-scale.json,
bench/results/smalls-phase.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ROOT,
    BenchStack,
    CollectorClock,
    Progress,
    PySpy,
    add_run_options,
    committed_total,
    group_lag,
    jit_note,
    load,
    machine,
    pct,
    print_rows,
    process_figures,
    row,
    run_cli,
    run_figures,
    scale_arg,
    stop_on_signals,
    topic_end_offsets,
    write_result,
)
from hops import hops_line, read_finish_hops  # noqa: E402

from services.adapters.gc_tuning import freeze_startup_objects, tune_gc  # noqa: E402
from services.demo.stack import SERVICES  # noqa: E402
from services.sim.kueue_scenarios import (  # noqa: E402
    DIAGNOSTIC,
    SCENARIOS,
    KueueScenario,
    WallClockRunner,
    kueue_objects,
    preemption_policy,
    scenario_workloads,
)
from services.sim.runner import fact_router_for  # noqa: E402

# Kueue's published means (issue 10) and our targets, per scenario.
ANCHORS = {
    "kueue-baseline": {"wall_s": 351, "min_usage_pct": 50, "admit_s": {"large": 16.5, "medium": 76.8, "small": 215}},
    "kueue-large-scale": {"wall_s": 1179},
}
TARGETS = {
    "kueue-baseline": {"wall_s": 80, "min_usage_pct": 80, "admit_s": {"large": 5}},
    "kueue-large-scale": {"wall_s": 60},
}
DEFAULT_TIMEOUT_S = {"kueue-baseline": 600, "kueue-large-scale": 900, "smalls-phase": 300}
TOPICS = ("qm.cluster", "qm.workloads", "qm.actions", "qm.preemption", "qm.usage", "qm.billing", "qm.clock")
TICK_EVERY_S = 5.0  # clock ticks keep the queue-manager's and the ledger's time moving; Kueue needs none


async def watch(runner: WallClockRunner, task: asyncio.Task, timeout: float, stall_s: float,
                progress: Progress, stack: BenchStack) -> float | None:
    """Until every workload finished, the runner failed, the timeout, or nothing moved for
    ``stall_s`` seconds: no admission, no finish, and no service committed anything (a
    service working through a backlog is progress). Returns the seconds without progress
    when it gave up for that reason, else None."""
    deadline = time.monotonic() + timeout
    groups = stack.groups(SERVICES)
    last, since, checked = None, time.monotonic(), 0.0
    committed = 0
    while not runner.done.is_set() and not task.done() and time.monotonic() < deadline:
        if stack.exited():
            progress(f"a service exited: {stack.exited()}", force=True)
            return None
        if time.monotonic() - checked >= 5:
            checked = time.monotonic()
            committed = await committed_total(stack.bootstrap, groups)
        seen = (runner.stats.admitted, runner.stats.finished, runner.stats.submitted, committed)
        if seen != last:
            last, since = seen, time.monotonic()
        elif time.monotonic() - since >= stall_s:
            progress(f"nothing moved for {stall_s:.0f} s (no admission, finish or commit): giving up", force=True)
            return time.monotonic() - since
        await asyncio.sleep(0.2)
    return None


def write_config(stack: BenchStack, scenario: KueueScenario) -> None:
    (stack.config_dir / "kueue.yaml").write_text(yaml.safe_dump_all(kueue_objects(scenario), sort_keys=False))
    (stack.config_dir / "preemption-policy.yaml").write_text(yaml.safe_dump(preemption_policy(), sort_keys=False))
    shutil.copy(ROOT / "examples" / "seed" / "pricelist.yaml", stack.config_dir / "pricelist.yaml")


async def run(scenario: KueueScenario, args: argparse.Namespace) -> dict:
    full = scenario
    scenario = scenario.scaled(args.scale) if args.scale < 1 else scenario
    # a quick run gets a shorter default (it is not the figure of record)
    timeout = args.timeout or DEFAULT_TIMEOUT_S[scenario.name] * max(args.scale, 0.3)
    workloads = scenario_workloads(scenario)
    by_uid = {w.uid: w for w in workloads}
    progress = Progress(scenario.name)
    at_start = machine()  # commit and versions as the services load them
    load_before = load()
    started = time.monotonic()
    stack = BenchStack(scenario.name, keep_topics=args.keep_topics)
    profiles = None
    async with stack:
        write_config(stack, scenario)
        progress(f"{len(workloads)} workloads in {len(scenario.cluster_queues)} ClusterQueues; starting the services",
                 force=True)  # fmt: skip
        await stack.start()
        progress(f"services ready in {stack.ready_s} s; submitting in real time (ideal {scenario.ideal_s:.1f} s)",
                 force=True)  # fmt: skip
        spy = PySpy(Path(args.profile_dir) / scenario.name) if args.profile else None
        if spy:
            for service, pid in stack.pids().items():
                spy.start(service, pid)
            spy.start("bench-runner", os.getpid())  # the simulated cluster shares the two cores

        def on_progress(s) -> None:
            progress(f"submitted {s.submitted}/{len(workloads)} admitted {s.admitted} running {s.running} "
                     f"finished {s.finished} evicted {s.evicted} waiting {s.waiting}")  # fmt: skip

        runner = WallClockRunner(
            stack.bootstrap, stack.prefix, workloads, duration_s=timeout + 60, tick_every_s=TICK_EVERY_S,
            namespaces=[cq for cq, _ in scenario.cluster_queues], nodes=(), on_progress=on_progress,
            progress_every_s=1.0, fact_router=fact_router_for(stack.config_dir),  # as the watcher routes (ADR 0075)
        )  # fmt: skip
        # The simulated cluster keeps 50,000 workloads' state: with CPython's default thresholds
        # its collector scanned all of it again and again, on the cores the services run on.
        tune_gc()
        freeze_startup_objects()
        collector = CollectorClock()
        with collector:
            task = asyncio.create_task(runner.run())
            stalled = await watch(runner, task, timeout, args.stall, progress, stack)
        complete = runner.done.is_set()
        ran_s = runner.now_s()  # since the first creation; the wall figure when every workload finished
        # cpu_timeline counts from the services' start, the run from its first creation
        timeline_offset_s = ran_s - (time.monotonic() - stack.timeline_since) if stack.timeline_since else None
        wall_s = ran_s if complete else None
        if task.done():
            task.result()  # a runner failure surfaces here
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if spy:
            profiles = spy.stop()
        # Where a backlog sits, per service and input topic (records read but not yet committed).
        backlog = await group_lag(stack.bootstrap, stack.groups(SERVICES))
        bus = await topic_end_offsets(stack.bootstrap, [stack.prefix + t for t in TOPICS])
        exited = stack.exited()
        outcome = "all finished" if complete else ("SERVICE EXITED" if exited else "STALLED" if stalled else "TIMEOUT")
        progress(f"{outcome}; stopping the services", force=True)
        stack.read_peak_memory()
        hops = await read_finish_hops(stack.bootstrap, stack.prefix)  # before the topics go
    elapsed = ran_s

    # Time to admission per class, over the workloads that were admitted.
    admit: dict[str, list[float]] = {}
    for uid, at in runner.admitted_at.items():
        w = by_uid[uid]
        admit.setdefault(w.workload_class, []).append(at - w.submit_s)
    classes = {}
    for s in scenario.sets:
        values = sorted(admit.get(s.class_name, []))
        classes[s.class_name] = {
            "workloads": s.count * len(scenario.cluster_queues),
            "admitted": len(values),
            "mean_s": round(sum(values) / len(values), 3) if values else None,
            "p50_s": round(pct(values, 0.5), 3) if values else None,
            "p99_s": round(pct(values, 0.99), 3) if values else None,
            "max_s": round(values[-1], 3) if values else None,
        }
    # Usage per ClusterQueue: cpu.ms its pods ran / (nominal x wall).
    used: dict[str, float] = {cq: 0.0 for cq, _ in scenario.cluster_queues}
    for uid, start, stop in runner.intervals:
        w = by_uid[uid]
        used[w.cluster_queue] += w.requests["cpu"] / 1000 * (stop - start)
    usage = {cq: u / (scenario.nominal_cpu * elapsed) for cq, u in used.items()}
    evicted = evicted_runs(runner.intervals, by_uid)
    finishing = finishing_windows(runner.intervals, by_uid)
    packing = packing_timeline(runner.intervals, by_uid, scenario.nominal_cpu * len(scenario.cluster_queues), elapsed)
    lags = sorted(runner.submit_lag_s)
    result = {
        "scenario": scenario.name,
        "scale": args.scale,
        "shape": dataclasses.asdict(scenario),
        "workloads": len(workloads),
        "complete": complete,
        "stalled": stalled,
        "services_exited": exited,
        "timeout_s": timeout,
        "wall_s": round(wall_s, 2) if wall_s is not None else None,
        "ideal_s": round(scenario.ideal_s, 2),
        "finished": runner.stats.finished,
        "admissions": runner.stats.admitted,
        "evictions": runner.stats.evicted,
        "evicted_runs": evicted,
        "finishing_windows": finishing,
        "phase_cpu": phase_cpu(stack.cpu_timeline, timeline_offset_s, runner.intervals, finishing),
        "phase_loops": phase_loops(stack.loop_timeline, timeline_offset_s, finishing),
        "packing_timeline": packing,
        "usage_min_pct": round(100 * min(usage.values()), 1),
        "usage_mean_pct": round(100 * sum(usage.values()) / len(usage), 1),
        "usage_max_pct": round(100 * max(usage.values()), 1),
        "time_to_admission": classes,
        "submit_lag_s": {"p50": pct(lags, 0.5), "p99": pct(lags, 0.99), "max": lags[-1] if lags else None},
        "finish_hops": hops,
        "bus_records": {t.removeprefix(stack.prefix): n for t, n in bus.items()},
        "uncommitted_at_end": {g: {t.removeprefix(stack.prefix): n for t, n in (per or {}).items()}
                               for g, per in backlog.items()},
        **process_figures(stack, "bench (runner)"),
        "runner_gc": collector.figures(),  # the simulated cluster's own collector pauses
        **run_figures(stack, started, at_start, load_before),
    }
    result["cpu_bound_wall"] = cpu_bound_wall(result["phase_cpu"], finishing,
                                              {c: v["workloads"] for c, v in classes.items()},
                                              result["machine"]["cpus"])
    if profiles is not None:
        result["profile"] = profiles
    result["summary_rows"] = summary_rows(result, full)
    return result


def runs_of(intervals: list[tuple[str, float, float]]) -> dict[str, list[tuple[float, float]]]:
    """Each workload's pod runs, in order: every run but the last ended in an eviction."""
    runs: dict[str, list[tuple[float, float]]] = {}
    for uid, start, stop in intervals:
        runs.setdefault(uid, []).append((start, stop))
    return {uid: sorted(spans) for uid, spans in runs.items()}


def evicted_runs(intervals: list[tuple[str, float, float]], by_uid: dict) -> dict[str, dict[str, float]]:
    """Per class, the runs that ended in an eviction (every run of a workload but its last) and
    the cpu-seconds they ran for nothing: Kueue's runner restarts an evicted workload's clock,
    so that work is done again, and the wall grows by it."""
    out: dict[str, dict[str, float]] = {}
    for uid, spans in runs_of(intervals).items():
        w = by_uid[uid]
        entry = out.setdefault(w.workload_class, {"runs": 0, "cpu_s_lost": 0.0})
        for start, stop in spans[:-1]:
            entry["runs"] += 1
            entry["cpu_s_lost"] += w.requests["cpu"] / 1000 * (stop - start)
    return {name: {"runs": e["runs"], "cpu_s_lost": round(e["cpu_s_lost"], 1)} for name, e in sorted(out.items())}


def finishing_windows(intervals: list[tuple[str, float, float]], by_uid: dict) -> dict[str, dict[str, float]]:
    """Per class, when its workloads finished (the end of each one's last run), in seconds of
    the run: p5, p50 and p95. It shows the run's phases, e.g. in kueue-baseline which class
    had the quota while the others waited or were evicted."""
    by_class: dict[str, list[float]] = {}
    for uid, spans in runs_of(intervals).items():
        by_class.setdefault(by_uid[uid].workload_class, []).append(spans[-1][1])
    return {name: {f"p{p}_s": round(pct(sorted(stops), p / 100), 1) for p in (5, 50, 95)}
            for name, stops in sorted(by_class.items())}


def phase_cpu(timeline: list[dict[str, float]], offset_s: float | None, intervals: list[tuple[str, float, float]],
              windows: dict[str, dict[str, float]]) -> dict[str, dict]:
    """Per class, over its p5 → p95 finishing window: each process's CPU per workload that
    finished in that window (of any class), in ms, and how many of the cores were busy.

    The wall of a phase bound by the machine's CPU moves with this sum (kueue-baseline's small
    jobs: ~1.7 ms on two cores), and a cut of a few percent in it shows here when the wall's
    noise hides it. `timeline` is cpu_timeline (each sample: % of a core since the one before,
    at `at_s` from the services' start); `offset_s` turns its seconds into the run's."""
    if offset_s is None or not timeline:
        return {}
    finishes = sorted(spans[-1][1] for spans in runs_of(intervals).values())
    out: dict[str, dict] = {}
    for name, window in windows.items():
        lo, hi = window["p5_s"], window["p95_s"]
        if hi - lo < 1.0:  # shorter than a sample: nothing to say
            continue
        cpu_s: dict[str, float] = {}
        before = timeline[0]["at_s"] - 1.0
        for sample in timeline:
            start, end = before + offset_s, sample["at_s"] + offset_s
            before = sample["at_s"]
            overlap = min(end, hi) - max(start, lo)
            if overlap <= 0 or end <= start:
                continue
            share = overlap / (end - start)
            for label, pct_of_core in sample.items():
                if label != "at_s":
                    cpu_s[label] = cpu_s.get(label, 0.0) + pct_of_core / 100 * (end - start) * share
        finished = sum(1 for at in finishes if lo <= at <= hi)
        if not finished or not cpu_s:
            continue
        per = {label: round(1000 * used / finished, 3) for label, used in sorted(cpu_s.items(), key=lambda kv: -kv[1])}
        out[name] = {"from_s": lo, "to_s": hi, "finished": finished,
                     "cores_busy": round(sum(cpu_s.values()) / (hi - lo), 2),
                     "cpu_ms_per_finish": {**per, "all": round(1000 * sum(cpu_s.values()) / finished, 3)}}
    return out


def phase_loops(timeline: list[dict], offset_s: float | None, windows: dict[str, dict[str, float]]) -> dict[str, dict]:
    """Per class, over its p5 → p95 finishing window: for each process, its busiest agent's
    share of the wall time spent in batches (qm_batch_seconds), and of it handling, awaiting the
    broker's acks, and committing. An agent applies one batch at a time: near 100% busy, a record
    waits for the batch under way and then its own (stop 62: the queue-manager's qm.workloads
    agent, 90–93% in kueue-baseline's smalls window). `timeline` is loop_timeline (cumulative
    sums per process, agent and step, at `at_s` from the services' start)."""
    if offset_s is None or len(timeline) < 2:
        return {}
    out: dict[str, dict] = {}
    for name, window in windows.items():
        lo, hi = window["p5_s"] - offset_s, window["p95_s"] - offset_s
        if hi - lo < 1.0:  # shorter than a sample: nothing to say
            continue
        first = max((t for t in timeline if t["at_s"] <= lo), key=lambda t: t["at_s"], default=None)
        last = min((t for t in timeline if t["at_s"] >= hi), key=lambda t: t["at_s"], default=None)
        if first is None or last is None or last["at_s"] - first["at_s"] < 1.0:
            continue
        span = last["at_s"] - first["at_s"]
        loops: dict[str, dict] = {}
        for process, agents in last.items():
            if process == "at_s":
                continue
            shares = []
            for topic, steps in agents.items():
                was = first.get(process, {}).get(topic, {})
                spent = {step: max(0.0, seconds - was.get(step, 0.0)) / span for step, seconds in steps.items()}
                shares.append((sum(spent.values()), topic, spent))
            busy, topic, spent = max(shares)
            loops[process] = {"agent": topic, "busy_pct": round(100 * busy, 1),
                              **{f"{step}_pct": round(100 * share, 1) for step, share in sorted(spent.items())}}
        if loops:
            out[name] = {"from_s": window["p5_s"], "to_s": window["p95_s"],
                         "loops": dict(sorted(loops.items(), key=lambda kv: -kv[1]["busy_pct"]))}
    return out


def phase_loops_line(phases: dict[str, dict]) -> str:
    """One line per class: how busy each service's busiest agent was in that class's window."""
    lines = []
    for name, p in phases.items():
        parts = ", ".join(
            f"{process} ({loop['agent']}) {loop['busy_pct']:.0f}% (acks {loop.get('acks_pct', 0):.0f}%)"
            for process, loop in p["loops"].items())
        lines.append(f"batch loops busy in the {name} window ({p['from_s']}–{p['to_s']} s): {parts}")
    return "\n".join(lines)


def cpu_bound_wall(phases: dict[str, dict], windows: dict[str, dict[str, float]], workloads: dict[str, int],
                   cpus: int) -> dict | None:
    """The wall as the last phase's CPU would make it: the last class's p5 finish, plus all of
    its workloads times what each cost the machine in its window, over the cores. In
    kueue-baseline (the smalls' phase, its cores full) this came within 0.2 s of the measured
    wall in 7 runs of 80-85 s (stop 58): a wall that moves with the host moves with this."""
    if not phases:
        return None
    name, p = max(phases.items(), key=lambda kv: kv[1]["to_s"])
    count, window = workloads.get(name), windows.get(name)
    if not count or not window or cpus <= 0:
        return None
    ms = p["cpu_ms_per_finish"]["all"]
    return {"class": name, "p5_s": window["p5_s"], "workloads": count, "cpu_ms_each": ms, "cpus": cpus,
            "wall_s": round(window["p5_s"] + count * ms / 1000 / cpus, 1)}


def phase_cpu_line(phases: dict[str, dict]) -> str:
    """One line per class: what a finished workload cost the machine in that class's phase."""
    lines = []
    for name, p in phases.items():
        per = p["cpu_ms_per_finish"]
        parts = ", ".join(f"{label} {ms:.2f}" for label, ms in per.items() if label != "all")
        lines.append(f"CPU per workload finished in the {name} window ({p['from_s']}–{p['to_s']} s, "
                     f"{p['finished']:,} finished, {p['cores_busy']} cores busy): {per['all']:.2f} ms ({parts})")
    return "\n".join(lines)


def packing_timeline(intervals: list[tuple[str, float, float]], by_uid: dict, quota_cpu: float,
                     elapsed: float) -> list[dict[str, float]]:
    """Per second of the run, the % of all nominal cpu that running pods used, by class. Where
    it is under 100 the quota stood idle or was held by hops (reservation, start, release),
    and the wall grew by it."""
    seconds = int(elapsed) + 1
    used: dict[str, list[float]] = {}
    for uid, start, stop in intervals:
        row = used.setdefault(by_uid[uid].workload_class, [0.0] * seconds)
        cpu = by_uid[uid].requests["cpu"] / 1000
        for second in range(max(int(start), 0), min(int(stop), seconds - 1) + 1):
            overlap = min(stop, second + 1) - max(start, second)
            if overlap > 0:
                row[second] += cpu * overlap
    return [{"at_s": second, **{name: round(100 * row[second] / quota_cpu, 1) for name, row in sorted(used.items())},
             "all": round(100 * sum(row[second] for row in used.values()) / quota_cpu, 1)}
            for second in range(seconds)]


def _fmt_s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def summary_rows(r: dict, full: KueueScenario) -> list[dict]:
    name, scale = r["scenario"], r["scale"]
    anchors, targets = ANCHORS.get(name, {}), TARGETS.get(name, {})  # a diagnostic scenario has neither
    at_scale = "" if scale == 1 else f"scale {scale:g}: {r['workloads']} workloads, ideal {r['ideal_s']:.1f} s"
    stop = (f"{', '.join(r['services_exited'])} exited" if r.get("services_exited")
            else f"no progress for {r['stalled']:.0f} s" if r["stalled"] else f"timeout {r['timeout_s']:.0f} s")
    incomplete = "" if r["complete"] else f"incomplete: {r['finished']}/{r['workloads']} finished ({stop})"
    note = "; ".join(x for x in (at_scale, incomplete) if x)
    rows = []
    if "wall_s" in targets:
        wall_met = (r["complete"] and r["wall_s"] <= targets["wall_s"]) if scale == 1 else (False if not r["complete"] else None)
        rows.append(row(f"{name}: wall (creation of first → last finished)", _fmt_s(r["wall_s"]),
                        f"{anchors['wall_s']:,} s", f"≤ {targets['wall_s']} s (full scale; ideal {full.ideal_s:.0f} s)",
                        wall_met, note))  # fmt: skip
    else:
        rows.append(row(f"{name}: wall (creation of first → last finished)", _fmt_s(r["wall_s"]), "—", "—",
                        None if r["complete"] else False, note))
    usage_target = targets.get("min_usage_pct")
    rows.append(row(f"{name}: min ClusterQueue usage", f"{r['usage_min_pct']}% (mean {r['usage_mean_pct']}%)",
                    f"≥ {anchors['min_usage_pct']}%" if "min_usage_pct" in anchors else "—",
                    f"≥ {usage_target}%" if usage_target else "—",
                    (r["complete"] and r["usage_min_pct"] >= usage_target) if usage_target else None, note))  # fmt: skip
    for cls, stats in r["time_to_admission"].items():
        target = targets.get("admit_s", {}).get(cls)
        anchor = anchors.get("admit_s", {}).get(cls)
        mean = stats["mean_s"]
        rows.append(row(f"{name}: mean time to admission, {cls}",
                        f"{_fmt_s(mean)} (p99 {_fmt_s(stats['p99_s'])}, {stats['admitted']}/{stats['workloads']})",
                        f"{anchor} s" if anchor is not None else "—", f"≤ {target} s" if target else "—",
                        (r["complete"] and mean is not None and mean <= target) if target else None, note))  # fmt: skip
    lost = r.get("evicted_runs")  # absent from results written before it was measured
    if lost:
        runs = sum(e["runs"] for e in lost.values())
        cpu_s = sum(e["cpu_s_lost"] for e in lost.values())
        worst = max(lost, key=lambda c: lost[c]["cpu_s_lost"])
        rows.append(row(f"{name}: runs evictions threw away", f"{runs:,} ({cpu_s:,.0f} cpu-s; most: {worst}, "
                        f"{lost[worst]['runs']:,})", "—", "—", None, note))
    return rows


async def main_async(args: argparse.Namespace) -> int:
    stop_on_signals()
    if args.scenario in DIAGNOSTIC:
        names = [args.scenario]
    else:
        names = list(SCENARIOS) if args.scenario == "all" else [f"kueue-{args.scenario}"]
    for name in names:
        result = await run(SCENARIOS.get(name) or DIAGNOSTIC[name], args)
        path = write_result(name, result)
        print(f"\n### {name} (scale {args.scale:g}, bench wall {result['bench_wall_s']} s, "
              f"load {result['load_before']} → {result['load_after']})\n")  # fmt: skip
        print_rows(result["summary_rows"])
        lost = ", ".join(f"{c} {e['runs']} ({e['cpu_s_lost']} cpu-s)" for c, e in result["evicted_runs"].items())
        print("finished (p5 / p50 / p95 s into the run): " + ", ".join(
            f"{c} {w['p5_s']} / {w['p50_s']} / {w['p95_s']}" for c, w in result["finishing_windows"].items()))
        print("quota used by running pods, % per 5 s: " + " ".join(
            str(round(sum(r["all"] for r in result["packing_timeline"][i:i + 5]) / len(result["packing_timeline"][i:i + 5])))
            for i in range(0, len(result["packing_timeline"]), 5)))
        if result.get("phase_cpu"):
            print(phase_cpu_line(result["phase_cpu"]))
        if result.get("phase_loops"):
            print(phase_loops_line(result["phase_loops"]))
        if bound := result.get("cpu_bound_wall"):
            print(f"the wall if the {bound['class']} phase is bound by the CPU: {bound['p5_s']} s (its p5 finish) + "
                  f"{bound['workloads']:,} x {bound['cpu_ms_each']:.2f} ms / {bound['cpus']} cores = {bound['wall_s']} s "
                  f"(measured {result['wall_s']} s)")
        print(f"\nevictions {result['evictions']} (runs thrown away: {lost or 'none'}), "
              f"submit lag p99 {result['submit_lag_s']['p99']} s, "
              f"peak memory MiB {result['peak_memory_mib']}, broker JIT {result['broker_jit_cpu_s']} CPU-s\n"
              f"{hops_line(result['finish_hops'])}\nwritten {path}")  # fmt: skip
        if note := jit_note(result):
            print(note)
        for label, prof in (result.get("profile") or {}).items():
            print(f"\nprofile {label}: {prof.get('samples')} samples; own time top: "
                  + ", ".join(f"{f} {p}%" for f, p in prof.get("own_pct", [])[:8]))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--scenario", choices=["baseline", "large-scale", "all", *DIAGNOSTIC], default="all",
                   help="all (default): Kueue's two; smalls-phase: a diagnostic, not run by `all` (below)")
    p.add_argument("--scale", type=scale_arg, default=1.0,
                   help="fraction of each workload set to run, in (0, 1] (0.1: a quick run); default 1")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for every workload to finish (default 600 baseline, 900 large-scale; "
                        "times the scale, at least 0.3x, for a smaller scale)")
    p.add_argument("--stall", type=float, default=60.0,
                   help="give up after this many seconds without an admission, a finish or a commit by any "
                        "service (default 60)")
    add_run_options(p)
    return run_cli(main_async, p)


if __name__ == "__main__":
    raise SystemExit(main())
