"""Gatekeeper's `match` semantics (pkg/mutation/match), as a pure function.

A constraint applies when every criterion it defines matches: kinds, scope, namespaces,
excludedNamespaces, labelSelector, namespaceSelector, name. Undefined criteria match
everything. Namespaces and names accept a prefix (`kube-*`) or suffix (`*-system`) glob.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.policy.errors import PolicyError


@dataclass(frozen=True)
class KindSpec:
    api_groups: tuple[str, ...]
    kinds: tuple[str, ...]


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: dict[str, Any]) -> bool:
        for r in self.requirements:
            present = r.key in labels
            if r.operator == "In" and not (present and str(labels[r.key]) in r.values):
                return False
            if r.operator == "NotIn" and present and str(labels[r.key]) in r.values:
                return False
            if r.operator == "Exists" and not present:
                return False
            if r.operator == "DoesNotExist" and present:
                return False
        return True


@dataclass(frozen=True)
class Match:
    kinds: tuple[KindSpec, ...] = ()
    scope: str = "*"
    namespaces: tuple[str, ...] = ()
    excluded_namespaces: tuple[str, ...] = ()
    label_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    name: str = ""
    operations: tuple[str, ...] = field(default=())  # Quartermaster extension; empty = all

    @property
    def needs_namespace_object(self) -> bool:
        return self.namespace_selector is not None


def wildcard_matches(pattern: str, value: str) -> bool:
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    if pattern.startswith("*"):
        return value.endswith(pattern[1:])
    return pattern == value


def _group(api_version: str) -> str:
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def is_namespace(obj: dict[str, Any]) -> bool:
    return obj.get("kind") == "Namespace" and _group(str(obj.get("apiVersion", "v1"))) == ""


class MatchError(Exception):
    """Matching needs data it does not have (e.g. the object's Namespace)."""


def matches(
    m: Match, obj: dict[str, Any], namespace_object: dict[str, Any] | None, operation: str = "CREATE"
) -> bool:
    """True when `obj` is in scope of `m`. Raises MatchError when a namespaceSelector needs a missing Namespace."""
    meta = obj.get("metadata") or {}
    if m.operations and operation not in m.operations and "*" not in m.operations:
        return False
    if m.kinds:
        kind, group = obj.get("kind", ""), _group(str(obj.get("apiVersion", "")))
        ok = False
        for k in m.kinds:
            if k.kinds and "*" not in k.kinds and kind not in k.kinds:
                continue
            if not k.api_groups or "*" in k.api_groups or group in k.api_groups:
                ok = True
                break
        if not ok:
            return False
    obj_ns = meta.get("namespace") or ""
    is_ns = is_namespace(obj)
    has_ns = bool(obj_ns) or namespace_object is not None
    if m.scope == "Cluster" and not (is_ns or not has_ns):
        return False
    if m.scope == "Namespaced" and not (not is_ns and has_ns):
        return False
    if is_ns:
        ns_name = meta.get("name", "")
    elif namespace_object is not None:
        ns_name = (namespace_object.get("metadata") or {}).get("name", "") or obj_ns
    else:
        ns_name = obj_ns
    if m.namespaces and ns_name and not any(wildcard_matches(p, ns_name) for p in m.namespaces):
        return False
    if m.excluded_namespaces and ns_name and any(wildcard_matches(p, ns_name) for p in m.excluded_namespaces):
        return False
    if m.label_selector is not None and not m.label_selector.matches(meta.get("labels") or {}):
        return False
    if m.namespace_selector is not None:
        if is_ns:
            return m.namespace_selector.matches(meta.get("labels") or {})
        if namespace_object is None:
            if not obj_ns:
                return True  # non-Namespace cluster-scoped objects always match
            raise MatchError(f"namespaceSelector needs Namespace {obj_ns!r}, which is not known: the watcher has "
                             "not reported it (is the watcher running and allowed to list namespaces?)")
        if not m.namespace_selector.matches((namespace_object.get("metadata") or {}).get("labels") or {}):
            return False
    if m.name and not wildcard_matches(m.name, meta.get("name", "")):
        return False
    return True


# --- parsing ---------------------------------------------------------------------


def _str_list(value: Any, file: str, obj: str, fld: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(file, obj, fld, "must be a list of strings")
    return tuple(value)


def parse_label_selector(raw: Any, file: str, obj: str, fld: str) -> LabelSelector | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise PolicyError(file, obj, fld, "must be a label selector (matchLabels / matchExpressions)")
    reqs: list[Requirement] = []
    match_labels = raw.get("matchLabels") or {}
    if not isinstance(match_labels, dict):
        raise PolicyError(file, obj, f"{fld}.matchLabels", "must be a map of label to value")
    for k, v in match_labels.items():
        reqs.append(Requirement(str(k), "In", (str(v),)))
    for i, e in enumerate(raw.get("matchExpressions") or []):
        f = f"{fld}.matchExpressions[{i}]"
        if not isinstance(e, dict) or "key" not in e:
            raise PolicyError(file, obj, f, "must have key and operator")
        op = e.get("operator")
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise PolicyError(
                file, obj, f"{f}.operator", f"unknown operator {op!r} (In, NotIn, Exists, DoesNotExist)"
            )
        values = _str_list(e.get("values"), file, obj, f"{f}.values")
        if op in ("In", "NotIn") and not values:
            raise PolicyError(file, obj, f"{f}.values", f"operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise PolicyError(file, obj, f"{f}.values", f"operator {op} takes no values")
        reqs.append(Requirement(str(e["key"]), op, values))
    return LabelSelector(tuple(reqs))


def parse_match(raw: Any, file: str, obj: str, fld: str) -> Match:
    if raw is None:
        return Match()
    if not isinstance(raw, dict):
        raise PolicyError(file, obj, fld, "must be an object")
    kinds: list[KindSpec] = []
    for i, k in enumerate(raw.get("kinds") or []):
        if not isinstance(k, dict):
            raise PolicyError(file, obj, f"{fld}.kinds[{i}]", "must have apiGroups and kinds")
        kinds.append(
            KindSpec(
                _str_list(k.get("apiGroups"), file, obj, f"{fld}.kinds[{i}].apiGroups"),
                _str_list(k.get("kinds"), file, obj, f"{fld}.kinds[{i}].kinds"),
            )
        )
    scope = raw.get("scope", "*") or "*"
    if scope not in ("*", "Cluster", "Namespaced"):
        raise PolicyError(file, obj, f"{fld}.scope", f"must be one of *, Cluster, Namespaced (got {scope!r})")
    name = raw.get("name", "") or ""
    if not isinstance(name, str):
        raise PolicyError(file, obj, f"{fld}.name", "must be a string")
    ops = _str_list(raw.get("operations"), file, obj, f"{fld}.operations")
    for op in ops:
        if op not in ("CREATE", "UPDATE", "DELETE", "CONNECT", "*"):
            raise PolicyError(file, obj, f"{fld}.operations", f"unknown operation {op!r}")
    return Match(
        kinds=tuple(kinds),
        scope=scope,
        namespaces=_str_list(raw.get("namespaces"), file, obj, f"{fld}.namespaces"),
        excluded_namespaces=_str_list(raw.get("excludedNamespaces"), file, obj, f"{fld}.excludedNamespaces"),
        label_selector=parse_label_selector(raw.get("labelSelector"), file, obj, f"{fld}.labelSelector"),
        namespace_selector=parse_label_selector(
            raw.get("namespaceSelector"), file, obj, f"{fld}.namespaceSelector"
        ),
        name=name,
        operations=ops,
    )
