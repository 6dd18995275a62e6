"""The CEL environment: compile once, evaluate many, plus the Kubernetes CEL libraries.

`common-expression-language` (import name `cel`, a binding of cel-rust) gives the CEL
core and macros (`has`, `all`, `exists`, `exists_one`, `map`, `filter`). What
Kubernetes' CEL environment adds on top is registered here as ordinary functions
(`x.f(a)` is sugar for `f(x, a)`):

* lists: `sum()`, `min()`, `max()`, `indexOf()`, `lastIndexOf()`, `isSorted()`, `join()`
* strings: `charAt`, `indexOf`, `lowerAscii`, `upperAscii`, `replace`, `split`,
  `substring`, `trim`, `reverse` (from `cel.stdlib`)
* regex: `find`, `findAll`
* quantity: `quantity()`, `isQuantity()`, `.sign()`, `.isInteger()`, `.asInteger()`,
  `.asApproximateFloat()`, `.add()`, `.sub()`, `.compareTo()`, `.isLessThan()`,
  `.isGreaterThan()`. Functions cannot return custom types through the binding, so a
  quantity value is carried as its canonical string (`quantity("1Gi") == "1073741824"`,
  `quantity("1Gi") == quantity("1024Mi")`).
* Quartermaster: `gpuCount(object)` (total GPUs of a Job, Workload, Pod, ...),
  `quantityMilli(q)` (integer milli-units).

Not available (documented limits of the binding): the optional-field syntax `a.?b`,
`cel.bind`, `fold`, `strings.format`, the `url`/`ip`/`cidr`/`authz` libraries.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from fractions import Fraction
from functools import lru_cache
from typing import Any

import cel
from cel import stdlib as _stdlib

from services.policy.paths import split_literals
from services.policy.quantity import canonical, parse_quantity, quantity_milli

# --- quantity library ------------------------------------------------------------


def _q(value: Any) -> Fraction:
    return parse_quantity(value)


def _quantity(value: Any) -> str:
    return canonical(_q(value))


def _is_quantity(value: Any) -> bool:
    try:
        _q(value)
    except (ValueError, TypeError):
        return False
    return True


def _sign(value: Any) -> int:
    v = _q(value)
    return (v > 0) - (v < 0)


def _is_integer(value: Any) -> bool:
    return _q(value).denominator == 1


def _as_integer(value: Any) -> int:
    v = _q(value)
    if v.denominator != 1 or not -(2**63) <= v.numerator < 2**63:
        raise ValueError(f"quantity {value!r} is not representable as an int64")
    return v.numerator


def _as_approximate_float(value: Any) -> float:
    return float(_q(value))


def _add(a: Any, b: Any) -> str:
    return canonical(_q(a) + _q(b))


def _sub(a: Any, b: Any) -> str:
    return canonical(_q(a) - _q(b))


def _compare_to(a: Any, b: Any) -> int:
    x, y = _q(a), _q(b)
    return (x > y) - (x < y)


def _is_less_than(a: Any, b: Any) -> bool:
    return _q(a) < _q(b)


def _is_greater_than(a: Any, b: Any) -> bool:
    return _q(a) > _q(b)


# --- lists / strings / regex -----------------------------------------------------


def _index_of(container: Any, item: Any, *rest: Any) -> int:
    if isinstance(container, str):
        return _stdlib.index_of(container, item, *rest)
    for i, v in enumerate(container):
        if v == item and type(v) is type(item):
            return i
    return -1


def _last_index_of(container: Any, item: Any, *rest: Any) -> int:
    if isinstance(container, str):
        return _stdlib.last_index_of(container, item, *rest)
    for i in range(len(container) - 1, -1, -1):
        v = container[i]
        if v == item and type(v) is type(item):
            return i
    return -1


def _is_sorted(items: list[Any]) -> bool:
    return all(items[i] <= items[i + 1] for i in range(len(items) - 1))


@lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _find(s: str, pattern: str) -> str:
    m = _regex(pattern).search(s)
    return m.group(0) if m else ""


def _find_all(s: str, pattern: str, limit: int = -1) -> list[str]:
    found = [m.group(0) for m in _regex(pattern).finditer(s)]
    return found if limit < 0 else found[:limit]


def _gpu_count(obj: Any) -> int:
    from services.policy.views import workload_view  # local: views imports this module

    return workload_view(obj if isinstance(obj, dict) else {})["gpus"]


FUNCTIONS: dict[str, Callable[..., Any]] = {
    **_stdlib.STDLIB_FUNCTIONS,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "isSorted": _is_sorted,
    "find": _find,
    "findAll": _find_all,
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "sign": _sign,
    "isInteger": _is_integer,
    "asInteger": _as_integer,
    "asApproximateFloat": _as_approximate_float,
    "add": _add,
    "sub": _sub,
    "compareTo": _compare_to,
    "isLessThan": _is_less_than,
    "isGreaterThan": _is_greater_than,
    "gpuCount": _gpu_count,
    "quantityMilli": quantity_milli,
}

#: Functions cel-rust provides natively (operators are recognised by their prefix).
NATIVE_FUNCTIONS = frozenset(
    {
        "size", "has", "matches", "contains", "startsWith", "endsWith",
        "int", "uint", "double", "string", "bytes", "bool", "timestamp", "duration", "dyn", "type",
        "getFullYear", "getMonth", "getDayOfYear", "getDayOfMonth", "getDate", "getDayOfWeek",
        "getHours", "getMinutes", "getSeconds", "getMilliseconds",
        "all", "exists", "exists_one", "map", "filter",
        "optional.of", "optional.none", "optional.ofNonZeroValue", "hasValue", "orValue", "value", "or",
    }
)  # fmt: skip


class CelCompileError(ValueError):
    """A CEL expression that does not parse, or calls a function nobody provides."""


def _is_operator(name: str) -> bool:
    return not name[:1].isalpha()


@lru_cache(maxsize=4096)
def _compile_cached(source: str) -> cel.Program:
    return cel.compile(source)


#: Top-level CEL variables the evaluator can bind; only those a policy set references are bound.
ANY_OBJECT = "__qm_anyObject"
GK_PARAMS = "__qm_params"  # template-level compile only (validation of the template itself)
PARAMS_BY_POLICY = "__qm_pp"  # {policy key: constraint parameters}, bound once per request
PARAMS_OBJECT_BY_POLICY = "__qm_pc"  # {policy key: `params` (the constraint object / spec.params)}
ROOT_VARIABLES = frozenset(
    {"object", "oldObject", "request", "namespaceObject", "params", "variables", "workload", "usage", "budget",
     "cluster", ANY_OBJECT, GK_PARAMS, PARAMS_BY_POLICY, PARAMS_OBJECT_BY_POLICY}
)  # fmt: skip


def compile_expression(
    source: str, key: str | None = None, inline: dict[str, str] | None = None
) -> tuple[cel.Program, frozenset[str], frozenset[str]]:
    """Compile (cached by rewritten source); return the program, custom functions and root variables used.

    With `key` (one policy), `variables.params` and `params` read that policy's entry of
    request-wide maps, and `variables.<name>` is replaced by the variable's own expression
    (`inline`), so a request binds its CEL context once and never rebinds per policy.
    """
    rewritten = rewrite(source, key, inline or {})
    try:
        program = _compile_cached(rewritten)
    except ValueError as e:
        raise CelCompileError(str(e).strip()) from None
    used = program.functions()
    unknown = [f for f in used if not _is_operator(f) and f not in NATIVE_FUNCTIONS and f not in FUNCTIONS]
    if unknown:
        raise CelCompileError(f"undeclared reference to function(s) {', '.join(sorted(unknown))}")
    roots = frozenset(v for v in program.variables() if v in ROOT_VARIABLES)
    return program, frozenset(f for f in used if f in FUNCTIONS), roots


_VAR_RE = re.compile(r"\bvariables\s*\.\s*([A-Za-z_]\w*)")
_PARAMS_RE = re.compile(r"(?<![\w.])params\b")


def _rewrite_code(code: str, key: str | None, inline: dict[str, str]) -> str:
    def var(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "anyObject":
            return ANY_OBJECT
        if name == "params":
            return f"{PARAMS_BY_POLICY}.{key}" if key else GK_PARAMS
        if name in inline:
            return f"({inline[name]})"
        return m.group(0)

    code = _VAR_RE.sub(var, code)
    if key:
        code = _PARAMS_RE.sub(f"{PARAMS_OBJECT_BY_POLICY}.{key}", code)
    return code


def rewrite(source: str, key: str | None = None, inline: dict[str, str] | None = None) -> str:
    """Apply `_rewrite_code` to everything outside string literals."""
    inline = inline or {}
    if "variables" not in source and not (key and "params" in source):
        return source
    return "".join(text if literal else _rewrite_code(text, key, inline) for literal, text in split_literals(source))


def functions_for(names: Iterable[str]) -> dict[str, Callable[..., Any]]:
    """The registered Python functions among `names` (only those are put in a Context)."""
    return {name: FUNCTIONS[name] for name in names if name in FUNCTIONS}
