"""Dynamic quota rules (`quartermaster.dev/v1alpha1` `QuotaRule`): CEL over live cluster
signals choosing a ClusterQueue's effective borrowingLimit.

    apiVersion: quartermaster.dev/v1alpha1
    kind: QuotaRule
    metadata: {name: team-a-burst-when-idle}
    spec:
      clusterQueue: team-a
      flavor: a100-flavor              # optional when the queue has one flavor of the resource
      resource: nvidia.com/gpu         # default
      rules:                           # the first whose `when` is true sets the limit
        - when: cluster.gpuUtilization < 0.4
          borrowingLimit: 16           # a quantity; null: no limit
      # no rule true: the ClusterQueue's own borrowingLimit

CEL sees `cluster` (`services.core.quota.dynamic.cluster_signals`: gpuCapacity, gpuInUse,
gpuReserved, gpuRunning, gpuUtilization, byFlavor[f].{capacity, inUse, utilization, ...})
and `clusterQueue` ({name, cohort, nominal, borrowingLimit}: this queue's configured figures
of the rule's resource, in its units). A rule whose expression fails at evaluation (say a
flavor missing from byFlavor) counts as false and is reported with the outcome.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cel

from services.core.quantity import QuantityError, parse_quantity_milli
from services.core.quota import Objects
from services.core.quota.dynamic import GPU, LimitKey, static_borrowing_limit
from services.policy.celenv import CelCompileError, compile_expression, functions_for
from services.policy.errors import PolicyError
from services.policy.loader import Document

API_VERSION = "quartermaster.dev/v1alpha1"
KIND = "QuotaRule"
VARIABLES = frozenset({"cluster", "clusterQueue"})


@dataclass(frozen=True)
class Rule:
    label: str  # "QuotaRule/<name> rules[i]"
    when: str
    program: Any
    functions: frozenset[str]
    borrowing_limit: int | None  # milli; None: unlimited


@dataclass(frozen=True)
class QuotaRule:
    name: str
    file: str
    cluster_queue: str
    flavor: str
    resource: str
    rules: tuple[Rule, ...]

    @property
    def key(self) -> LimitKey:
        return (self.cluster_queue, self.flavor, self.resource)


@dataclass(frozen=True)
class Outcome:
    """The effective borrowingLimit of one (ClusterQueue, flavor, resource) and why."""

    key: LimitKey
    static: int | None
    effective: int | None
    rule: str | None  # the rule that set it; None: no rule was true (the configured limit)
    errors: tuple[str, ...] = ()


def load_quota_rules(docs: Iterable[Document], objects: Objects) -> tuple[QuotaRule, ...]:
    """Every QuotaRule among `docs`, checked against the Kueue objects; raises PolicyError
    naming the file, the object and the field."""
    rules = []
    seen: dict[LimitKey, str] = {}
    for doc in docs:
        if doc.body.get("kind") != KIND or not str(doc.body.get("apiVersion", "")).startswith("quartermaster.dev/"):
            continue
        if doc.body.get("apiVersion") != API_VERSION:
            raise PolicyError(doc.file, doc.label, "apiVersion", f"unsupported version (use {API_VERSION})")
        rule = _load_one(doc, objects)
        if rule.key in seen:
            raise PolicyError(doc.file, doc.label, "spec",
                              f"{'/'.join(rule.key)} already has a QuotaRule ({seen[rule.key]}); merge their rules")
        seen[rule.key] = doc.label
        rules.append(rule)
    return tuple(rules)


def _load_one(doc: Document, objects: Objects) -> QuotaRule:
    spec = doc.body.get("spec")
    if not isinstance(spec, dict):
        raise PolicyError(doc.file, doc.label, "spec", "required: clusterQueue and rules")
    name = str((doc.body.get("metadata") or {}).get("name") or "")
    if not name:
        raise PolicyError(doc.file, doc.label, "metadata.name", "required")
    cq_name = spec.get("clusterQueue")
    cq = objects.cluster_queues.get(cq_name) if isinstance(cq_name, str) else None
    if cq is None:
        known = ", ".join(sorted(objects.cluster_queues)) or "none"
        raise PolicyError(doc.file, doc.label, "spec.clusterQueue", f"no ClusterQueue {cq_name!r} (known: {known})")
    if cq.cohort is None:
        raise PolicyError(doc.file, doc.label, "spec.clusterQueue",
                          f"ClusterQueue {cq_name} has no cohort, so there is nothing to borrow from; "
                          "give it spec.cohort or drop this rule")
    resource = spec.get("resource", GPU)
    flavors = [f.flavor for g in cq.resource_groups for f in g.flavors if any(r.resource == resource for r in f.resources)]
    flavor = spec.get("flavor")
    if flavor is None:
        if len(flavors) != 1:
            raise PolicyError(doc.file, doc.label, "spec.flavor",
                              f"required: ClusterQueue {cq_name} has {len(flavors)} flavors of {resource} "
                              f"({', '.join(flavors) or 'none'})")
        flavor = flavors[0]
    elif flavor not in flavors:
        raise PolicyError(doc.file, doc.label, "spec.flavor",
                          f"ClusterQueue {cq_name} has no quota of {resource} in flavor {flavor!r} "
                          f"(it has: {', '.join(flavors) or 'none'})")
    raw_rules = spec.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise PolicyError(doc.file, doc.label, "spec.rules", "must be a non-empty list of {when, borrowingLimit}")
    rules = tuple(_load_rule(doc, i, raw) for i, raw in enumerate(raw_rules))
    return QuotaRule(name, doc.file, cq_name, flavor, resource, rules)


def _load_rule(doc: Document, index: int, raw: Any) -> Rule:
    where = f"spec.rules[{index}]"
    if not isinstance(raw, dict) or "when" not in raw or "borrowingLimit" not in raw:
        raise PolicyError(doc.file, doc.label, where, "must have `when` (CEL) and `borrowingLimit` (a quantity or null)")
    when = raw["when"]
    if not isinstance(when, str) or not when.strip():
        raise PolicyError(doc.file, doc.label, f"{where}.when", "must be a non-empty CEL expression")
    try:
        program, functions, _ = compile_expression(when)
    except CelCompileError as error:
        raise PolicyError(doc.file, doc.label, f"{where}.when", f"invalid CEL: {error}") from None
    unknown = sorted(set(program.variables()) - VARIABLES)
    if unknown:
        raise PolicyError(doc.file, doc.label, f"{where}.when",
                          f"unknown variable(s) {', '.join(unknown)}: a QuotaRule sees `cluster` and `clusterQueue`")
    limit = raw["borrowingLimit"]
    if limit is None:
        milli = None
    else:
        try:
            milli = parse_quantity_milli(limit)
        except QuantityError as error:
            raise PolicyError(doc.file, doc.label, f"{where}.borrowingLimit", str(error)) from None
        if milli < 0:
            raise PolicyError(doc.file, doc.label, f"{where}.borrowingLimit", "must not be negative")
    label = f"{doc.label} rules[{index}]"
    return Rule(label, when, program, functions, milli)


def _queue_view(objects: Objects, rule: QuotaRule) -> dict[str, Any]:
    _, static = static_borrowing_limit(objects, rule.key)
    nominal = 0
    cq = objects.cluster_queues[rule.cluster_queue]
    for group in cq.resource_groups:
        for flavor in group.flavors:
            if flavor.flavor == rule.flavor:
                nominal = sum(q.nominal for q in flavor.resources if q.resource == rule.resource)
    return {"name": cq.name, "cohort": cq.cohort, "nominal": nominal / 1000,
            "borrowingLimit": None if static is None else static / 1000}


def evaluate(rules: Sequence[QuotaRule], signals: Mapping[str, Any], objects: Objects) -> dict[LimitKey, Outcome]:
    """The effective borrowingLimit of every ruled (ClusterQueue, flavor, resource) under `signals`.
    Deterministic: the same rules, signals and config give the same outcomes."""
    outcomes = {}
    for quota_rule in rules:
        found, static = static_borrowing_limit(objects, quota_rule.key)
        if not found:
            continue  # the queue changed under a newer config; the rule waits for its own update
        variables = {"cluster": dict(signals), "clusterQueue": _queue_view(objects, quota_rule)}
        chosen, effective, errors = None, static, []
        for rule in quota_rule.rules:
            try:
                matched = rule.program.execute(cel.Context(variables=variables, functions=functions_for(rule.functions)))
            except Exception as error:  # noqa: BLE001 - a rule that cannot be evaluated is false, and said so
                errors.append(f"{rule.label}: {type(error).__name__}: {error}")
                continue
            if matched is True:
                chosen, effective = f"{rule.label}: {rule.when}", rule.borrowing_limit
                break
        outcomes[quota_rule.key] = Outcome(quota_rule.key, static, effective, chosen, tuple(errors))
    return outcomes
