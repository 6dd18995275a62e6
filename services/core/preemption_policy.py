"""Quartermaster's PreemptionPolicy (``quartermaster.dev/v1alpha1``): who may give way, on top
of Kueue's preemption rules. Pure: standard library only, time is an argument.

Kueue decides who *could* be preempted (withinClusterQueue, reclaimWithinCohort, ...); this
module decides who *may* be, as the people who run GPU clusters ask:

* workloads fall into classes by label selector (first matching class wins, else
  ``defaultClass``); a class is ``preemptible`` or not, and lists the classes it ``mayPreempt``
  with a priority condition (``Lower``, ``LowerOrEqual``, ``Any``);
* a victim gets its class's ``gracePeriod`` to checkpoint before its pods are stopped;
* a workload that started less than ``minRuntimeBeforePreemption`` ago is not a candidate;
* a workload preempted ``maxPreemptionsPerWorkload`` times within ``window`` is not a
  candidate; a namespace loses at most ``preemptionBudgetPerHour`` workloads per hour.

Defaults (the field report): training is not preemptible; inference of higher priority may
preempt lower-priority batch (and lower-priority inference); batch may preempt lower-priority
batch, as plain Kueue would. Unlabelled workloads are batch.

:func:`filter_victims` gives, for every candidate, either the rule that allows preempting it
or a typed reason with a human message; the caller passes the allowed ones to the quota core
as a predicate, so the minimal victim set is searched among allowed candidates only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

API_VERSION = "quartermaster.dev/v1alpha1"
KIND = "PreemptionPolicy"
CLASS_LABEL = "quartermaster.dev/class"
HOUR_S = 3600.0


class PolicyError(ValueError):
    """An invalid PreemptionPolicy; names the file, the object and the field."""

    def __init__(self, source: str, obj: str, field_path: str, problem: str) -> None:
        super().__init__(f"{source}: {KIND} {obj}: {field_path}: {problem}")
        self.source, self.obj, self.field, self.problem = source, obj, field_path, problem


class PriorityCondition(StrEnum):
    LOWER = "Lower"
    LOWER_OR_EQUAL = "LowerOrEqual"
    ANY = "Any"

    def allows(self, preemptor_priority: int, victim_priority: int) -> bool:
        if self is PriorityCondition.LOWER:
            return victim_priority < preemptor_priority
        if self is PriorityCondition.LOWER_OR_EQUAL:
            return victim_priority <= preemptor_priority
        return True

    def describe(self) -> str:
        return {"Lower": "lower priority", "LowerOrEqual": "lower or equal priority", "Any": "any priority"}[self.value]


class BlockReason(StrEnum):
    """Why the policy protects a candidate Kueue would preempt."""

    NOT_PREEMPTIBLE = "NotPreemptible"
    NOT_ALLOWED_BY_PREEMPTOR = "NotInMayPreempt"
    MIN_RUNTIME = "MinRuntimeNotReached"
    MAX_PREEMPTIONS = "MaxPreemptionsReached"
    NAMESPACE_BUDGET = "NamespaceBudgetExhausted"


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (key, operator, values)

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        for key, operator, values in self.match_expressions:
            present = key in labels
            if operator == "In" and not (present and labels[key] in values):
                return False
            if operator == "NotIn" and present and labels[key] in values:
                return False
            if operator == "Exists" and not present:
                return False
            if operator == "DoesNotExist" and present:
                return False
        return True


@dataclass(frozen=True, slots=True)
class MayPreempt:
    workload_class: str
    priority: PriorityCondition = PriorityCondition.LOWER


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    name: str
    selector: LabelSelector
    preemptible: bool = True
    may_preempt: tuple[MayPreempt, ...] = ()
    grace_period_s: int = 0
    min_runtime_s: float = 0.0
    max_preemptions: int | None = None  # None: no cap
    window_s: float = HOUR_S


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    name: str
    classes: tuple[WorkloadClass, ...]
    default_class: str
    namespace_budget_per_hour: int | None = None  # None: no budget
    namespace_budgets: Mapping[str, int] = field(default_factory=dict)  # per-namespace overrides

    def class_of(self, labels: Mapping[str, str] | None) -> WorkloadClass:
        labels = labels or {}
        for cls in self.classes:
            if cls.selector.matches(labels):
                return cls
        return self.by_name(self.default_class)

    def by_name(self, name: str) -> WorkloadClass:
        for cls in self.classes:
            if cls.name == name:
                return cls
        raise KeyError(name)

    def budget_of(self, namespace: str) -> int | None:
        return self.namespace_budgets.get(namespace, self.namespace_budget_per_hour)

    @property
    def history_horizon_s(self) -> float:
        """How far back history matters: the longest window, and the hour of the budgets."""
        return max([HOUR_S, *(c.window_s for c in self.classes)])


def _class_selector(name: str) -> LabelSelector:
    return LabelSelector(match_labels=((CLASS_LABEL, name),))


DEFAULT_POLICY = PreemptionPolicy(
    name="default",
    classes=(
        WorkloadClass(
            "training",
            _class_selector("training"),
            preemptible=False,
            may_preempt=(MayPreempt("batch"),),
            grace_period_s=600,
            min_runtime_s=1800,
        ),
        WorkloadClass(
            "inference",
            _class_selector("inference"),
            preemptible=True,
            may_preempt=(MayPreempt("batch"), MayPreempt("inference")),
            grace_period_s=30,
            min_runtime_s=300,
            max_preemptions=3,
            window_s=HOUR_S,
        ),
        WorkloadClass(
            "batch",
            _class_selector("batch"),
            preemptible=True,
            may_preempt=(MayPreempt("batch"),),
            grace_period_s=120,
            min_runtime_s=300,
            max_preemptions=3,
            window_s=HOUR_S,
        ),
    ),
    default_class="batch",
    namespace_budget_per_hour=20,
)


# --------------------------------------------------------------------------- the filter


@dataclass(frozen=True, slots=True)
class Candidate:
    """A workload holding quota that Kueue might preempt (or the preemptor itself)."""

    uid: str
    namespace: str
    name: str
    priority: int
    labels: Mapping[str, str] = field(default_factory=dict)
    started_at: float | None = None  # running since (else reserved since); None: unknown
    cluster_queue: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class History:
    """What happened before, as the preemption service remembers it (epoch seconds)."""

    preemptions: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # uid -> when preempted
    namespace_preemptions: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # ns -> when


@dataclass(frozen=True, slots=True)
class Allowed:
    candidate: Candidate
    rule: str  # the PreemptionPolicy rule that allows it, for the victim's reason
    grace_period_s: int


@dataclass(frozen=True, slots=True)
class Blocked:
    candidate: Candidate
    reason: BlockReason
    message: str  # "would need to preempt training job ml-team/llm-ft, which is not preemptible"


@dataclass(frozen=True, slots=True)
class FilterResult:
    allowed: Mapping[str, Allowed]  # uid -> why it may be preempted
    blocked: Mapping[str, Blocked]  # uid -> why not

    def may_preempt(self, uid: str) -> bool:
        return uid in self.allowed


def _recent(times: Iterable[float], now: float, window_s: float) -> int:
    return sum(1 for t in times if now - window_s < t <= now)


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds // 60}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60}s"
    return f"{seconds}s"


def filter_victims(
    candidates: Iterable[Candidate],
    preemptor: Candidate,
    history: History,
    now: float,
    *,
    policy: PreemptionPolicy = DEFAULT_POLICY,
) -> tuple[list[Allowed], list[Blocked]]:
    """Split Kueue's candidates into those the policy allows (with the rule and grace period)
    and those it protects (with the reason). Order of the input is kept.

    The namespace budget is checked per candidate (a namespace with nothing left protects all
    its workloads); :func:`over_budget` checks a chosen set against what is left."""
    allowed: list[Allowed] = []
    blocked: list[Blocked] = []
    pclass = policy.class_of(preemptor.labels)
    for cand in candidates:
        vclass = policy.class_of(cand.labels)
        what = f"{vclass.name} job {cand.key}"
        if not vclass.preemptible:
            blocked.append(Blocked(cand, BlockReason.NOT_PREEMPTIBLE,
                                   f"would need to preempt {what}, which is not preemptible "
                                   f"(PreemptionPolicy {policy.name}, class {vclass.name})"))
            continue
        rule = next(
            (r for r in pclass.may_preempt
             if r.workload_class == vclass.name and r.priority.allows(preemptor.priority, cand.priority)),
            None,
        )
        if rule is None:
            said = ", ".join(f"{r.workload_class} of {r.priority.describe()}" for r in pclass.may_preempt) or "nothing"
            blocked.append(Blocked(cand, BlockReason.NOT_ALLOWED_BY_PREEMPTOR,
                                   f"would need to preempt {what} (priority {cand.priority}), which "
                                   f"{pclass.name} workloads of priority {preemptor.priority} may not preempt "
                                   f"(PreemptionPolicy {policy.name}: {pclass.name} mayPreempt {said})"))
            continue
        if vclass.min_runtime_s > 0:
            ran = now - cand.started_at if cand.started_at is not None else 0.0
            if ran < vclass.min_runtime_s:
                blocked.append(Blocked(cand, BlockReason.MIN_RUNTIME,
                                       f"would need to preempt {what}, which has run {format_duration(max(ran, 0))} "
                                       f"of its minRuntimeBeforePreemption {format_duration(vclass.min_runtime_s)} "
                                       f"(PreemptionPolicy {policy.name}, class {vclass.name})"))
                continue
        if vclass.max_preemptions is not None:
            times = _recent(history.preemptions.get(cand.uid, ()), now, vclass.window_s)
            if times >= vclass.max_preemptions:
                blocked.append(Blocked(cand, BlockReason.MAX_PREEMPTIONS,
                                       f"would need to preempt {what}, which was already preempted {times} times "
                                       f"in the last {format_duration(vclass.window_s)} (maxPreemptionsPerWorkload "
                                       f"{vclass.max_preemptions}, PreemptionPolicy {policy.name})"))
                continue
        budget = policy.budget_of(cand.namespace)
        if budget is not None:
            used = _recent(history.namespace_preemptions.get(cand.namespace, ()), now, HOUR_S)
            if used >= budget:
                blocked.append(Blocked(cand, BlockReason.NAMESPACE_BUDGET,
                                       f"would need to preempt {what}, but namespace {cand.namespace} has used its "
                                       f"preemption budget ({used} of {budget} per hour, PreemptionPolicy "
                                       f"{policy.name})"))
                continue
        allowed.append(Allowed(
            cand,
            f"{policy.name}: {pclass.name} mayPreempt {vclass.name} of {rule.priority.describe()}",
            vclass.grace_period_s,
        ))
    return allowed, blocked


def over_budget(
    victims: Iterable[Candidate], history: History, now: float, *, policy: PreemptionPolicy = DEFAULT_POLICY
) -> str | None:
    """A message when a chosen victim set would take more from a namespace than its hourly
    preemption budget has left; None when it fits."""
    per_namespace: dict[str, int] = {}
    for v in victims:
        per_namespace[v.namespace] = per_namespace.get(v.namespace, 0) + 1
    for namespace, count in sorted(per_namespace.items()):
        budget = policy.budget_of(namespace)
        if budget is None:
            continue
        used = _recent(history.namespace_preemptions.get(namespace, ()), now, HOUR_S)
        if used + count > budget:
            return (f"would need to preempt {count} workloads in namespace {namespace}, which has "
                    f"{max(budget - used, 0)} of its preemption budget ({budget} per hour) left "
                    f"(PreemptionPolicy {policy.name})")
    return None


# --------------------------------------------------------------------------- parsing

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s|ms)")


def parse_duration(value: object, where: tuple[str, str, str]) -> float:
    """Seconds from a number or a Go-style duration ("90s", "5m", "1h30m")."""
    if isinstance(value, bool):
        raise PolicyError(*where, f"expected a duration like 30s, 5m or 1h, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise PolicyError(*where, f"must not be negative, got {value}")
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return float(text)
        pos, total = 0, 0.0
        for m in _DURATION.finditer(text):
            if m.start() != pos:
                break
            total += float(m.group(1)) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[m.group(2)]
            pos = m.end()
        if text and pos == len(text):
            return total
    raise PolicyError(*where, f"expected a duration like 30s, 5m or 1h, got {value!r}")


def _selector(raw: object, where: tuple[str, str, str]) -> LabelSelector:
    if not isinstance(raw, Mapping):
        raise PolicyError(*where, "expected a label selector with matchLabels and/or matchExpressions")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise PolicyError(where[0], where[1], f"{where[2]}.matchLabels", "expected a map of label to value")
    expressions = []
    for i, expr in enumerate(raw.get("matchExpressions") or []):
        path = (where[0], where[1], f"{where[2]}.matchExpressions[{i}]")
        if not isinstance(expr, Mapping) or "key" not in expr:
            raise PolicyError(*path, "expected {key, operator, values}")
        operator = expr.get("operator")
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise PolicyError(path[0], path[1], f"{path[2]}.operator",
                              f"must be In, NotIn, Exists or DoesNotExist, got {operator!r}")
        expressions.append((str(expr["key"]), operator, tuple(str(v) for v in expr.get("values") or ())))
    return LabelSelector(tuple(sorted((str(k), str(v)) for k, v in labels.items())), tuple(expressions))


def _non_negative_int(value: object, where: tuple[str, str, str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PolicyError(*where, f"expected a non-negative integer, got {value!r}")
    return value


def parse_policy(document: Mapping, source: str = "<policy>") -> PreemptionPolicy:
    """A PreemptionPolicy object (a dict from YAML) -> PreemptionPolicy. Classes not listed
    keep the default ones (training, inference, batch) unless ``replaceDefaultClasses``."""
    name = str((document.get("metadata") or {}).get("name") or "unnamed")
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        raise PolicyError(source, name, "apiVersion/kind", f"expected {API_VERSION} {KIND}")
    spec = document.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise PolicyError(source, name, "spec", "expected a map")

    classes: dict[str, WorkloadClass] = {}
    if not spec.get("replaceDefaultClasses", False):
        classes = {c.name: c for c in DEFAULT_POLICY.classes}
    raw_classes = spec.get("classes") or []
    if not isinstance(raw_classes, list):
        raise PolicyError(source, name, "spec.classes", "expected a list")
    parsed: list[WorkloadClass] = []
    for i, raw in enumerate(raw_classes):
        at = f"spec.classes[{i}]"
        if not isinstance(raw, Mapping) or not raw.get("name"):
            raise PolicyError(source, name, f"{at}.name", "every class needs a name")
        cname = str(raw["name"])
        base = classes.get(cname) or WorkloadClass(cname, _class_selector(cname))
        selector = _selector(raw["selector"], (source, name, f"{at}.selector")) if "selector" in raw else base.selector
        preemptible = raw.get("preemptible", base.preemptible)
        if not isinstance(preemptible, bool):
            raise PolicyError(source, name, f"{at}.preemptible", f"expected true or false, got {preemptible!r}")
        may = base.may_preempt
        if "mayPreempt" in raw:
            rules = []
            for j, rule in enumerate(raw["mayPreempt"] or []):
                rat = f"{at}.mayPreempt[{j}]"
                if isinstance(rule, str):
                    rule = {"class": rule}
                if not isinstance(rule, Mapping) or not rule.get("class"):
                    raise PolicyError(source, name, rat, "expected {class, priority}")
                try:
                    cond = PriorityCondition(rule.get("priority", "Lower"))
                except ValueError:
                    raise PolicyError(source, name, f"{rat}.priority",
                                      f"must be Lower, LowerOrEqual or Any, got {rule.get('priority')!r}") from None
                rules.append(MayPreempt(str(rule["class"]), cond))
            may = tuple(rules)
        grace = base.grace_period_s
        if "gracePeriod" in raw:
            grace = int(parse_duration(raw["gracePeriod"], (source, name, f"{at}.gracePeriod")))
        min_runtime = base.min_runtime_s
        if "minRuntimeBeforePreemption" in raw:
            min_runtime = parse_duration(raw["minRuntimeBeforePreemption"],
                                         (source, name, f"{at}.minRuntimeBeforePreemption"))
        cap = base.max_preemptions
        if "maxPreemptionsPerWorkload" in raw:
            value = raw["maxPreemptionsPerWorkload"]
            cap = None if value is None else _non_negative_int(value, (source, name, f"{at}.maxPreemptionsPerWorkload"))
        window = base.window_s
        if "window" in raw:
            window = parse_duration(raw["window"], (source, name, f"{at}.window"))
            if window <= 0:
                raise PolicyError(source, name, f"{at}.window", "must be longer than zero")
        cls = WorkloadClass(cname, selector, preemptible, may, grace, min_runtime, cap, window)
        classes.pop(cname, None)
        parsed.append(cls)
    # listed classes first, in the order given (first match wins), then the remaining defaults
    ordered = (*parsed, *classes.values())
    names = {c.name for c in ordered}
    for cls in ordered:
        for rule in cls.may_preempt:
            if rule.workload_class not in names:
                raise PolicyError(source, name, f"spec.classes[{cls.name}].mayPreempt",
                                  f"unknown class {rule.workload_class!r} (known: {', '.join(sorted(names))})")
    default_class = str(spec.get("defaultClass", DEFAULT_POLICY.default_class))
    if default_class not in names:
        raise PolicyError(source, name, "spec.defaultClass",
                          f"unknown class {default_class!r} (known: {', '.join(sorted(names))})")
    budget = DEFAULT_POLICY.namespace_budget_per_hour
    if "preemptionBudgetPerHour" in spec:
        value = spec["preemptionBudgetPerHour"]
        budget = None if value is None else _non_negative_int(value, (source, name, "spec.preemptionBudgetPerHour"))
    overrides: dict[str, int] = {}
    namespaces = spec.get("namespaces") or {}
    if not isinstance(namespaces, Mapping):
        raise PolicyError(source, name, "spec.namespaces", "expected a map of namespace to settings")
    for ns, settings in namespaces.items():
        if isinstance(settings, Mapping) and "preemptionBudgetPerHour" in settings:
            overrides[str(ns)] = _non_negative_int(
                settings["preemptionBudgetPerHour"], (source, name, f"spec.namespaces.{ns}.preemptionBudgetPerHour")
            )
    return PreemptionPolicy(name, tuple(ordered), default_class, budget, overrides)
