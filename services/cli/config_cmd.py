"""`qm config`: validate a configuration directory and publish it as the active set."""

from __future__ import annotations

import asyncio
import os
import time

import typer

from services.adapters.bus import BrokerUnavailable, Publisher
from services.adapters.config_set import collect, snapshot, validate
from services.contracts.codec import make_envelope
from services.core.quota import ConfigError
from services.policy.errors import PolicyError

PATHS = typer.Argument(..., help="Files or directories of YAML.")
config_app = typer.Typer(help="The active configuration (Kueue, Gatekeeper and quartermaster.dev objects).",
                         no_args_is_help=True)


@config_app.command("check")
def check(paths: list[str] = PATHS) -> None:
    """Validate without publishing: every error names the file, the object and the field."""
    docs = _valid(paths)
    typer.echo(f"ok: {len(docs)} configuration objects")


@config_app.command("publish")
def publish(
    paths: list[str] = PATHS,
    bootstrap: str = typer.Option(os.environ.get("QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092"), "--bootstrap"),
    prefix: str = typer.Option(os.environ.get("QM_TOPIC_PREFIX", ""), "--prefix"),
) -> None:
    """Validate, then publish as the new active set on qm.config; running services switch to it
    (an invalid set is refused here and the previous one stays active)."""
    docs = _valid(paths)
    version = int(time.time())
    config = snapshot(docs, version, ",".join(paths))
    envelope = make_envelope(config, producer="qm-cli", occurred_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    async def send() -> None:
        async with Publisher(bootstrap, prefix) as bus:
            await bus.publish("qm.config", "active", envelope)
            await bus.flush()

    try:
        asyncio.run(send())
    except BrokerUnavailable as error:
        typer.echo(f"qm config publish: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"published version {version} ({config.digest}, {len(docs)} objects) on {prefix}qm.config")


def _valid(paths: list[str]) -> list:
    try:
        docs = collect(paths)
        validate(docs)
    except (ConfigError, PolicyError) as error:
        typer.echo(f"invalid configuration: {error}", err=True)
        raise typer.Exit(2) from None
    return docs


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
