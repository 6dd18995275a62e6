"""`qm simulate`: run Kueue-format objects through the quota core, JSON out.

Reads files or directories (``*.yaml``/``*.yml``/``*.json``, not recursive, multi-document),
builds the snapshot from admitted workloads and schedules the pending ones: one Kueue
cycle by default, ``--cycles N`` cycles (preempted victims removed between cycles), or
``--mode drain`` (everything that fits, in one pass). Invalid input exits 2 with a one-line
message naming the file, the object and the field.
"""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from services.adapters.gc_tuning import tune_gc
from services.contracts import yaml_documents
from services.contracts.codec import epoch_of
from services.core.quota import ConfigError, build_snapshot, drain, load_objects, run_cycles

_SUFFIXES = (".yaml", ".yml", ".json")


class Mode(enum.StrEnum):
    cycle = "cycle"
    drain = "drain"


class InputError(Exception):
    """A file that cannot be read or parsed."""


def _files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _SUFFIXES))
        elif path.is_file():
            out.append(path)
        else:
            raise InputError(f"{path}: no such file or directory")
    return out


def read_documents(paths: list[Path]) -> list[tuple[str, Any]]:
    """All YAML documents in the given files/directories, with their file name."""
    docs: list[tuple[str, Any]] = []
    for path in _files(paths):
        try:
            text = path.read_text(encoding="utf-8")
            docs.extend((str(path), doc) for doc in yaml_documents.load_all(text))
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise InputError(f"{path}:{where}: invalid YAML: {problem}") from None
    return docs


def _parse_now(value: str | None) -> float:
    if value is None:
        return 0.0
    try:
        return epoch_of(value)
    except ValueError:
        raise typer.BadParameter(f"--now must be an RFC 3339 time, got {value!r}") from None


def simulate(
    files: Annotated[
        list[Path],
        typer.Option(
            "-f", "--filename", help="Kueue YAML files or directories (multi-document). Repeatable."
        ),
    ],
    cycles: Annotated[
        int, typer.Option("--cycles", min=1, help="Scheduling cycles to run (cycle mode).")
    ] = 1,
    mode: Annotated[
        Mode, typer.Option("--mode", help="cycle: Kueue cycles; drain: admit all that fits.")
    ] = Mode.cycle,
    now: Annotated[
        str | None,
        typer.Option(
            "--now", help="Simulation time (RFC 3339). Default: latest timestamp found in the input."
        ),
    ] = None,
) -> None:
    """Run one Kueue scheduling cycle (or a drain pass) over the pending workloads; print JSON."""
    tune_gc()  # large inputs: the same collector settings as the queue-manager
    try:
        objects = load_objects(read_documents(files))
    except (InputError, ConfigError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for warning in objects.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if now is not None:
        now_s = _parse_now(now)
    else:
        times = [w.created_at for w in objects.workloads] + [
            w.quota_reserved_at for w in objects.workloads if w.quota_reserved_at is not None
        ]
        now_s = max(times, default=0.0)
    snapshot = build_snapshot(objects)
    pending = [w for w in objects.workloads if w.admission is None]
    if mode is Mode.drain:
        result = drain(snapshot, pending, now_s)
    else:
        result = run_cycles(snapshot, pending, now_s, cycles=cycles)
    out = result.to_json()
    out["warnings"] = list(objects.warnings)
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
