"""`qm policy`: test policy suites, check a policy directory, ask what-if before applying, and
ask where a workload may run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

policy_app = typer.Typer(help="Admission policies: test suites, check, what-if, where.", no_args_is_help=True)


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


@policy_app.command("where")
def where_cmd(
    job: Annotated[Path, typer.Argument(help="The workload: a batch/v1 Job, a Volcano Job or a Kueue Workload (YAML)")],
    config: Annotated[Path, typer.Option("--config", help="The Kueue objects (as QM_CONFIG_DIR)")] = Path(
        "examples/seed"),
    policies: Annotated[
        list[Path] | None, typer.Option("--policies", help="The active policies [default: policies/library]")
    ] = None,
    state: Annotated[
        Path | None,
        typer.Option("--state", help="Namespaces, qm.usage and qm.budgets records (YAML/JSON), as the webhook's "
                                     "--state; without it the namespace has only its name label"),
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """Where may this workload run? Judge it as admission does: as submitted, then on each flavor
    its queue has (ADR 0070-0072). Exit 0 if some flavor takes it, 3 if none can.

    Example: qm policy where train.yaml --config examples/seed --state live.yaml"""
    from services.adapters.kueue_config import load_config_dir
    from services.admission.placement import flavor_rows, pod_sets_of
    from services.contracts import yaml_documents
    from services.core.quota import ConfigError
    from services.policy import EnforcementPoint, PolicyError, PolicySet, evaluate
    from services.policy.live import load_state_file
    from services.policy.views import QUEUE_LABEL, cost_center_of

    try:
        objects = load_config_dir(config)
        policy_set = PolicySet.load(policies or [Path("policies/library")])
        docs = [d for d in yaml_documents.load_all(job.read_text()) if isinstance(d, dict)]
    except (ConfigError, PolicyError, OSError) as e:
        typer.echo(f"cannot read the inputs: {e}", err=True)
        raise typer.Exit(2) from None
    if len(docs) != 1:
        typer.echo(f"{job}: expected one workload document, found {len(docs)}", err=True)
        raise typer.Exit(2)
    obj = docs[0]
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    queue = (meta.get("labels") or {}).get(QUEUE_LABEL) or (obj.get("spec") or {}).get("queueName")
    local = objects.local_queues.get((namespace, queue)) if queue else None
    if local is None:
        typer.echo(f"{namespace}/{meta.get('name', '?')}: no LocalQueue {queue!r} in namespace {namespace} in {config} "
                   f"(the {QUEUE_LABEL} label names it)", err=True)
        raise typer.Exit(2)
    live = load_state_file(str(state) if state else None)
    namespace_object = live.namespace(namespace) or {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {"kubernetes.io/metadata.name": namespace}}}
    cost_center = cost_center_of(obj, namespace_object)

    def judge(o: dict, only: frozenset[int] | None = None):
        return evaluate(policy_set, o, namespace_object, live.usage(namespace),
                        live.budget(cost_center) if cost_center else None, live.cluster,
                        enforcement_point=EnforcementPoint.BUS, only=only)

    submitted = judge(obj)
    rows = flavor_rows(judge, policy_set, obj, objects, local.cluster_queue, pod_sets_of(obj)) if submitted.allowed else []
    runs = submitted.allowed and any(r.verdict == "allowed" for r in rows)
    if output == "json":
        typer.echo(json.dumps({"workload": f"{namespace}/{meta.get('name', '')}", "clusterQueue": local.cluster_queue,
                               "allowedAsSubmitted": submitted.allowed, "refusals": [v.render() for v in submitted.denials],
                               "flavors": [r.__dict__ for r in rows], "canRun": runs}, indent=2))
    else:
        typer.echo(f"{namespace}/{meta.get('name', '')} in LocalQueue {queue} -> ClusterQueue {local.cluster_queue}")
        if not submitted.allowed:
            typer.echo("refused as submitted:")
            for v in submitted.denials:
                typer.echo(f"  {v.render()}")
        for r in rows:
            why = f": {r.why}" if r.why else ""
            typer.echo(f"  {r.pod_set} {r.resource} on {r.flavor}: {r.verdict}{why}")
        typer.echo("it can run on the flavors marked allowed" if runs else
                   "it cannot run in this queue: no flavor takes it")
    if not runs:
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    app.add_typer(policy_app, name="policy")
