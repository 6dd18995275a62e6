"""Which parts of a CEL variable a policy set can read, and a copy of a value with only those.

Converting a Python value into CEL costs ~1.5 us per string in it (common-expression-language
0.10), and the Job object of a submission is ~55 us of it where k8srequiredlabels reads only
its labels (ADR 0048). So the evaluator binds each request variable cut down to the fields
the set's expressions select from it.

Pure. The reading of an expression is deliberately conservative: anything but a plain chain of
field selections off the variable (`object.metadata.labels`, then anything) keeps the whole
variable, so a cut can only ever drop fields no expression names:

* `object.spec.template` keeps `spec.template` whole, whatever follows it (`[...]`, `in`, ...);
* `object.spec.containers.all(c, ...)` keeps `spec.containers` whole (`all` is a call);
* `has(object.metadata)`, a presence test, keeps `metadata` present, not its fields;
* `object.metadata.?labels` (an optional selection) keeps `metadata` whole;
* `object` alone, `object[...]`, `object.?spec`, or any expression with a comment: the whole
  variable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: A shape: WHOLE (keep the value), PRESENT (only that it is there) or {field: shape}.
WHOLE: Any = None
PRESENT = "present"

_CHAIN = re.compile(r"(?:\s*\.\s*[A-Za-z_]\w*)*")
_FIELD = re.compile(r"[A-Za-z_]\w*")


def split_literals(source: str) -> list[tuple[bool, str]]:
    """The source as (is a string literal, text) parts, in order: '...', "...", triple-quoted,
    raw or not. Joined, the texts are the source again."""
    parts: list[tuple[bool, str]] = []
    i = start = 0
    n = len(source)
    while i < n:
        c = source[i]
        if c in "\"'":
            parts.append((False, source[start:i]))
            quote = source[i : i + 3] if source[i : i + 3] in ('"""', "'''") else c
            j = i + len(quote)
            while j < n and source[j : j + len(quote)] != quote:
                j += 2 if source[j] == "\\" else 1
            j = min(n, j + len(quote))
            parts.append((True, source[i:j]))
            i = start = j
            continue
        i += 1
    parts.append((False, source[start:]))
    return parts


def shapes(sources: Iterable[tuple[str, Iterable[str]]]) -> dict[str, Any]:
    """variable -> the shape that every expression reads of it, from (source, the variables the
    compiled program references) pairs. A referenced variable not found in its source as a
    plain name (there should be none) is read whole."""
    out: dict[str, Any] = {}
    for source, referenced in sources:
        for name, shape in _read(source, frozenset(referenced)).items():
            out[name] = _union(out[name], shape) if name in out else shape
    return out


def _read(source: str, names: frozenset[str]) -> dict[str, Any]:
    if not names:
        return {}
    if "//" in source:  # a comment may hold quotes and names: read it all
        return dict.fromkeys(names, WHOLE)
    root = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b")
    out: dict[str, Any] = {}
    for code in (text for literal, text in split_literals(source) if not literal):
        for match in root.finditer(code):
            chain = _CHAIN.match(code, match.end())
            assert chain is not None  # zero selections match too
            path = _FIELD.findall(chain.group(0))
            rest = code[chain.end():].lstrip()
            if rest.startswith("(") and path:
                path.pop()  # a method or macro called on what comes before it
            if not path:
                shape: Any = WHOLE
            elif code[: match.start()].rstrip().endswith("has(") and rest.startswith(")"):
                shape = _nest(path, PRESENT)
            else:
                shape = _nest(path, WHOLE)
            name = match.group(1)
            out[name] = _union(out[name], shape) if name in out else shape
    for name in names - out.keys():
        out[name] = WHOLE
    return out


def _nest(path: list[str], leaf: Any) -> Any:
    shape = leaf
    for field in reversed(path):
        shape = {field: shape}
    return shape


def _union(a: Any, b: Any) -> Any:
    if a is WHOLE or b is WHOLE:
        return WHOLE
    if a == PRESENT:
        return b
    if b == PRESENT:
        return a
    merged = dict(a)
    for field, shape in b.items():
        merged[field] = _union(merged[field], shape) if field in merged else shape
    return merged


def cut(value: Any, shape: Any) -> Any:
    """`value` with only the fields `shape` names (a copy; `value` is not changed). What is not
    a map where the shape selects fields is kept whole: CEL then says what it says of it."""
    if shape is WHOLE:
        return value
    if not isinstance(value, dict):
        return value
    if shape == PRESENT:
        return {}
    return {field: cut(value[field], sub) for field, sub in shape.items() if field in value}
