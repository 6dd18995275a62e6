"""The Alibaba GPU trace through the full stack as fast as it goes (issue 10, benchmark 3).

What runs:

* The trace (default ../shared/traces/alibaba-gpu-v2023/openb_pod_list_default.csv, read in
  place) becomes simulated workloads (services/sim: one Job per pod, its team namespace,
  training / inference / batch by QoS); the cluster is the trace's own fleet
  (openb_node_list_all_node.csv, 1,523 nodes, 6,212 GPUs), and the Kueue config is generated
  from it (services/sim/config.py: one ClusterQueue per team, two cohorts, borrowing).
* Admission (policies/library), queue-manager, preemption and cost-accounting run as
  processes on fresh topics (services/demo/stack.py), QM_STORE=memory://.
* The simulator (services/sim/runner.Simulator, the building blocks of run_simulation)
  replays the trace compressed by --speed simulated seconds per wall second, with hourly
  clock ticks, and answers the queue-manager's actions like a cluster. It skips the quiet
  stretches (--skip-quiet): when no workload waits for a decision or to start and nothing has
  happened for a quarter of a wall second, it jumps to the next pod event and publishes the
  ticks in between at once. The trace's first 2,700 hours hold 17 of its 8,152 pods: at the
  steady pace they took 37 s of wall time.
* After the trace's last submission the simulated cluster keeps running (--settle): it ticks,
  answers admits that come late and runs their pods to their end, until every workload is
  done. At 300,000x a second of decision latency is 83 trace hours; a simulator that stopped
  at the trace's end left over 40% of a full run's reservations never run, billed reserved-idle.
* Time is compressed, so the time-based settings scale with it: pods-ready timeout, zombie
  TTL and the ledger's close delay (CostSettings closeDelaySeconds, with --settle) = 10 wall
  seconds of simulated time; the ledger's correction horizon covers the whole trace (a late
  event is corrected, never dropped as too late); ticks are held back
  --holdback wall seconds.

Figures:

* wall time (simulator start -> every service has committed everything it read), trace
  span / wall (the compression achieved), bus records and records/s over the run;
* submit -> decision latency, from Kafka record timestamps (both CreateTime on this host):
  workload.submitted on qm.cluster -> the first decision about it on qm.workloads
  (quota_reserved or pending from the queue-manager, rejected or pending from admission);
  also submit -> validated (admission alone); p50 / p99 / max;
* ledger reconciliation: the GPU-hours of every ledger row on qm.billing (deduplicated by
  row id, corrections included) against the GPU-hours the bus says were reserved and run,
  recomputed independently from the trail on qm.workloads by the ledger's rules (ADR 0004 /
  0007: a reservation from quota_reserved to the first released / evicted / finished /
  expired; a pod from pod.running to its pod.finished or the workload's end; reserved-idle =
  reserved minus running; hours closed by each cohort's last tick; each (workload, flavor,
  kind) series rounded half-even to 9 places once). Equal to the decimal, or the difference.

--timeout bounds the figure of record; when the services have not drained by then (or one of
them stalls: nothing committed for 30 s), the run says so, with each service's uncommitted
backlog per topic, and waits up to --reconcile-wait more so the ledger can still be
reconciled. --scale 0.1 replays the first tenth of the pods (by creation time). The target
(the whole trace in < 60 s) applies at full scale only. Results: bench/results/alibaba-replay.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ROOT,
    BenchStack,
    Progress,
    PySpy,
    add_run_options,
    jit_note,
    load,
    machine,
    one_per_envelope,
    pct,
    print_rows,
    process_figures,
    read_records,
    row,
    run_cli,
    run_figures,
    scale_arg,
    stop_on_signals,
    topic_end_offsets,
    wait_drained,
    write_result,
)

from services.contracts.codec import parse_utc  # noqa: E402
from services.core.cost.units import HOUR_MS, MILLI_HOUR_DIVISOR, floor_hour, nano_to_decimal, to_nano  # noqa: E402
from services.demo.stack import SERVICES  # noqa: E402
from services.sim.config import write_kueue_config  # noqa: E402
from services.sim.runner import Simulator, fact_router_for  # noqa: E402
from services.sim.workloads import workloads_from_trace  # noqa: E402
from services.trace.alibaba import read_nodes, read_pods  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023"
TARGET_WALL_S = 60
TICK_EVERY_S = 3600.0
GPU = "nvidia.com/gpu"
TOPICS = ("qm.cluster", "qm.workloads", "qm.actions", "qm.preemption", "qm.usage", "qm.billing", "qm.budgets",
          "qm.alerts", "qm.clock")  # fmt: skip


def write_config(stack: BenchStack, nodes, close_delay_s: int) -> None:
    write_kueue_config(stack.config_dir, nodes)
    docs = list(yaml.safe_load_all((ROOT / "examples" / "seed" / "pricelist.yaml").read_text()))
    for doc in docs:
        if doc.get("kind") == "CostSettings":
            # A wall second is days of trace time: late events must be corrected, not dropped.
            doc["spec"]["correctionHorizonHours"] = 24 * 366
            # ... and most are not late at all when hours close this much trace time after their
            # end: a round trip through the services takes seconds of wall time.
            doc["spec"]["closeDelaySeconds"] = close_delay_s
    (stack.config_dir / "pricelist.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))


def _ms(text: str) -> int:
    moment = parse_utc(text)
    return int(moment.timestamp()) * 1000 + moment.microsecond // 1000


# -- reconciliation: the ledger against the trail ------------------------------------------------


def expected_gpu_nano(workload_records: list, closed_through: dict[bytes, int]) -> dict[str, int]:
    """GPU nano-hours per usage kind that the ledger should hold, from qm.workloads alone.

    Per workload: reservations [quota_reserved, first end) where an end is released / evicted
    / finished / prefreeze_expired (or the next reservation); pods [pod.running, its
    pod.finished or the workload's first released / evicted / finished); nothing starts after
    finished; usage clipped at the workload's cohort's last closed hour; reserved-idle =
    reserved - running. Each (workload, flavor, kind) series is rounded once, as the ledger does."""
    books: dict[str, dict] = {}
    for seq, rec in enumerate(workload_records):
        doc = orjson.loads(rec.value)
        kind, p = doc["event_type"], doc["payload"]
        uid = p.get("workload_uid") or p.get("uid")
        book = books.setdefault(uid, {"res": [], "res_ends": [], "all_ends": [], "pods": {}, "pod_ends": {},
                                      "finished": None, "key": rec.key})  # fmt: skip
        if kind == "workload.quota_reserved.v1":
            usage = p["usage"] or {}
            if not usage:
                continue
            flavor = min(usage, key=lambda f: (-int(usage[f].get(GPU, 0)), f))  # the reservation's GPU flavor
            book["res"].append(((_ms(p["reserved_at"]), seq), flavor, int(usage[flavor].get(GPU, 0))))
            book["key"] = rec.key
        elif kind == "pod.running.v1":
            book["pods"].setdefault(p["uid"], []).append(((_ms(p["started_at"]), seq), int(p["requests"].get(GPU, 0))))
        elif kind == "pod.finished.v1":
            book["pod_ends"].setdefault(p["uid"], []).append((_ms(p["finished_at"]), seq))
        elif kind == "workload.prefreeze_expired.v1":
            book["res_ends"].append((_ms(p["expired_at"]), seq))
        elif kind in ("workload.released.v1", "workload.evicted.v1", "workload.finished.v1"):
            at = _ms(p.get("released_at") or p.get("evicted_at") or p.get("finished_at"))
            book["res_ends"].append((at, seq))
            book["all_ends"].append((at, seq))
            if kind == "workload.finished.v1" and (book["finished"] is None or (at, seq) < book["finished"]):
                book["finished"] = (at, seq)

    def end_of(start, following, ends):
        end = following
        later = [e for e in ends if e > start]
        if later:
            end = min(later)[0] if end is None else min(end, min(later)[0])
        return end

    totals = {"running": 0, "reserved-idle": 0}
    for book in books.values():
        if not book["res"]:
            continue
        limit = closed_through.get(book["key"])
        if limit is None:
            continue
        fin = book["finished"]
        res = sorted(r for r in book["res"] if fin is None or r[0] < fin)
        reservations = []  # (start, end, flavor, gpu)
        for i, (start, flavor, gpu) in enumerate(res):
            following = res[i + 1][0][0] if i + 1 < len(res) else None
            reservations.append((start[0], end_of(start, following, sorted(book["res_ends"])), flavor, gpu))
        pods = []  # (start, end, flavor, gpu): a pod counts in the flavor its workload holds when it starts
        for pod, starts in book["pods"].items():
            starts = sorted(s for s in starts if fin is None or s[0] < fin)
            ends = sorted(book["pod_ends"].get(pod, []) + book["all_ends"])
            for i, (start, gpu) in enumerate(starts):
                following = starts[i + 1][0][0] if i + 1 < len(starts) else None
                held = [r for r in res if r[0] <= start]
                flavor = held[-1][1] if held else res[0][1]
                pods.append((start[0], end_of(start, following, ends), flavor, gpu))
        series: dict[tuple[str, str], int] = {}

        for start, end, flavor, gpu in pods:
            stop = limit if end is None or end > limit else end
            series[(flavor, "running")] = series.get((flavor, "running"), 0) + gpu * max(0, stop - start)
        # reserved-idle per flavor: reserved minus running, never below zero, on each segment
        for flavor in {r[2] for r in reservations}:
            held = [r for r in reservations if r[2] == flavor]
            used = [q for q in pods if q[2] == flavor]
            cuts = sorted({t for s, e, *_ in held + used for t in (s, e if e is not None else limit) if t <= limit})
            idle = 0
            for lo, hi in zip(cuts, cuts[1:], strict=False):
                level = sum(g for s, e, _, g in held if s <= lo and (e is None or e >= hi))
                level -= sum(g for s, e, _, g in used if s <= lo and (e is None or e >= hi))
                if level > 0:
                    idle += level * (hi - lo)
            if idle:
                series[(flavor, "reserved-idle")] = idle
        for (_flavor, kind), exact in series.items():
            totals[kind] += to_nano(exact, MILLI_HOUR_DIVISOR)
    return totals


def ledger_gpu_nano(billing_records: list) -> tuple[dict[str, int], int]:
    """GPU nano-hours per usage kind on qm.billing (one per row id), and the row count."""
    rows: dict[str, tuple[str, Decimal]] = {}
    for rec in billing_records:
        p = orjson.loads(rec.value)["payload"]
        rows[p["row_id"]] = (p.get("x_UsageKind") or "", Decimal(p.get("x_GpuHours") or "0"))
    totals = {"running": 0, "reserved-idle": 0}
    for kind, hours in rows.values():
        totals[kind] = totals.get(kind, 0) + int(hours.scaleb(9))
    return totals, len(rows)


# -- the run ------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict:
    progress = Progress("alibaba-replay")
    for flag, path in (("--trace", args.trace), ("--nodes", args.nodes)):
        if not Path(path).is_file():
            raise SystemExit(
                f"alibaba-replay: no file at {path} ({flag}). The trace is read in place from "
                f"../shared/traces/alibaba-gpu-v2023 beside the checkout; from a worktree elsewhere, give "
                f"--trace and --nodes (bench/ab_kueue.py --scenario replay does)."
            )
    pods = read_pods(args.trace)
    nodes = read_nodes(args.nodes)
    workloads = workloads_from_trace(pods)
    if args.scale < 1:
        workloads = workloads[: max(1, round(len(workloads) * args.scale))]
    span_s = workloads[-1].submit_s + TICK_EVERY_S
    compressed = int(10 * args.speed)  # ten wall seconds of simulated time
    env = {"QM_PODS_READY_TIMEOUT_S": str(compressed), "QM_ZOMBIE_TTL_S": str(compressed)}
    close_delay_s = compressed if args.settle else 0  # the last hours close only if time goes on
    at_start = machine()  # commit and versions as the services load them
    load_before = load()
    started = time.monotonic()
    profiles = None
    async with BenchStack("alibaba-replay", env=env, keep_topics=args.keep_topics) as stack:
        write_config(stack, nodes, close_delay_s)
        progress(f"{len(workloads)} workloads, {span_s / 3600:.0f} trace hours at speed {args.speed:g} "
                 f"(≈ {span_s / args.speed:.0f} s); starting the services", force=True)  # fmt: skip
        await stack.start()
        progress(f"services ready in {stack.ready_s} s", force=True)
        spy = PySpy(Path(args.profile_dir) / "alibaba-replay") if args.profile else None
        if spy:
            for service, pid in stack.pids().items():
                spy.start(service, pid)

        def on_progress(s) -> None:
            progress(f"trace {s.sim_time} submitted {s.submitted}/{len(workloads)} admitted {s.admitted} "
                     f"running {s.running} finished {s.finished} evicted {s.evicted} events {s.events_published}")  # fmt: skip

        simulator = Simulator(stack.bootstrap, stack.prefix, workloads, speed=args.speed, tick_every_s=TICK_EVERY_S,
                              nodes=nodes, on_progress=on_progress, progress_every_s=1.0,
                              tick_holdback_wall_s=args.holdback, settle_wall_s=args.settle or None,
                              close_books_s=close_delay_s, skip_quiet_wall_s=args.skip_quiet or None,
                              fact_router=fact_router_for(stack.config_dir))  # as the watcher routes (ADR 0075)  # fmt: skip
        sim_started = time.monotonic()
        stats = None
        try:
            stats = await asyncio.wait_for(simulator.run(), timeout=args.timeout)
        except TimeoutError:  # (a cancellation by SIGTERM passes through: the stack still stops)
            progress("TIMEOUT: the simulator did not get through the trace", force=True)
        sim_wall = time.monotonic() - sim_started
        progress(f"simulator done in {sim_wall:.1f} s; waiting for the services to commit everything", force=True)
        groups = stack.groups(SERVICES)
        reads = stack.reads(SERVICES)
        # Every ledger row is out once qm.workloads is read to the end; the budget fold behind
        # it (by-cost-center) and the row index (qm.billing) do not change the rows.
        ledger_only = ("-by-cost-center", "qm.billing")
        drain = await wait_drained(stack.bootstrap, groups, timeout_s=max(30.0, args.timeout - sim_wall),
                                   progress=progress, stack=stack, reads=reads, note_without=ledger_only)  # fmt: skip
        rows_out_at = drain["drained_without_at"]
        wall = time.monotonic() - sim_started
        if spy:
            profiles = spy.stop()
        stack.read_peak_memory()
        drained = drain["drained"]
        backlog_at_timeout = None if drained else drain["lags"]
        if drain.get("timed_out") and args.reconcile_wait > 0:
            # Past the figure of record: let the backlog drain anyway, so the ledger can be reconciled.
            progress(f"not drained within {args.timeout:.0f} s; waiting up to {args.reconcile_wait:.0f} s more "
                     "for the ledger", force=True)  # fmt: skip
            # (a long stall window: one batch of the ledger fold can take a minute to commit)
            drain = await wait_drained(stack.bootstrap, groups, timeout_s=args.reconcile_wait, progress=progress,
                                       stack=stack, ignore=ledger_only, stall_s=120, reads=reads)  # fmt: skip
        # when every ledger row was out: noted while waiting, else when the whole stack drained
        rows_out_at = rows_out_at or (time.monotonic() if drain["drained"] else None)
        rows_out_after = rows_out_at - sim_started if rows_out_at else None
        exited = stack.exited()  # (read before the stack is stopped: then every service has exited)
        progress(f"{'drained' if drained else 'NOT drained'} after {wall:.1f} s"
                 f"{f' (every ledger row out after {rows_out_after:.0f} s)' if rows_out_after and not drained else ''}; "
                 "reading the trail", force=True)  # fmt: skip
        topics = [stack.prefix + t for t in TOPICS]
        records = await topic_end_offsets(stack.bootstrap, topics)
        cluster = await read_records(stack.bootstrap, stack.prefix + "qm.cluster")
        trail = one_per_envelope(await read_records(stack.bootstrap, stack.prefix + "qm.workloads"))
        billing = await read_records(stack.bootstrap, stack.prefix + "qm.billing")

    # submit -> decision, by Kafka record timestamps
    submitted: dict[str, int] = {}
    for rec in cluster:
        if b"workload.submitted.v1" in rec.value[:300]:
            submitted.setdefault(orjson.loads(rec.value)["payload"]["uid"], rec.timestamp)
    decided: dict[str, int] = {}
    validated: dict[str, int] = {}
    kinds: Counter = Counter()
    closed_through: dict[bytes, int] = {}
    reserved_uids: set[str] = set()
    ran_uids: set[str] = set()
    rejected_uids: set[str] = set()
    finished_uids: set[str] = set()
    for rec in trail:
        doc = orjson.loads(rec.value)
        kind = doc["event_type"]
        kinds[kind] += 1
        uid = doc["payload"].get("uid")
        if kind == "workload.quota_reserved.v1":
            reserved_uids.add(uid)
        elif kind == "workload.running.v1":
            ran_uids.add(uid)
        elif kind == "workload.rejected.v1":
            rejected_uids.add(uid)
        elif kind == "workload.finished.v1":
            finished_uids.add(uid)
        if kind == "workload.validated.v1":
            validated.setdefault(uid, rec.timestamp)
        elif kind in ("workload.quota_reserved.v1", "workload.pending.v1", "workload.rejected.v1"):
            decided.setdefault(uid, rec.timestamp)
        elif kind == "clock.tick.v1":
            at = floor_hour(_ms(doc["payload"]["at"]) - close_delay_s * 1000)  # as the ledger closes hours
            closed_through[rec.key] = max(closed_through.get(rec.key, at), at)
    to_decision = sorted(decided[u] - t for u, t in submitted.items() if u in decided)
    # A workload with no decision must have been deleted first: the trace's pods that never ran
    # are deleted at their deadline, at this speed milliseconds after their creation, and one
    # deleted before its verdict reached the queue-manager is never queued. Any other is lost.
    undecided = set(submitted) - set(decided)
    deleted_first, neither = undecided & finished_uids, undecided - finished_uids
    to_validated = sorted(validated[u] - t for u, t in submitted.items() if u in validated)

    expected = expected_gpu_nano(trail, closed_through)
    # What the trace itself ran, for the workloads policy let in: a replay that runs every
    # admitted pod for its trace duration bills these as running.
    trace_running = sum(Decimal(w.run_s) * w.gpu_milli for w in workloads
                        if w.run_s and w.uid not in rejected_uids) / 3_600_000
    ledger, rows = ledger_gpu_nano(billing)
    exp_total, led_total = sum(expected.values()), sum(ledger.values())
    total_records = sum(records.values())
    result = {
        "trace": str(args.trace),
        "nodes": str(args.nodes),
        "scale": args.scale,
        "speed": args.speed,
        "workloads": len(workloads),
        "trace_span_h": round(span_s / 3600, 1),
        "simulated_h": round(stats.sim_seconds / 3600, 1) if stats else None,  # trace span + settling
        "settle_wall_s": args.settle,
        "skip_quiet_wall_s": args.skip_quiet,
        "close_delay_h": round(close_delay_s / 3600, 1),
        "complete": stats is not None and drained,
        "drain": {"drained_within_timeout": drained,
                  "ledger_rows_out_after_s": round(rows_out_after, 1) if rows_out_after else None,
                  "stalled": drain["stalled"], "timed_out": drain.get("timed_out", False),
                  "services_exited": exited,
                  "uncommitted_at_timeout": backlog_at_timeout, "uncommitted_at_end": drain["lags"]},
        "simulator_s": round(sim_wall, 1),
        "wall_s": round(wall, 1),
        "compression_achieved": round(span_s / wall),
        "bus_records": {t.removeprefix(stack.prefix): n for t, n in records.items()},
        "bus_records_total": total_records,
        "records_per_s": round(total_records / wall),
        "simulator": stats.as_dict() if stats else None,
        "workload_events": dict(kinds),
        # Reservations the simulator never ran, billed reserved-idle up to the cohort's last
        # tick: with --settle 0 those made after the trace's end (the simulator stops there; at
        # --speed 300000 a wall second of decision latency is 83 trace hours, so their number
        # grows with the services' lag); with settling, workloads evicted or expired first.
        "reserved_workloads": {"reserved": len(reserved_uids), "never_ran": len(reserved_uids - ran_uids)},
        "submit_to_decision_ms": {"decided": len(to_decision), "of": len(submitted),
                                  "deleted_before_a_decision": len(deleted_first),
                                  "neither_decided_nor_deleted": len(neither), "lost_uids": sorted(neither)[:20],
                                  "p50": pct(to_decision, 0.5),
                                  "p99": pct(to_decision, 0.99), "max": to_decision[-1] if to_decision else None},
        "submit_to_validated_ms": {"validated": len(to_validated), "p50": pct(to_validated, 0.5),
                                   "p99": pct(to_validated, 0.99)},
        "ledger": {
            "rows": rows,
            "gpu_hours": str(nano_to_decimal(led_total)),
            "gpu_hours_by_kind": {k: str(nano_to_decimal(v)) for k, v in ledger.items()},
            "expected_gpu_hours": str(nano_to_decimal(exp_total)),
            "expected_by_kind": {k: str(nano_to_decimal(v)) for k, v in expected.items()},
            "difference_gpu_hours": str(nano_to_decimal(led_total - exp_total)),
            "reconciled": led_total == exp_total,
            "closed_through": {k.decode(): v / HOUR_MS for k, v in closed_through.items()},
            "trace_running_gpu_hours": str(trace_running.quantize(Decimal("0.000000001"))),
            "rejected_by_policy": len(rejected_uids),
        },
        **process_figures(stack, "bench (simulator)"),
        **run_figures(stack, started, at_start, load_before),
    }  # fmt: skip
    if profiles is not None:
        result["profile"] = profiles
    result["summary_rows"] = summary_rows(result)
    return result


def _billed_against_trace(ledger: dict) -> str:
    billed = Decimal(ledger["gpu_hours_by_kind"].get("running", "0"))
    ran = Decimal(ledger.get("trace_running_gpu_hours") or "0")
    if not ran:
        return "n/a"
    return f"{billed:.3f} / {ran:.3f} ({billed / ran:.2%}, Δ {billed - ran:.9f})"


def _where_the_wall_went(r: dict) -> str:
    """The trace played, then the tail until the last ledger row: the cost service's backlog
    (docs/benchmarks.md, "Where the replay's time goes")."""
    done, last_row = r.get("simulator_s"), r["drain"].get("ledger_rows_out_after_s")
    cost_cpu = sum(v for k, v in (r.get("cpu_seconds") or {}).items() if k.startswith("cost-accounting") and v)
    if done is None or last_row is None:
        return f"simulator done after {done} s; the last ledger row not seen"
    return (f"simulator done after {done} s, the last ledger row out after {last_row} s "
            f"(a tail of {last_row - done:.1f} s; cost-accounting used {cost_cpu:.1f} CPU-s)")


def summary_rows(r: dict) -> list[dict]:
    note = "" if r["scale"] == 1 else f"scale {r['scale']:g}: {r['workloads']} workloads, {r['trace_span_h']} trace hours"
    if not r["complete"]:
        after = r["drain"]["ledger_rows_out_after_s"]
        exited = r["drain"].get("services_exited")
        why = (f"{', '.join(exited)} exited" if exited else "a service stalled" if r["drain"]["stalled"]
               else f"ledger rows all out only after {after} s" if after else "timed out")
        note = "; ".join(x for x in (note, f"incomplete: {why}, see drain in the JSON") if x)
    wall_met = (r["complete"] and r["wall_s"] < TARGET_WALL_S) if r["scale"] == 1 else (False if not r["complete"] else None)
    d, led = r["submit_to_decision_ms"], r["ledger"]
    return [
        row("alibaba-replay: whole trace, wall", f"{r['wall_s']} s ({r['compression_achieved']:,}× real time)",
            "—", f"< {TARGET_WALL_S} s (full trace)", wall_met, note),
        row("alibaba-replay: bus records/s", f"{r['records_per_s']:,} ({r['bus_records_total']:,} records)", "—", "—",
            None, note),
        row("alibaba-replay: where the wall went", _where_the_wall_went(r), "—", "—", None, note),
        row("alibaba-replay: submit → decision p50 / p99", f"{d['p50']} / {d['p99']} ms ({_decided(d)})",
            "—", "every workload decided or deleted first", _none_lost(d), note),
        row("alibaba-replay: ledger GPU-hours = bus trail", f"{led['gpu_hours']} vs {led['expected_gpu_hours']} "
            f"(Δ {led['difference_gpu_hours']}, {led['rows']:,} rows)", "—", "equal to the decimal",
            led["reconciled"], note),
        row("alibaba-replay: running GPU-hours billed / the trace's own (workloads policy let in)",
            _billed_against_trace(led), "—", "—", None, note),
        row("alibaba-replay: reservations never run",
            f"{r['reserved_workloads']['never_ran']:,} of {r['reserved_workloads']['reserved']:,} "
            f"(reserved-idle {led['gpu_hours_by_kind'].get('reserved-idle', '0')} GPU-h)", "—", "—", None, note),
    ]  # fmt: skip


def _decided(d: dict) -> str:
    """'8151/8152', with the workloads deleted before a decision, and any neither decided nor
    deleted (lost: named in the JSON). Results from before they were counted have neither."""
    text = f"{d['decided']}/{d['of']}"
    if d.get("deleted_before_a_decision"):
        text += f"; {d['deleted_before_a_decision']:,} deleted before a decision"
    if d.get("neither_decided_nor_deleted"):
        text += f"; {d['neither_decided_nor_deleted']:,} neither decided nor deleted (lost_uids)"
    return text


def _none_lost(d: dict) -> bool | None:
    """Every submitted workload is decided, deleted first, or neither: none may be neither."""
    if "deleted_before_a_decision" not in d:
        return None
    return d["neither_decided_nor_deleted"] == 0


async def main_async(args: argparse.Namespace) -> int:
    stop_on_signals()
    result = await run(args)
    path = write_result("alibaba-replay", result, args.out)
    print(f"\n### alibaba-replay (scale {args.scale:g}, speed {args.speed:g}, bench wall {result['bench_wall_s']} s, "
          f"load {result['load_before']} → {result['load_after']})\n")  # fmt: skip
    print_rows(result["summary_rows"])
    print(f"\npeak memory MiB {result['peak_memory_mib']}, broker JIT {result['broker_jit_cpu_s']} CPU-s\nwritten {path}")
    if note := jit_note(result):
        print(note)
    for label, prof in (result.get("profile") or {}).items():
        print(f"\nprofile {label}: {prof.get('samples')} samples; own time top: "
              + ", ".join(f"{f} {p}%" for f, p in prof.get("own_pct", [])[:8]))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--trace", default=str(TRACES / "openb_pod_list_default.csv"), help="pod list CSV (read in place)")
    p.add_argument("--nodes", default=str(TRACES / "openb_node_list_all_node.csv"), help="node list CSV (the fleet)")
    p.add_argument("--speed", type=float, default=300_000.0,
                   help="simulated seconds per wall second (default 300000: the 3,584-hour trace in ≈ 43 s)")
    p.add_argument("--scale", type=scale_arg, default=1.0, help="fraction of the pods (first by creation), in (0, 1]")
    p.add_argument("--holdback", type=float, default=2.0,
                   help="wall seconds ticks are held back, so answers in flight land before time moves on")
    p.add_argument("--skip-quiet", type=float, default=0.25,
                   help="skip the trace's quiet stretches: once no workload waits for a decision or to start and "
                        "nothing happened for this many wall seconds, jump to the next pod event (the hourly "
                        "ticks in between are published at once); default 0.25; 0: keep the steady pace throughout")
    p.add_argument("--settle", type=float, default=20.0,
                   help="after the trace's end, keep the simulated cluster running (ticks, late admits, pods to "
                        "their end) until every workload is done, or nothing happened for this many wall seconds "
                        "(default 20; 0: stop at the trace's end and drop what comes later)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds for the replay and the drain together: the figure of record (default 600)")
    p.add_argument("--reconcile-wait", type=float, default=900.0,
                   help="after a timeout, seconds more until every ledger row is out (qm.workloads read to the "
                        "end by every service), so the ledger can still be reconciled (0: do not wait; default 900)")
    add_run_options(p)
    p.add_argument("--out", default=None, help="result file (default bench/results/alibaba-replay.json)")
    return run_cli(main_async, p)


if __name__ == "__main__":
    raise SystemExit(main())
