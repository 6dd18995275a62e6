"""`qm demo`: Quartermaster on the local broker.

    --scenario trace  the four services driven by a simulated cluster replaying a trace
                      (services.demo.run), with a live view, a summary and an HTML report.
    --scenario seed   the field report step by step on the same stack (services.demo.seed):
                      every step's expected and observed outcome, and `qm explain` on each seed
                      workload; --json prints them machine-readable and exits 1 if a step failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from services.adapters.bus import BrokerUnavailable

console = Console()


def seed_demo(bootstrap: str, as_json: bool = False) -> None:
    """Play the field report's seed scenario on the full stack (admission, queue-manager,
    preemption, cost-accounting) and report each step's outcome."""
    from services.demo.seed import run_seed

    progress = Console(stderr=True) if as_json else console
    if not as_json:
        progress.print(f"[bold]Quartermaster demo[/bold] — the field report's seed scenario on {bootstrap}")
    try:
        outcome = asyncio.run(run_seed(bootstrap, progress=lambda m: progress.print(f"  [dim]→[/dim] {m}")))
    except BrokerUnavailable as error:
        typer.echo(f"qm demo: {error}", err=True)
        raise typer.Exit(1) from None
    except RuntimeError as error:  # a service did not start
        typer.echo(f"qm demo: {error}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        sys.stdout.write(json.dumps(outcome, indent=2, default=str) + "\n")
    else:
        _print_seed(outcome)
    if not outcome["ok"]:
        raise typer.Exit(1)


def _print_seed(outcome: dict) -> None:
    steps = Table("step", "what", "ok", "observed", title="The field report, step by step", show_lines=True)
    for s in outcome["steps"]:
        steps.add_row(str(s["step"]), s["title"], "[green]ok[/green]" if s["ok"] else "[red]FAILED[/red]",
                      s["message"])
    console.print(steps)
    verdicts = Table("workload", "when", "verdict", "answer", title="qm explain, from the event trail alone",
                     show_lines=True)
    for e in outcome["explain"]:
        if e["at"] != "end":
            verdicts.add_row(e["workload"], e["at"], e["verdict"], e["answer"])
    console.print(verdicts)
    changed = Table("object", "change", "why", title="Seed config: how it differs from the field report")
    for d in outcome["config"]["differences"]:
        changed.add_row(d["object"], d["change"], d["why"])
    console.print(changed)
    console.print(f"config {outcome['config']['dir']} · topics {outcome['topic_prefix']}* · "
                  f"{outcome['wall_s']} s · {'[green]all steps ok[/green]' if outcome['ok'] else '[red]some steps failed[/red]'}")


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
    as_json: bool = typer.Option(False, "--json", help="seed: print a machine-readable outcome per step."),
) -> None:
    """Run Quartermaster on the local broker: admission, queue-manager, preemption and
    cost-accounting, driven by a simulated GPU cluster replaying a trace. Prints a live view,
    then a summary, and writes an HTML report with charts."""
    if scenario == "seed":
        seed_demo(bootstrap, as_json)
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
