"""`qm status`: queues, usage and budgets at a glance, read from the topics."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from services.adapters.bus import BrokerUnavailable
from services.adapters.downstream_lag import GroupLag
from services.adapters.settings import Settings
from services.cli.explain_cmd import read_all
from services.explain.status import Status, gpus, status, usage_gpus

TOPICS = ("qm.workloads", "qm.cluster", "qm.usage", "qm.budgets")


async def queue_manager_behind(bootstrap: str, prefix: str, app_id_suffix: str) -> int | None:
    """Records of qm.workloads the queue-manager's group has not committed (None: no commits)."""
    group = Settings(service="queue-manager", app_id_suffix=app_id_suffix).app_id
    lag = GroupLag(bootstrap, group, f"{prefix}qm.workloads")
    await lag.start()
    try:
        return await lag.records_behind()
    finally:
        await lag.stop()


def render_lag(behind: int | None, console: Console) -> None:
    if behind is None:
        console.print("queue-manager: no commits on qm.workloads yet (not started, or another QM_APP_ID_SUFFIX)")
        return
    console.print(f"queue-manager: {behind} record(s) of qm.workloads not read yet; admission holds new "
                  "submissions while that is over QM_ADMISSION_MAX_QM_LAG (300 unless set; ADR 0049)")


def render(s: Status, console: Console) -> None:
    queues = Table("cluster queue", "pending", "reserved (idle)", "running", "GPU reserved", "GPU running",
                   title=f"Queues (as of {s.as_of or '-'})", title_justify="left")
    for cq, row in s.queues.items():
        idle = f"[yellow]{row['reserved']}[/yellow]" if row["reserved"] else "0"
        queues.add_row(cq, str(row["pending"]), idle, str(row["running"]), gpus(row["gpu_reserved"]),
                       gpus(row["gpu_running"]))
    console.print(queues)
    if s.rejected:
        console.print(f"{s.rejected} workload(s) rejected by admission policy (`qm explain <ns>/<name>` says why)")
    usage = Table("namespace", "GPU reserved", "GPU running", "flavors", title="Usage", title_justify="left")
    for ns, u in s.usage.items():
        flavors = ", ".join(sorted(set(u["reserved"]) | set(u["running"])))
        usage.add_row(ns, gpus(usage_gpus(u["reserved"])), gpus(usage_gpus(u["running"])), flavors)
    console.print(usage)
    if s.budgets:
        budgets = Table("cost center", "period", "used", "limit", "remaining", "state", title="Budgets",
                        title_justify="left")
        for cc, b in s.budgets.items():
            state = "[red]exhausted[/red]" if b["exhausted"] else "ok"
            budgets.add_row(cc, b["period"], f"{b['used']} {b['unit']}", b["limit"], b["remaining"], state)
        console.print(budgets)


def status_command(
    bootstrap: Annotated[str, typer.Option("--bootstrap", help="Kafka bootstrap servers.")] = os.environ.get(
        "QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092"
    ),
    prefix: Annotated[str, typer.Option("--prefix", help="Topic prefix (QM_TOPIC_PREFIX).")] = os.environ.get(
        "QM_TOPIC_PREFIX", ""
    ),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    app_id_suffix: Annotated[str, typer.Option(
        "--app-id-suffix", help="The services' QM_APP_ID_SUFFIX: names the queue-manager's consumer group."
    )] = os.environ.get("QM_APP_ID_SUFFIX", ""),
) -> None:
    """Queues, usage and budgets at a glance, and how far behind the queue-manager is."""
    try:
        envelopes = asyncio.run(read_all(bootstrap, prefix, TOPICS))
        behind = asyncio.run(queue_manager_behind(bootstrap, prefix, app_id_suffix))
    except BrokerUnavailable as error:
        typer.echo(f"qm status: {error}", err=True)
        raise typer.Exit(2) from None
    result = status(envelopes)
    if as_json:
        typer.echo(json.dumps({**result.to_dict(), "queueManagerRecordsBehind": behind}, indent=2))
    else:
        console = Console()
        render(result, console)
        render_lag(behind, console)


def register(app: typer.Typer) -> None:
    app.command("status")(status_command)
