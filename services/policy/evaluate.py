"""`evaluate(policy_set, object, ...) -> AdmissionDecision`: the one evaluator both paths use.

Pure apart from CEL: no I/O, no clock, no logging. A "no" is a decision with reasons.

CEL variables bound for every policy:

=================== ==============================================================
`object`            the workload (batch/v1 Job, Kueue Workload, Pod, ...); null on DELETE
`oldObject`         the previous version on UPDATE/DELETE, else null
`request`           admission attributes: operation, namespace, name, kind, userInfo, dryRun
`namespaceObject`   the workload's Namespace (labels!), or null when unknown
`params`            Gatekeeper: the constraint object; Quartermaster: `spec.params`
`variables`         `anyObject`, `params` (the constraint's parameters) and the template's own
`workload`          precomputed: gpus, gpuMilli, resources, podSets, queueName,
                    priorityClass, costCenter, nodeLabels
`usage`             live `qm.usage` record of the namespace + gpus, reservedGpus, runningGpus,
                    flavors[f].gpus
`budget`            `qm.budgets` record of the cost center + known (false when absent)
`cluster`           cluster signals, e.g. gpuUtilization (0..1)
=================== ==============================================================
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cel

from services.policy.celenv import ANY_OBJECT, PARAMS_BY_POLICY, PARAMS_OBJECT_BY_POLICY, functions_for
from services.policy.loader import PolicySet
from services.policy.match import MatchError, matches
from services.policy.model import EnforcementAction, EnforcementPoint, Policy
from services.policy.paths import PRESENT, WHOLE, cut, shapes
from services.policy.views import budget_view, cluster_view, usage_view, workload_view


@dataclass(frozen=True)
class Violation:
    policy: str
    enforcement_action: EnforcementAction
    message: str
    kind: str = ""

    def __iter__(self):  # unpacks as (policy, enforcementAction, message)
        return iter((self.policy, self.enforcement_action, self.message))

    def render(self) -> str:
        return f"[{self.policy}] {self.message}"


@dataclass(frozen=True)
class AdmissionDecision:
    allowed: bool
    violations: tuple[Violation, ...] = ()
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()  # evaluation errors of fail-open (Ignore) policies

    @property
    def denials(self) -> tuple[Violation, ...]:
        return tuple(v for v in self.violations if v.enforcement_action == EnforcementAction.DENY)

    @property
    def dryruns(self) -> tuple[Violation, ...]:
        return tuple(v for v in self.violations if v.enforcement_action == EnforcementAction.DRYRUN)

    @property
    def message(self) -> str:
        """Gatekeeper's wording: one `[constraint] message` line per denying violation."""
        return "\n".join(v.render() for v in self.denials)


ALLOWED = AdmissionDecision(True)


class _EvalError(Exception):
    pass


def _run(expr, ctx: _RequestContext) -> Any:
    context = ctx.ready_for(expr)  # outside the try: a value CEL cannot take is the caller's error
    try:
        return expr.program.execute(context)
    except Exception as e:  # cel raises ValueError/TypeError/RuntimeError/KeyError
        raise _EvalError(f"{expr.field}: {type(e).__name__}: {e}") from None


def _message(policy: Policy, v, ctx: _RequestContext) -> str:
    if v.message_expression is not None:
        try:
            out = v.message_expression.program.execute(ctx.ready_for(v.message_expression))
            if isinstance(out, str) and out.strip():
                return out
        except Exception:  # noqa: BLE001 - VAP falls back to `message` on error
            pass
    if v.message:
        return v.message
    return f"failed expression: {v.expression.source.strip()}"


def _evaluate_policy(policy: Policy, ctx: _RequestContext) -> list[str]:
    """Messages of the failed validations (empty: passed). Raises _EvalError."""
    # Params and template variables were resolved at load time (see loader._specialize), so
    # the request's context is never modified here: no per-policy re-conversion.
    for cond in policy.match_conditions:
        result = _run(cond.expression, ctx)
        if result is not True:
            if result is False:
                return []
            raise _EvalError(f"{cond.expression.field}: must evaluate to bool, got {type(result).__name__}")
    if policy.variables:
        values: dict[str, Any] = {}
        for var in policy.variables:
            values[var.name] = _run(var.expression, ctx)
            ctx.context.add_variable("variables", values)
    failed: list[str] = []
    for v in policy.validations:
        result = _run(v.expression, ctx)
        if result is True:
            continue
        if result is not False:
            raise _EvalError(f"{v.expression.field}: must evaluate to bool, got {type(result).__name__}")
        failed.append(_message(policy, v, ctx))
    return failed


def evaluate(
    policy_set: PolicySet,
    object: dict[str, Any] | None,  # noqa: A002 - the CEL name
    namespace_object: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
    budget: dict[str, Any] | None = None,
    cluster: dict[str, Any] | Callable[[], dict[str, Any] | None] | None = None,
    operation: str = "CREATE",
    *,
    old_object: dict[str, Any] | None = None,
    user_info: dict[str, Any] | None = None,
    dry_run: bool = False,
    enforcement_point: str = EnforcementPoint.ALL,
    only: frozenset[int] | None = None,
) -> AdmissionDecision:
    """Evaluate every matching policy; return allowed/violations/warnings. Never raises for a 'no'.

    `only`: the indexes of the policies to evaluate (`placement_sensitive`), the others skipped.

    `cluster` may be a callable, called only if a matching policy reads `cluster` (the signals
    are computed over every namespace's usage: ~5% of admission's CPU in kueue-large-scale,
    where no policy read them)."""
    any_object = object if object is not None else (old_object or {})
    meta = any_object.get("metadata") or {}
    if namespace_object is not None and any_object.get("kind") == "Namespace":
        namespace = meta.get("name", "")
    else:
        namespace = meta.get("namespace") or ((namespace_object or {}).get("metadata") or {}).get("name", "")
    # First which policies apply (or cannot be matched), then one context with what those read.
    applying: list[tuple[int, Policy, str, MatchError | None]] = []
    for index, policy in enumerate(policy_set.policies):
        if only is not None and index not in only:
            continue
        action = policy.action_for(namespace, enforcement_point)
        if action is None:
            continue
        try:
            if matches(policy.match, any_object, namespace_object, operation):
                applying.append((index, policy, action, None))
        except MatchError as e:
            applying.append((index, policy, action, e))
    ctx: _RequestContext | None = None
    violations: list[Violation] = []
    errors: list[str] = []
    for index, policy, action, match_error in applying:
        if match_error is not None:
            if policy.fail_closed:
                violations.append(Violation(policy.name, action, f"cannot match: {match_error}", policy.kind))
            else:
                errors.append(f"[{policy.name}] cannot match: {match_error}")
            continue
        if ctx is None:
            ctx = _context(
                policy_set, object, any_object, old_object, namespace_object, usage, budget, cluster,
                operation, namespace, user_info, dry_run,
            )  # fmt: skip
        key = ctx.verdict_key(index)
        if key is not None and ctx.passed(key):
            continue  # this policy passed a request that read the same (ADR 0051)
        try:
            messages = _evaluate_policy(policy, ctx)
        except _EvalError as e:
            if policy.fail_closed:
                violations.append(
                    Violation(policy.name, action, f"policy evaluation failed: {e}", policy.kind)
                )
            else:
                errors.append(f"[{policy.name}] {e}")
            continue
        if not messages and key is not None:
            ctx.remember_pass(key)
        violations.extend(Violation(policy.name, action, m, policy.kind) for m in messages)
    if not violations and not errors:
        return ALLOWED
    return AdmissionDecision(
        allowed=not any(v.enforcement_action == EnforcementAction.DENY for v in violations),
        violations=tuple(violations),
        warnings=tuple(v.render() for v in violations if v.enforcement_action == EnforcementAction.WARN),
        errors=tuple(errors),
    )


def _context(
    policy_set: PolicySet,
    object: dict[str, Any] | None,  # noqa: A002
    any_object: dict[str, Any],
    old_object: dict[str, Any] | None,
    namespace_object: dict[str, Any] | None,
    usage: dict[str, Any] | None,
    budget: dict[str, Any] | None,
    cluster: dict[str, Any] | Callable[[], dict[str, Any] | None] | None,
    operation: str,
    namespace: str,
    user_info: dict[str, Any] | None,
    dry_run: bool,
) -> _RequestContext:
    def request() -> dict[str, Any]:
        api_version = str(any_object.get("apiVersion", ""))
        group, _, version = api_version.rpartition("/")
        return {
            "operation": operation,
            "namespace": namespace,
            "name": (any_object.get("metadata") or {}).get("name", ""),
            "kind": {"group": group, "version": version, "kind": any_object.get("kind", "")},
            "userInfo": user_info or {},
            "dryRun": dry_run,
        }

    builders: dict[str, Callable[[], Any]] = {
        "object": lambda: object,
        "oldObject": lambda: old_object,
        ANY_OBJECT: lambda: any_object,
        "request": request,
        "namespaceObject": lambda: namespace_object,
        "workload": lambda: workload_view(any_object, namespace_object),
        "usage": lambda: usage_view(usage, namespace),
        "budget": lambda: budget_view(budget),
        "cluster": lambda: cluster_view(cluster() if callable(cluster) else cluster),
        PARAMS_BY_POLICY: lambda: policy_set.bindings.get(PARAMS_BY_POLICY, {}),
        PARAMS_OBJECT_BY_POLICY: lambda: policy_set.bindings.get(PARAMS_OBJECT_BY_POLICY, {}),
    }
    return _RequestContext(policy_set, builders)


_per_thread = threading.local()  # cel.Context is not thread-safe

#: Variables made from the request itself: they differ from one request to the next, so they are
#: bound without asking whether they changed (a pickle of the Job object alone was ~5 us).
_NEW_EACH_REQUEST = frozenset({"object", "oldObject", ANY_OBJECT, "request", "workload"})


class _RequestContext:
    """One request's view of the thread's CEL context for its policy set (ADR 0047, 0048, 0051).

    A variable is built and bound when the first expression that reads it is about to run, so
    what only a refusal's message reads (`request` in every policy of policies/library) or
    what a policy reads after a match condition that did not hold is never converted for a
    request that passes. Converting a value into CEL costs ~1.5 us per string in it.

    Across requests the CEL context is kept: a variable whose value is the same as the one
    bound (the set's params maps, a cost center's budget) is not converted again. Every
    variable an expression reads is made ready for this request before it runs, so nothing of
    an earlier request is read by a later one.

    A policy's verdict is a function of what its deciding expressions read (CEL has no clock
    and no I/O; the set's params are constant): `verdict_key` names that, and the held `passes`
    are the keys the set's policies passed with, so a request that reads the same is not evaluated
    again (ADR 0051)."""

    __slots__ = ("context", "_builders", "_held", "_ready", "_values", "_texts")

    def __init__(self, policy_set: PolicySet, builders: dict[str, Callable[[], Any]]) -> None:
        held = getattr(_per_thread, "held", None)
        if held is None or held.policy_set is not policy_set:
            held = _Held(policy_set)
            _per_thread.held = held
        self._held = held
        self.context = held.context  # read by every expression that runs: kept at hand
        self._builders = builders
        self._ready: set[str] = set()
        self._values: dict[str, Any] = {}  # name -> the request's value, built once
        self._texts: dict[str, bytes | None] = {}  # name -> the fingerprint of what decisions read

    def ready_for(self, expression: Any) -> cel.Context:
        missing = [name for name in expression.references if name not in self._ready and name in self._builders]
        if missing:
            self._bind(missing)
        return self.context

    def _value(self, name: str) -> Any:
        if name not in self._values:
            self._values[name] = self._builders[name]()
        return self._values[name]

    def verdict_key(self, index: int) -> tuple | None:
        """(policy, what its deciding expressions read of each request variable), or None when
        some of it has no fingerprint (it is then evaluated every time)."""
        key: list[Any] = [index]
        for name in self._held.decided_by[index]:
            if name not in self._texts:
                self._texts[name] = _fingerprint(cut(self._value(name), self._held.decision_shapes.get(name, WHOLE)))
            if self._texts[name] is None:
                return None
            key.append(self._texts[name])
        return tuple(key)

    def passed(self, key: tuple) -> bool:
        return key in self._held.passes

    def remember_pass(self, key: tuple) -> None:
        passes = self._held.passes
        if len(passes) >= MAX_REMEMBERED_PASSES:
            passes.clear()  # simple and rare: the next requests fill it again
        passes.add(key)

    def _bind(self, names: list[str]) -> None:
        changed: dict[str, Any] = {}
        texts: dict[str, bytes | None] = {}
        for name in names:
            value = self._value(name)
            shape = self._held.shapes.get(name, WHOLE)
            if shape is not WHOLE:
                value = cut(value, shape)
            text = None if name in _NEW_EACH_REQUEST else _fingerprint(value)
            if text is None or self._held.bound.get(name) != text:
                changed[name], texts[name] = value, text
        if changed:
            try:
                self.context.update(changed)
            except Exception:
                self._held.bound.clear()  # some of them may be bound: the next request rebinds all
                raise
            self._held.bound.update(texts)
        self._ready.update(names)


#: Passing verdicts remembered per policy set and thread (ADR 0051): each key is a few hundred
#: bytes, so this is tens of MiB at most.
MAX_REMEMBERED_PASSES = 50_000


class _Held:
    """What a thread keeps for its policy set between requests."""

    __slots__ = ("policy_set", "context", "bound", "passes", "shapes", "decision_shapes", "decided_by")

    def __init__(self, policy_set: PolicySet) -> None:
        self.policy_set = policy_set
        self.context = cel.Context(functions=functions_for(policy_set.functions))
        self.bound: dict[str, bytes | None] = {}  # name -> fingerprint of the value bound
        self.passes: set[tuple] = set()
        self.shapes = _shapes_read(policy_set)
        self.decision_shapes = _shapes_read(policy_set, messages=False)
        # policy index -> the request variables its match conditions, variables and
        # validations read (its messages do not decide), of those made from the request
        # (`_CUT`): the set's params maps are constant for the set
        self.decided_by = [tuple(sorted(set().union(*(e.references for e in _deciding(policy))) & _CUT))
                           for policy in policy_set.policies]


#: Variables bound with only the fields the set's expressions select from them (ADR 0048). The
#: params maps are not: they are the same for every request and bound once.
_CUT = frozenset({"object", "oldObject", ANY_OBJECT, "request", "namespaceObject", "workload", "usage", "budget",
                  "cluster"})


def _deciding(policy: Policy) -> list[Any]:
    """The expressions whose results decide a policy's verdict (its messages only word it)."""
    return ([c.expression for c in policy.match_conditions] + [v.expression for v in policy.variables]
            + [v.expression for v in policy.validations])


def _shapes_read(policy_set: PolicySet, *, messages: bool = True) -> dict[str, Any]:
    """What the set's expressions (or only its deciding ones) read of each request variable
    (services.policy.paths)."""
    expressions = []
    for policy in policy_set.policies:
        expressions += _deciding(policy)
        if messages:
            expressions += [v.message_expression for v in policy.validations if v.message_expression is not None]
    return shapes((e.program.source, e.references & _CUT) for e in expressions)


def _fingerprint(value: Any) -> bytes | None:
    """The value's pickle: equal texts convert to equal CEL values. Unlike Python's ==, it
    tells 1, 1.0 and True apart, as CEL does (JSON would not: it writes NaN as null). None for a
    value that has no pickle: always rebound."""
    try:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return None


#: Per policy set (kept alive with its answer, so that an id is not reused meanwhile): the
#: indexes of its policies whose verdict a placement can change.
_PLACEMENT_SENSITIVE: dict[int, tuple[PolicySet, frozenset[int]]] = {}


def placement_sensitive(policy_set: PolicySet) -> frozenset[int]:
    """The indexes of the set's policies that can read where a workload is placed (ADR 0070):
    its pod templates' nodeSelector, its annotations or status (`object`), or
    `workload.nodeLabels`. The others judge a placed workload as they judged it unplaced, so
    admission judges each flavor with these alone (none: no flavor is judged)."""
    known = _PLACEMENT_SENSITIVE.get(id(policy_set))
    if known is not None and known[0] is policy_set:
        return known[1]
    if len(_PLACEMENT_SENSITIVE) > 64:  # sets replaced by `qm config publish` or a reload
        _PLACEMENT_SENSITIVE.clear()
    sensitive = frozenset(
        index for index, policy in enumerate(policy_set.policies)
        if _reads_placement(shapes((e.program.source, e.references & _CUT) for e in _deciding(policy))))
    _PLACEMENT_SENSITIVE[id(policy_set)] = (policy_set, sensitive)
    return sensitive


def _reads_placement(read: dict[str, Any]) -> bool:
    def has(shape: Any, *fields: str) -> bool:
        """Whether `shape` reads any of `fields` (a whole value reads them all)."""
        return shape is WHOLE or (shape != PRESENT and any(f in shape for f in fields))

    for name in ("object", ANY_OBJECT):
        shape = read.get(name, PRESENT)  # not read at all: as good as its presence alone
        if has(shape, "status") or (isinstance(shape, dict) and (
                has(shape.get("metadata", PRESENT), "annotations")
                or has(shape.get("spec", PRESENT), "template", "podSets", "tasks"))):
            return True
    return has(read.get("workload", PRESENT), "nodeLabels")
