"""`qm policy`: test policy suites, check a policy directory, and ask what-if before applying."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

policy_app = typer.Typer(help="Admission policies: test suites, check, what-if.", no_args_is_help=True)


@policy_app.command("test")
def test_cmd(
    directory: Annotated[
        Path, typer.Argument(help="A suite.yaml or a directory searched for suite.yaml files")
    ],
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also print the violations of passing cases")
    ] = False,
) -> None:
    """Run gatekeeper-library style suites (suite.yaml); exit 1 if any case fails."""
    from services.policy.suite import SuiteError, find_suites, run_suite

    suites = find_suites(directory)
    if not suites:
        typer.echo(f"no suite.yaml under {directory}", err=True)
        raise typer.Exit(2)
    passed = failed = 0
    for suite in suites:
        try:
            results = run_suite(suite)
        except SuiteError as e:
            typer.echo(f"ERROR {suite}: {e}")
            failed += 1
            continue
        for r in results:
            status = "PASS" if r.passed else "FAIL"
            typer.echo(f"{status} {r.id} ({r.duration_s * 1000:.1f} ms)")
            if r.detail and (not r.passed or verbose):
                typer.echo(f"     {r.detail}")
            passed += r.passed
            failed += not r.passed
    typer.echo(f"{passed} passed, {failed} failed, {len(suites)} suite(s)")
    if failed:
        raise typer.Exit(1)


@policy_app.command("check")
def check_cmd(paths: Annotated[list[Path], typer.Argument(help="Policy files or directories")]) -> None:
    """Load and compile policies; print the file, object and field of the first invalid one."""
    from services.policy import PolicyError, PolicySet

    try:
        ps = PolicySet.load(paths)
    except PolicyError as e:
        typer.echo(f"invalid policy: {e}", err=True)
        raise typer.Exit(1) from None
    for p in ps.policies:
        typer.echo(f"{p.kind}/{p.name}  action={p.enforcement_action}  ({p.file})")
    typer.echo(f"{len(ps)} policies OK, version {ps.version}")


@policy_app.command("what-if")
def what_if_cmd(
    files: Annotated[list[Path], typer.Option("-f", "--file", help="The new or changed policy (repeatable)")],
    workloads: Annotated[Path, typer.Option("--workloads", help="Snapshot of live workloads (YAML/JSON)")],
    usage: Annotated[
        list[Path] | None, typer.Option("--usage", help="qm.usage records, Namespaces, budgets (repeatable)")
    ] = None,
    policies: Annotated[
        list[Path] | None,
        typer.Option(
            "--policies", help="The currently active policies (templates are resolved from here too)"
        ),
    ] = None,
    operation: Annotated[str, typer.Option("--operation", help="Evaluate as CREATE or UPDATE")] = "CREATE",
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
    fail_on_block: Annotated[
        bool, typer.Option("--fail-on-block", help="Exit 3 when anything newly blocked")
    ] = False,
) -> None:
    """List the live workloads a new or changed policy would block (or warn), and why."""
    from services.policy import PolicyError, PolicySet
    from services.policy.loader import load_with_templates
    from services.policy.whatif import FileSnapshotSource, what_if

    try:
        current = PolicySet.load(policies) if policies else None
        candidate = load_with_templates(files, current)
    except PolicyError as e:
        typer.echo(f"invalid policy: {e}", err=True)
        raise typer.Exit(1) from None
    if not candidate.policies:
        typer.echo("no policy found in the given file(s)", err=True)
        raise typer.Exit(1)
    source = FileSnapshotSource(workloads, tuple(usage or ()))
    report = what_if(candidate, source.snapshot(), current, operation=operation)
    if output == "json":
        typer.echo(
            json.dumps(
                {
                    "evaluated": report.evaluated,
                    "blocked": len(report.blocked),
                    "newlyBlocked": len(report.newly_blocked),
                    "rows": [r.__dict__ for r in report.rows],
                },
                indent=2,
            )
        )
    else:
        names = ", ".join(p.name for p in candidate.policies)
        typer.echo(f"what-if {names}: {report.evaluated} workloads evaluated, "
                   f"{len(report.blocked)} would be blocked ({len(report.newly_blocked)} newly)")  # fmt: skip
        for r in report.rows:
            now = " (already blocked)" if r.blocked_now else ""
            typer.echo(
                f"  {r.enforcement_action.upper():6} {r.namespace}/{r.name} [{r.kind}] {r.policy}: {r.message}{now}"
            )
    if fail_on_block and report.newly_blocked:
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    app.add_typer(policy_app, name="policy")
