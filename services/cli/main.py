"""The `qm` command: one entry point, one sub-command module per capability.

Each capability registers its own Typer sub-app here, so `qm --help` lists
everything Quartermaster can do and each module stays small.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="qm",
    help=(
        "Quartermaster: GPU governance for Kubernetes.\n\n"
        "Start with `make demo` (everything set up and running), or `qm topics create` "
        "against a running broker, then the services."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from services.cli import (
        billing_cmd,
        config_cmd,
        demo_cmd,
        explain_cmd,
        policy_cmd,
        simulate_cmd,
        status_cmd,
        topics_cmd,
        webhook_cmd,
    )

    topics_cmd.register(app)
    config_cmd.register(app)
    simulate_cmd.register(app)
    policy_cmd.register(app)
    billing_cmd.register(app)
    demo_cmd.register(app)
    explain_cmd.register(app)
    status_cmd.register(app)
    webhook_cmd.register(app)


def main() -> None:
    _register()
    app()


if __name__ == "__main__":
    main()
