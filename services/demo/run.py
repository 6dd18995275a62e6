"""`qm demo`: the five services (the simulator stands in for the watcher) on the local broker,
driven by a trace, with a live view, a summary and an HTML report."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from services.adapters.bus import create_topics
from services.demo import report
from services.demo.observe import Observed, follow, settle
from services.demo.stack import REPO, Stack
from services.sim.config import write_kueue_config
from services.sim.runner import SimStats, run_simulation
from services.trace.synthetic import synthetic_pods


@dataclass(frozen=True)
class DemoOptions:
    bootstrap: str
    speed: float = 600.0
    duration_s: float = 4 * 3600
    pods: int = 400
    trace: str | None = None
    live: bool = True
    report_path: Path | None = None


def _view(stats: SimStats, observed: Observed, started: float) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_row(f"[bold]simulated time[/bold] {stats.sim_time}", f"wall {time.monotonic() - started:.0f}s",
                 f"submitted {stats.submitted}", f"running {stats.running}", f"finished {stats.finished}",
                 f"GPUs running {stats.gpu_running_milli / 1000:g}")
    queues = Table("ClusterQueue", "pending", "admitted now", title="Queues")
    pending, admitted = observed.pending_by_queue(), observed.admitted_by_queue()
    for cq in sorted(set(pending) | set(admitted)):
        queues.add_row(cq, str(pending[cq]), str(admitted[cq]))
    usage = Table("namespace", "reserved GPU", "running GPU", title="Usage (qm.usage)")
    for ns, u in sorted(observed.usage.items()):
        usage.add_row(ns, f"{u['reserved']:g}", f"{u['running']:g}")
    decisions = Table("admitted", "rejected", "preempted", "pre-freeze expired", title="Decisions")
    decisions.add_row(str(observed.reserved), str(observed.rejected), str(observed.preempted), str(observed.expired))
    bill = Table("cost center", "GPU-hours", "idle GPU-hours", "cost", title="Billing so far (qm.billing)")
    for cc, b in sorted(observed.billing().items()):
        bill.add_row(cc, f"{b['gpu_hours']:.2f}", f"{b['idle_gpu_hours']:.2f}", f"{b['cost']:.2f} {b.get('currency', '')}")
    return Group(head, queues, usage, decisions, bill)


async def run_demo(options: DemoOptions, console: Console) -> dict:
    run = uuid.uuid4().hex[:8]
    prefix = f"demo-{run}."
    run_dir = Path(f"/tmp/quartermaster-demo-{run}")
    config_dir = run_dir / "config"
    config_dir.mkdir(parents=True)
    write_kueue_config(config_dir)
    (config_dir / "pricelist.yaml").write_text((REPO / "examples" / "seed" / "pricelist.yaml").read_text())
    await create_topics(options.bootstrap, prefix)
    stack = Stack(run_dir, {
        "QM_KAFKA_BOOTSTRAP": options.bootstrap, "QM_TOPIC_PREFIX": prefix, "QM_APP_ID_SUFFIX": f"-demo-{run}",
        "QM_CONFIG_DIR": str(config_dir), "QM_POLICY_DIR": str(REPO / "policies" / "library"),
        "QM_STORE": "memory://", "QM_DATA_DIR": str(run_dir / "data"),
        # Time is compressed: give pods ~10 wall seconds to start after their admit.
        "QM_PODS_READY_TIMEOUT_S": str(max(900, int(options.speed * 10))),
    })
    console.print(f"[bold]Quartermaster demo[/bold] · topics {prefix}* on {options.bootstrap} · logs {run_dir}")
    console.print("starting admission, queue-manager, preemption and cost-accounting…")
    stack.start()
    observed = Observed()
    stop = asyncio.Event()
    stats_box = {"stats": SimStats()}
    started = time.monotonic()
    try:
        await asyncio.get_running_loop().run_in_executor(None, stack.wait_ready)
        console.print("services ready; the simulator submits the trace (Ctrl-C stops everything)")
        follower = asyncio.create_task(follow(options.bootstrap, prefix, observed, stop))

        def progress(stats: SimStats) -> None:
            stats_box["stats"] = stats
            observed.timeline.append({"sim_s": stats.sim_seconds, "gpu_running": stats.gpu_running_milli / 1000,
                                      "pending": len(observed.pending_now), "running": stats.running})

        trace = options.trace or synthetic_pods(options.pods, span_s=int(options.duration_s))
        simulation = asyncio.create_task(run_simulation(
            options.bootstrap, prefix, trace=trace, speed=options.speed, duration_s=options.duration_s,
            on_progress=progress, config_dir=config_dir))
        if options.live:
            with Live(_view(stats_box["stats"], observed, started), console=console, refresh_per_second=4) as live:
                while not simulation.done():
                    await asyncio.sleep(0.25)
                    live.update(_view(stats_box["stats"], observed, started))
        final = await simulation
        await settle(observed, final.submitted)  # let the last decisions and ledger rows land
        stop.set()
        await follower
    finally:
        stop.set()
        stack.stop()
    summary = _summary(final, observed, time.monotonic() - started)
    console.print(_summary_table(summary))
    path = options.report_path or (REPO / "reports" / f"demo-{run}.html")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_report(summary, observed))
    console.print(f"report: {path}")
    return {**summary, "report": str(path)}


def _summary(stats: SimStats, observed: Observed, wall_s: float) -> dict:
    billing = observed.billing()
    waits = [w for _, w in observed.waits_s]
    return {
        "wall_s": round(wall_s, 1),
        "simulated": stats.sim_time,
        "submitted": stats.submitted,
        "validated": observed.validated,
        "rejected": observed.rejected,
        "admitted": observed.reserved,
        "preempted": observed.preempted,
        "prefreeze_expired": observed.expired,
        "finished": stats.finished,
        "mean_wait_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
        "ledger_rows": len(observed.rows),
        "gpu_hours": str(sum((b["gpu_hours"] for b in billing.values()), Decimal(0))),
        "top_rejection": observed.rejections.most_common(1)[0][0] if observed.rejections else "",
    }


def _summary_table(summary: dict) -> Table:
    t = Table("summary", "value", title="Quartermaster demo")
    for k, v in summary.items():
        t.add_row(k.replace("_", " "), str(v))
    return t


def _report(summary: dict, observed: Observed) -> str:
    xs = [p["sim_s"] / 3600 for p in observed.timeline]
    utilization = report.line_chart(
        "GPU utilization and queue over time", xs,
        {"GPUs running": [p["gpu_running"] for p in observed.timeline],
         "workloads pending": [p["pending"] for p in observed.timeline]}, "simulated hours")
    wait_points = sorted(observed.waits_s)
    waits = report.line_chart("Queue wait (submission → quota reserved)", list(range(len(wait_points))),
                              {"wait seconds": [w for _, w in wait_points]}, "admissions in order")
    billing = observed.billing()
    by_team = report.bar_chart("GPU-hours by team (cost center)",
                               {cc: float(b["gpu_hours"]) for cc, b in billing.items()}, "GPU-h")
    cost = report.bar_chart("Cost by cost center", {cc: float(b["cost"]) for cc, b in billing.items()},
                            next((str(b.get("currency", "")) for b in billing.values()), ""))
    rejections = report.table(("message", "count"), observed.rejections.most_common(10))
    return report.render("Quartermaster demo report", list(summary.items()), [utilization, waits, by_team, cost],
                         [("Most frequent rejections", rejections)])
