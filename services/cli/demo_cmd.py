"""`qm demo`: the field report's seed scenario on the running stack.

Today it starts the queue-manager on the local broker with examples/seed, plays the seed
steps as events (what the watcher and admission will publish), and prints what the
queue-manager decided, read back from the topics. The trace-driven cluster simulator,
the live view and the HTML report come with issue 9.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from services.adapters.bus import BrokerUnavailable, Publisher, create_topics, read_envelopes
from services.contracts.codec import make_envelope
from services.contracts.events import ClockTick, PodRunning, WorkloadValidated

REPO = Path(__file__).resolve().parents[2]
console = Console()


def _validated(name: str, gpus: int, at: str) -> object:
    return make_envelope(
        WorkloadValidated(
            uid=f"seed-{name}", namespace="ml-team", name=name, queue_name="team-ml", cluster_queue="gpu-queue",
            priority=0, created_at=at,
            pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}],
        ),
        producer="qm-demo", occurred_at=at,
    )


async def _play(bootstrap: str, prefix: str) -> None:
    async with Publisher(bootstrap, prefix) as bus:
        steps = [
            ("12 GPUs already in use in team-ml", _validated("running-12", 12, "2026-11-29T10:00:00Z")),
            ("a 4-GPU training job arrives", _validated("train-4gpu", 4, "2026-11-29T10:00:10Z")),
            ("an 8-GPU batch job arrives (24 GPUs now in use)", _validated("batch-8gpu", 8, "2026-11-29T10:00:15Z")),
            ("a 16-GPU job arrives with 8 left", _validated("train-16gpu", 16, "2026-11-29T10:00:20Z")),
        ]
        for text, envelope in steps:
            console.print(f"  [dim]→[/dim] {text}")
            await bus.publish("qm.workloads", "gpu-queue", envelope)
        for name in ("running-12", "batch-8gpu"):
            running = PodRunning(uid=f"pod-{name}", workload_uid=f"seed-{name}", namespace="ml-team",
                                 name=f"{name}-0", queue_name="team-ml", workload_name=name,
                                 started_at="2026-11-29T10:00:30Z")
            await bus.publish("qm.cluster", f"seed-{name}",
                              make_envelope(running, producer="qm-demo", occurred_at="2026-11-29T10:00:30Z"))
        await bus.flush()
        await asyncio.sleep(2)  # let the running pod land before time moves on
        console.print("  [dim]→[/dim] five minutes pass; the 4-GPU job's pods never start")
        tick = ClockTick(at="2026-11-29T10:05:30Z", source="qm-demo")
        await bus.publish("qm.clock", "demo", make_envelope(tick, producer="qm-demo", occurred_at=tick.at))
        await bus.flush()


async def _trail(bootstrap: str, prefix: str) -> list:
    return [e async for _, e in read_envelopes(bootstrap, prefix + "qm.workloads") if not isinstance(e, Exception)]


def _detail(event_type: str, p) -> str:
    if event_type == "workload.quota_reserved.v1":
        return f"reserved on {', '.join(p.usage)}"
    if event_type == "workload.pending.v1":
        return p.message
    if event_type == "workload.prefreeze_expired.v1":
        gpus = sum(r.get("nvidia.com/gpu", 0) for r in p.usage.values()) / 1000
        return f"idle {p.idle_s:.0f} s holding {gpus:g} GPU"
    if event_type == "workload.released.v1":
        return p.reason
    if event_type == "workload.requeued.v1":
        return f"retry at {p.requeue_at} (backoff {p.backoff_s} s)"
    return ""


def _wait_ready(port: int, process: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the queue-manager exited during start; run with QM_LOG_LEVEL=info to see why")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("the queue-manager did not become ready in 60 s")


def seed_demo(bootstrap: str, wait_s: float = 20.0) -> None:
    """Play the field report's seed scenario through the queue-manager on the local broker."""
    run = uuid.uuid4().hex[:8]
    prefix = f"demo-{run}."
    try:
        asyncio.run(create_topics(bootstrap, prefix))
    except BrokerUnavailable as error:
        typer.echo(f"qm demo: {error}", err=True)
        raise typer.Exit(1) from None
    port = 6163
    env = {**os.environ, "QM_TOPIC_PREFIX": prefix, "QM_APP_ID_SUFFIX": f"-demo-{run}", "QM_KAFKA_BOOTSTRAP": bootstrap,
           "QM_CONFIG_DIR": str(REPO / "examples" / "seed"), "QM_STORE": "memory://", "QM_WEB_PORT": str(port),
           "QM_DATA_DIR": f"/tmp/quartermaster-demo-{run}", "PYTHONPATH": str(REPO)}
    console.print(f"[bold]Quartermaster demo[/bold] — seed scenario on {bootstrap} (topics {prefix}*)")
    console.print("  starting the queue-manager with examples/seed (a100-flavor, gpu-queue 32 GPUs, team-ml)…")
    log = open(f"/tmp/quartermaster-demo-{run}.log", "wb")  # noqa: SIM115 - lives as long as the worker
    worker = subprocess.Popen([sys.executable, "-m", "services.queue_manager", "worker", "--loglevel", "warn"],
                              cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(port, worker)
        asyncio.run(_play(bootstrap, prefix))
        deadline = time.monotonic() + wait_s
        trail = []
        while time.monotonic() < deadline:
            trail = asyncio.run(_trail(bootstrap, prefix))
            if any(e.event_type == "workload.requeued.v1" for e in trail):
                break
            time.sleep(1)
    finally:
        worker.terminate()
        worker.wait(30)
    table = Table("workload", "event", "detail", title="What the queue-manager decided (qm.workloads)")
    for e in trail:
        if e.producer != "queue-manager" or not e.event_type.startswith("workload."):
            continue
        p = e.payload
        detail = _detail(e.event_type, p)
        table.add_row(f"{p.namespace}/{p.name}", e.event_type.split(".")[1], detail)
    console.print(table)
    if not any(e.event_type == "workload.requeued.v1" for e in trail):
        console.print("[red]the scenario did not complete in time; see /tmp/quartermaster-demo-*.log[/red]")
        raise typer.Exit(1)
    console.print(
        "Coming next (issues 5-9): admission policies on the bus, preemption, the GPU-hour bill, "
        "the trace-driven simulator with a live view, and `qm explain`."
    )


def demo(
    scenario: str = typer.Option("trace", "--scenario", help="trace: the simulated cluster; seed: the field report step by step."),
    bootstrap: str = typer.Option(os.environ.get("QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092"), "--bootstrap"),
    speed: float = typer.Option(600.0, "--speed", help="Simulated seconds per wall second."),
    duration_h: float = typer.Option(4.0, "--duration", help="Simulated hours to run (trace scenario)."),
    pods: int = typer.Option(400, "--pods", help="Pods in the generated trace (ignored with TRACE)."),
    trace: str = typer.Option(os.environ.get("TRACE", ""), "--trace", envvar="TRACE",
                              help="An Alibaba GPU pod-list CSV to replay instead of the generated trace."),
    live: bool = typer.Option(True, "--live/--no-live", help="Show the live terminal view."),
    report_path: str = typer.Option("", "--report", help="Where to write the HTML report (default reports/)."),
) -> None:
    """Run Quartermaster on the local broker: admission, queue-manager, preemption and
    cost-accounting, driven by a simulated GPU cluster replaying a trace. Prints a live view,
    then a summary, and writes an HTML report with charts."""
    if scenario == "seed":
        seed_demo(bootstrap)
        return
    if scenario != "trace":
        raise typer.BadParameter("use --scenario trace or --scenario seed", param_hint="--scenario")
    from services.demo.run import DemoOptions, run_demo

    options = DemoOptions(bootstrap=bootstrap, speed=speed, duration_s=duration_h * 3600, pods=pods,
                          trace=trace or None, live=live, report_path=Path(report_path) if report_path else None)
    try:
        asyncio.run(run_demo(options, console))
    except BrokerUnavailable as error:
        typer.echo(f"qm demo: {error}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print("stopped; the services were shut down")
        raise typer.Exit(130) from None


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
