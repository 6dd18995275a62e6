"""services/core/cost is standard library only, with no clock, logging or I/O (checked on the AST)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

COST = Path(__file__).resolve().parents[4] / "services" / "core" / "cost"
FORBIDDEN_MODULES = {
    "logging",
    "asyncio",
    "socket",
    "subprocess",
    "threading",
    "os",
    "time",
    "random",
    "io",
    "yaml",
    "orjson",
    "pathlib",
    "shutil",
    "tempfile",
    "sqlite3",
    "urllib",
    "http",
}
FORBIDDEN_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter", "open", "print"}


def files():
    return sorted(COST.glob("*.py"))


def test_the_package_exists():
    assert len(files()) >= 5


@pytest.mark.parametrize("path", files(), ids=lambda p: p.name)
def test_only_standard_library_and_core_imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        for name in names:
            top = name.split(".")[0]
            if top == "services":
                assert name.startswith("services.core"), f"{path.name} imports {name}"
                continue
            assert top in sys.stdlib_module_names, f"{path.name} imports non-stdlib {name}"
            assert top not in FORBIDDEN_MODULES, f"{path.name} imports {name}"


@pytest.mark.parametrize("path", files(), ids=lambda p: p.name)
def test_no_wall_clock_or_io_calls(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            assert name not in FORBIDDEN_CALLS, f"{path.name}:{node.lineno} calls {name}()"
