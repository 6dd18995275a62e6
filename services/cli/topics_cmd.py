"""`qm topics`: create and list the bus topics declared in schemas/topics.yaml."""

from __future__ import annotations

import asyncio
import os

import typer
from rich.console import Console
from rich.table import Table

from services.adapters.bus import BrokerUnavailable, create_topics
from services.contracts.schemas import topic_specs

topics_app = typer.Typer(help="Kafka topics declared in schemas/topics.yaml.", no_args_is_help=True)

BOOTSTRAP = typer.Option(
    os.environ.get("QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092"), "--bootstrap", help="Kafka bootstrap servers."
)
PREFIX = typer.Option(os.environ.get("QM_TOPIC_PREFIX", ""), "--prefix", help="Prefix for every topic name.")


@topics_app.command("create")
def create(bootstrap: str = BOOTSTRAP, prefix: str = PREFIX) -> None:
    """Create every topic and its dead-letter topic; existing topics are left as they are."""
    try:
        results = asyncio.run(create_topics(bootstrap, prefix))
    except BrokerUnavailable as error:
        typer.echo(f"qm topics create: {error}", err=True)
        raise typer.Exit(1) from None
    table = Table("topic", "partitions", "cleanup", "status")
    for r in results:
        table.add_row(r.name, str(r.partitions), r.cleanup_policy, "created" if r.created else "exists")
    Console().print(table)


@topics_app.command("list")
def list_topics() -> None:
    """Show the declared topics, their keys and what they carry (no broker needed)."""
    table = Table("topic", "key", "partitions", "cleanup", "events")
    for spec in topic_specs().values():
        table.add_row(spec.name, spec.key, str(spec.partitions), spec.cleanup_policy, ", ".join(spec.events))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(topics_app, name="topics")
