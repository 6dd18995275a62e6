"""`qm explain <namespace>/<name>`: the workload's trail from the topics and why it is where it is.

Reads qm.cluster, qm.workloads, qm.actions, qm.preemption and qm.billing (from the beginning,
no consumer group) and hands the envelopes to the pure explainer (services.explain).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from services.adapters.bus import BrokerUnavailable, read_envelopes, wait_for_broker
from services.contracts.codec import Envelope
from services.explain import Explanation, explain

TOPICS = ("qm.cluster", "qm.workloads", "qm.actions", "qm.preemption", "qm.billing")


async def read_all(bootstrap: str, prefix: str, topics: tuple[str, ...] = TOPICS) -> list[Envelope]:
    """Every decodable envelope currently in the topics (undecodable ones are skipped: they are
    in the DLQ already)."""
    await wait_for_broker(bootstrap, timeout_s=10)
    out: list[Envelope] = []
    for topic in topics:
        async for _, envelope in read_envelopes(bootstrap, prefix + topic):
            if isinstance(envelope, Envelope):
                out.append(envelope)
    return out


def render(explanation: Explanation, console: Console) -> None:
    table = Table("time", "step", "detail", "by", title=f"Trail of {explanation.workload}", title_justify="left")
    for step in explanation.timeline:
        table.add_row(step.at, step.what, step.detail, step.producer)
    console.print(table)
    console.print(f"[bold]Verdict:[/bold] {explanation.verdict}")
    console.print(explanation.answer, markup=False)
    if explanation.holders:
        holders = Table("workload", "cluster queue", "GPU", "flavors", "since", "state", title="Who holds the quota")
        for h in explanation.holders[:15]:
            holders.add_row(h.workload, h.cluster_queue, f"{h.gpu_milli / 1000:g}", ", ".join(sorted(h.usage)),
                            h.reserved_at, "running" if h.running else "[yellow]reserved, not running[/yellow]")
        console.print(holders)
    if explanation.next_steps:
        console.print("[bold]What to do next:[/bold]")
        for step in explanation.next_steps:
            console.print(f"  • {step}", markup=False)


def explain_command(
    workload: Annotated[str, typer.Argument(help="<namespace>/<name> of the Job or Workload.")],
    bootstrap: Annotated[str, typer.Option("--bootstrap", help="Kafka bootstrap servers.")] = os.environ.get(
        "QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092"
    ),
    prefix: Annotated[str, typer.Option("--prefix", help="Topic prefix (QM_TOPIC_PREFIX).")] = os.environ.get(
        "QM_TOPIC_PREFIX", ""
    ),
    as_json: Annotated[bool, typer.Option("--json", help="Print the explanation as JSON.")] = False,
) -> None:
    """Show a workload's event trail and the reason it is where it is (and what to do)."""
    if "/" not in workload:
        raise typer.BadParameter("expected <namespace>/<name>, e.g. ml-team/llm-ft", param_hint="WORKLOAD")
    try:
        envelopes = asyncio.run(read_all(bootstrap, prefix))
    except BrokerUnavailable as error:
        typer.echo(f"qm explain: {error}", err=True)
        raise typer.Exit(2) from None
    explanation = explain(workload, envelopes)
    if as_json:
        typer.echo(json.dumps(explanation.to_dict(), indent=2, default=str))
    else:
        render(explanation, Console())
    if explanation.verdict == "not-found":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("explain")(explain_command)
