"""Compiled, immutable policies. Built once by the loader; evaluated many times."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import cel

from services.policy.match import Match, wildcard_matches


class EnforcementAction(StrEnum):
    DENY = "deny"
    WARN = "warn"
    DRYRUN = "dryrun"


SCOPED = "scoped"

_SEVERITY = {EnforcementAction.DENY: 3, EnforcementAction.WARN: 2, EnforcementAction.DRYRUN: 1}


class EnforcementPoint(StrEnum):
    """Where a policy is enforced; Gatekeeper's names plus Quartermaster's bus."""

    WEBHOOK = "validation.gatekeeper.sh"
    AUDIT = "audit.gatekeeper.sh"
    GATOR = "gator.gatekeeper.sh"
    BUS = "bus.quartermaster.dev"
    ALL = "*"


@dataclass(frozen=True)
class ScopedAction:
    """One `scopedEnforcementActions` entry. `namespaces`/`excludedNamespaces` are our extension."""

    action: EnforcementAction
    enforcement_points: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    excluded_namespaces: tuple[str, ...] = ()

    def applies(self, namespace: str, point: str) -> bool:
        if self.enforcement_points and "*" not in self.enforcement_points and point != "*":
            if point not in self.enforcement_points:
                return False
        if self.namespaces and not any(wildcard_matches(p, namespace) for p in self.namespaces):
            return False
        if self.excluded_namespaces and any(wildcard_matches(p, namespace) for p in self.excluded_namespaces):
            return False
        return True


@dataclass(frozen=True)
class Expression:
    source: str
    program: cel.Program
    field: str  # where it came from, e.g. spec.validations[0].expression
    references: frozenset[str] = frozenset()  # root CEL variables it reads

    def __repr__(self) -> str:  # Program has no useful repr
        return f"Expression({self.source!r})"


@dataclass(frozen=True)
class Validation:
    expression: Expression
    message: str | None = None
    message_expression: Expression | None = None


@dataclass(frozen=True)
class Variable:
    name: str
    expression: Expression


@dataclass(frozen=True)
class Policy:
    """A constraint bound to its template, or a Quartermaster AdmissionPolicy: one evaluable rule."""

    name: str
    kind: str
    template: str
    file: str
    match: Match
    enforcement_action: EnforcementAction | str  # EnforcementAction or SCOPED
    scoped_actions: tuple[ScopedAction, ...]
    parameters: Any  # `variables.params`
    params_binding: Any  # `params`: the constraint object (Gatekeeper) or spec.params (Quartermaster)
    match_conditions: tuple[Variable, ...]
    variables: tuple[Variable, ...]
    validations: tuple[Validation, ...]
    fail_closed: bool
    functions: frozenset[str]
    references: frozenset[str] = frozenset()
    key: str = ""  # identifier of this policy's entry in the request-wide params maps

    @property
    def display_name(self) -> str:
        return self.name

    def action_for(self, namespace: str, point: str = EnforcementPoint.ALL) -> EnforcementAction | None:
        """The action for an object in `namespace` at `point`; None when not enforced there."""
        if self.enforcement_action != SCOPED:
            return EnforcementAction(self.enforcement_action)
        best: EnforcementAction | None = None
        for sa in self.scoped_actions:
            if sa.applies(namespace, point) and (best is None or _SEVERITY[sa.action] > _SEVERITY[best]):
                best = sa.action
        return best


@dataclass(frozen=True)
class Template:
    name: str
    kind: str
    file: str
    schema: dict[str, Any] | None
    match_conditions: tuple[Variable, ...]
    variables: tuple[Variable, ...]
    validations: tuple[Validation, ...]
    fail_closed: bool
    functions: frozenset[str]
    references: frozenset[str] = frozenset()
