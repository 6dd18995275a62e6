"""Layering, checked on the source: core is pure, services talk only through schemas/ events."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"
SERVICE_PACKAGES = ("watcher", "admission", "queue_manager", "preemption", "cost_accounting")
# Names that would let core reach the world: the clock, logging, I/O and concurrency.
CORE_FORBIDDEN_STDLIB = {"logging", "asyncio", "socket", "subprocess", "threading", "os", "time", "random"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.add("." * node.level + (node.module or ""))
    return found


def python_files(package: str) -> list[Path]:
    return sorted((SERVICES / package).rglob("*.py"))


@pytest.mark.parametrize("path", python_files("core"), ids=lambda p: str(p.relative_to(SERVICES)))
def test_core_imports_only_the_standard_library_and_itself(path):
    for name in imports_of(path):
        top = name.split(".")[0]
        if name.startswith("."):
            continue  # relative imports stay inside core
        if top == "services":
            assert name.startswith("services.core"), f"{path}: core may not import {name}"
            continue
        assert top in sys.stdlib_module_names, f"{path}: core imports third-party module {name}"
        assert top not in CORE_FORBIDDEN_STDLIB, f"{path}: core must not use {name} (no I/O, clock or logging)"


def test_core_never_reads_the_wall_clock():
    for path in python_files("core"):
        source = path.read_text()
        for call in ("datetime.now(", "datetime.utcnow(", "date.today(", "time.time("):
            assert call not in source, f"{path}: {call} — time is an argument in core"


@pytest.mark.parametrize("service", SERVICE_PACKAGES)
def test_services_do_not_import_each_other(service):
    others = [s for s in SERVICE_PACKAGES if s != service]
    for path in python_files(service):
        for name in imports_of(path):
            for other in others:
                assert not name.startswith(f"services.{other}"), f"{path} imports services.{other}: use events"
