"""Read Kueue's objects, unchanged, from plain dicts (as loaded from YAML by the caller).

Accepts ``kueue.x-k8s.io/v1beta1`` and ``v1beta2`` field names (``cohort``/``cohortName``,
``parent``/``parentName``, ``Borrow``/``Preempt``/``MayStopSearch``, ``priorityClassName``/
``priorityClassRef``), the Kueue ``Configuration``, ``batch/v1`` Jobs labelled
``kueue.x-k8s.io/queue-name``, Namespaces and (Workload)PriorityClasses. Kinds the quota core
does not use are ignored. Invalid input raises :class:`ConfigError` naming the file, the
object and the field; accepted-but-odd input becomes a warning string.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from services.core.quantity import QuantityError, parse_quantity_milli
from services.core.quota.errors import ConfigError
from services.core.quota.model import (
    Admission,
    ClusterQueue,
    Cohort,
    Config,
    FairSharingConfig,
    FairSharingStrategy,
    FlavorFungibility,
    FlavorQuotas,
    FungibilityPolicy,
    LabelRequirement,
    LabelSelector,
    LocalQueue,
    Namespace,
    Objects,
    PodSet,
    PodSetAdmission,
    Preemption,
    PreemptionPolicy,
    QueueingStrategy,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Taint,
    Toleration,
    Workload,
)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
JOB_MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"
KUEUE_GROUP = "kueue.x-k8s.io/"

_FUNGIBILITY = {
    "Borrow": FungibilityPolicy.MAY_STOP_SEARCH,
    "Preempt": FungibilityPolicy.MAY_STOP_SEARCH,
    "MayStopSearch": FungibilityPolicy.MAY_STOP_SEARCH,
    "TryNextFlavor": FungibilityPolicy.TRY_NEXT_FLAVOR,
}


class _Ctx:
    """Where we are: file, object, and a helper to raise errors naming them."""

    __slots__ = ("source", "obj")

    def __init__(self, source: str, obj: str) -> None:
        self.source = source
        self.obj = obj

    def fail(self, path: str, problem: str) -> ConfigError:
        return ConfigError(self.source, self.obj, path, problem)

    def mapping(self, value: Any, path: str, *, required: bool = False) -> Mapping[str, Any]:
        if value is None:
            if required:
                raise self.fail(path, "is required")
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(path, f"must be a mapping, got {type(value).__name__}")
        return value

    def seq(self, value: Any, path: str, *, required: bool = False) -> list[Any]:
        if value is None:
            if required:
                raise self.fail(path, "is required")
            return []
        if not isinstance(value, list):
            raise self.fail(path, f"must be a list, got {type(value).__name__}")
        return value

    def string(self, value: Any, path: str, *, required: bool = False) -> str | None:
        if value is None:
            if required:
                raise self.fail(path, "is required")
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(path, f"must be a non-empty string, got {value!r}")
        return value

    def integer(self, value: Any, path: str, *, minimum: int | None = None) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(path, f"must be >= {minimum}, got {value}")
        return value

    def quantity(self, value: Any, path: str, *, required: bool = False) -> int | None:
        if value is None:
            if required:
                raise self.fail(path, "is required")
            return None
        try:
            milli = parse_quantity_milli(value)
        except QuantityError as exc:
            raise self.fail(path, str(exc)) from None
        if milli < 0:
            raise self.fail(path, f"must not be negative, got {value!r}")
        return milli

    def enum(self, value: Any, path: str, allowed: Iterable[str], default: str) -> str:
        if value is None:
            return default
        allowed = tuple(allowed)
        if value not in allowed:
            raise self.fail(path, f"must be one of {', '.join(allowed)}, got {value!r}")
        return value

    def timestamp(self, value: Any, path: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, datetime):  # PyYAML turns unquoted timestamps into datetimes
            moment = value
        elif isinstance(value, str):
            try:
                moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise self.fail(path, f"must be an RFC 3339 time, got {value!r}") from None
        else:
            raise self.fail(path, f"must be an RFC 3339 time, got {value!r}")
        if moment.tzinfo is None:
            # Naive times are UTC in Kubernetes; avoid the local zone (no hidden environment).
            return (moment - datetime(1970, 1, 1)).total_seconds()
        return moment.timestamp()


def _labels(ctx: _Ctx, value: Any, path: str) -> tuple[tuple[str, str], ...]:
    labels = ctx.mapping(value, path)
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _taints(ctx: _Ctx, value: Any, path: str) -> tuple[Taint, ...]:
    out = []
    for i, raw in enumerate(ctx.seq(value, path)):
        tpath = f"{path}[{i}]"
        taint = ctx.mapping(raw, tpath)
        effect = ctx.enum(taint.get("effect"), f"{tpath}.effect", _TAINT_EFFECTS, "")
        if not effect:
            raise ctx.fail(f"{tpath}.effect", f"required: one of {', '.join(_TAINT_EFFECTS)}")
        out.append(Taint(ctx.string(taint.get("key"), f"{tpath}.key", required=True), str(taint.get("value") or ""),
                         effect))
    return tuple(out)


def _tolerations(ctx: _Ctx, pod_spec: Mapping[str, Any], path: str) -> tuple[Toleration, ...]:
    out = []
    for i, raw in enumerate(ctx.seq(pod_spec.get("tolerations"), f"{path}.tolerations")):
        tpath = f"{path}.tolerations[{i}]"
        t = ctx.mapping(raw, tpath)
        out.append(Toleration(str(t.get("key") or ""),
                              ctx.enum(t.get("operator"), f"{tpath}.operator", ("Equal", "Exists"), "Equal"),
                              str(t.get("value") or ""),
                              ctx.enum(t.get("effect"), f"{tpath}.effect", ("", *_TAINT_EFFECTS), "")))
    return tuple(out)


_NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def _node_affinity(ctx: _Ctx, pod_spec: Mapping[str, Any], path: str) -> tuple[tuple[LabelRequirement, ...], ...]:
    """The required node affinity's terms (matchExpressions; matchFields name nodes, not flavors)."""
    affinity = ctx.mapping(pod_spec.get("affinity"), f"{path}.affinity")
    node = ctx.mapping(affinity.get("nodeAffinity"), f"{path}.affinity.nodeAffinity")
    tpath = f"{path}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = ctx.mapping(node.get("requiredDuringSchedulingIgnoredDuringExecution"), tpath)
    terms = []
    for i, term in enumerate(ctx.seq(required.get("nodeSelectorTerms"), f"{tpath}.nodeSelectorTerms")):
        term_path = f"{tpath}.nodeSelectorTerms[{i}]"
        reqs = []
        for j, expr in enumerate(ctx.seq(ctx.mapping(term, term_path).get("matchExpressions"),
                                         f"{term_path}.matchExpressions")):
            epath = f"{term_path}.matchExpressions[{j}]"
            expr = ctx.mapping(expr, epath)
            key = ctx.string(expr.get("key"), f"{epath}.key", required=True)
            op = ctx.enum(expr.get("operator"), f"{epath}.operator", _NODE_OPERATORS, "")
            reqs.append(LabelRequirement(key, op, tuple(str(v) for v in ctx.seq(expr.get("values"), f"{epath}.values"))))
        terms.append(tuple(reqs))
    return tuple(terms)


def _selector(ctx: _Ctx, value: Any, path: str) -> LabelSelector:
    sel = ctx.mapping(value, path)
    reqs = []
    for i, expr in enumerate(ctx.seq(sel.get("matchExpressions"), f"{path}.matchExpressions")):
        epath = f"{path}.matchExpressions[{i}]"
        expr = ctx.mapping(expr, epath)
        key = ctx.string(expr.get("key"), f"{epath}.key", required=True)
        op = ctx.enum(
            expr.get("operator"), f"{epath}.operator", ("In", "NotIn", "Exists", "DoesNotExist"), ""
        )
        values = tuple(str(v) for v in ctx.seq(expr.get("values"), f"{epath}.values"))
        reqs.append(LabelRequirement(key, op, values))
    return LabelSelector(_labels(ctx, sel.get("matchLabels"), f"{path}.matchLabels"), tuple(reqs))


def _resource_groups(
    ctx: _Ctx, value: Any, path: str, warnings: list[str], has_parent: bool
) -> tuple[ResourceGroup, ...]:
    groups = []
    seen_resources: set[str] = set()
    seen_flavors: set[str] = set()
    for g, raw in enumerate(ctx.seq(value, path)):
        gpath = f"{path}[{g}]"
        rg = ctx.mapping(raw, gpath)
        covered = tuple(
            ctx.string(r, f"{gpath}.coveredResources[{i}]", required=True) or ""
            for i, r in enumerate(
                ctx.seq(rg.get("coveredResources"), f"{gpath}.coveredResources", required=True)
            )
        )
        for res in covered:
            if res in seen_resources:
                raise ctx.fail(
                    f"{gpath}.coveredResources", f"resource {res} is covered by more than one resource group"
                )
            seen_resources.add(res)
        flavors = []
        for f, fraw in enumerate(ctx.seq(rg.get("flavors"), f"{gpath}.flavors", required=True)):
            fpath = f"{gpath}.flavors[{f}]"
            fq = ctx.mapping(fraw, fpath)
            fname = ctx.string(fq.get("name"), f"{fpath}.name", required=True) or ""
            if fname in seen_flavors:
                raise ctx.fail(f"{fpath}.name", f"flavor {fname} appears more than once")
            seen_flavors.add(fname)
            quotas = []
            for r, rraw in enumerate(ctx.seq(fq.get("resources"), f"{fpath}.resources", required=True)):
                rpath = f"{fpath}.resources[{r}]"
                rq = ctx.mapping(rraw, rpath)
                rname = ctx.string(rq.get("name"), f"{rpath}.name", required=True) or ""
                if rname not in covered:
                    raise ctx.fail(
                        f"{rpath}.name", f"resource {rname} is not in coveredResources {list(covered)}"
                    )
                nominal = ctx.quantity(rq.get("nominalQuota"), f"{rpath}.nominalQuota", required=True) or 0
                borrowing = ctx.quantity(rq.get("borrowingLimit"), f"{rpath}.borrowingLimit")
                lending = ctx.quantity(rq.get("lendingLimit"), f"{rpath}.lendingLimit")
                if lending is not None and lending > nominal:
                    raise ctx.fail(f"{rpath}.lendingLimit", "must be less than or equal to nominalQuota")
                for fieldname, limit in (("borrowingLimit", borrowing), ("lendingLimit", lending)):
                    if limit is not None and not has_parent:
                        warnings.append(
                            f"{ctx.source}: {ctx.obj}: {rpath}.{fieldname} is set but the queue has no "
                            f"cohort; Kueue's validation refuses this. Accepted: the limit has no effect "
                            f"until the queue joins a cohort"
                        )
                quotas.append(ResourceQuota(rname, nominal, borrowing, lending))
            flavors.append(FlavorQuotas(fname, tuple(quotas)))
        groups.append(ResourceGroup(covered, tuple(flavors)))
    return tuple(groups)


def _weight(ctx: _Ctx, spec: Mapping[str, Any]) -> float:
    fs = ctx.mapping(spec.get("fairSharing"), "spec.fairSharing")
    weight = ctx.quantity(fs.get("weight"), "spec.fairSharing.weight")
    return 1.0 if weight is None else weight / 1000


def _cluster_queue(ctx: _Ctx, spec: Mapping[str, Any], warnings: list[str]) -> ClusterQueue:
    name = ctx.obj.split(" ", 1)[1]
    cohort = ctx.string(spec.get("cohortName", spec.get("cohort")), "spec.cohortName")
    groups = _resource_groups(
        ctx, spec.get("resourceGroups"), "spec.resourceGroups", warnings, cohort is not None
    )
    strategy = ctx.enum(
        spec.get("queueingStrategy"),
        "spec.queueingStrategy",
        [s.value for s in QueueingStrategy],
        "BestEffortFIFO",
    )
    if "namespaceSelector" in spec and spec["namespaceSelector"] is not None:
        ns_selector: LabelSelector | None = _selector(
            ctx, spec["namespaceSelector"], "spec.namespaceSelector"
        )
    else:
        ns_selector = None
        warnings.append(
            f"{ctx.source}: {ctx.obj}: spec.namespaceSelector is not set; Kueue then admits workloads "
            f"from no namespace (use namespaceSelector: {{}} for all)"
        )
    stop = ctx.enum(spec.get("stopPolicy"), "spec.stopPolicy", ("None", "Hold", "HoldAndDrain"), "None")
    ff = ctx.mapping(spec.get("flavorFungibility"), "spec.flavorFungibility")
    fungibility = FlavorFungibility(
        FungibilityPolicy(
            _FUNGIBILITY[
                ctx.enum(
                    ff.get("whenCanBorrow"),
                    "spec.flavorFungibility.whenCanBorrow",
                    _FUNGIBILITY,
                    "MayStopSearch",
                )
            ]
        ),
        FungibilityPolicy(
            _FUNGIBILITY[
                ctx.enum(
                    ff.get("whenCanPreempt"),
                    "spec.flavorFungibility.whenCanPreempt",
                    _FUNGIBILITY,
                    "TryNextFlavor",
                )
            ]
        ),
    )
    pre = ctx.mapping(spec.get("preemption"), "spec.preemption")
    within = ctx.enum(
        pre.get("withinClusterQueue"),
        "spec.preemption.withinClusterQueue",
        ("Never", "LowerPriority", "LowerOrNewerEqualPriority"),
        "Never",
    )
    reclaim = ctx.enum(
        pre.get("reclaimWithinCohort"),
        "spec.preemption.reclaimWithinCohort",
        ("Never", "LowerPriority", "Any"),
        "Never",
    )
    bwc = ctx.mapping(pre.get("borrowWithinCohort"), "spec.preemption.borrowWithinCohort")
    bwc_policy = ctx.enum(
        bwc.get("policy"), "spec.preemption.borrowWithinCohort.policy", ("Never", "LowerPriority"), "Never"
    )
    threshold = ctx.integer(
        bwc.get("maxPriorityThreshold"), "spec.preemption.borrowWithinCohort.maxPriorityThreshold"
    )
    if bwc_policy != "Never" and reclaim == "Never":
        raise ctx.fail(
            "spec.preemption.borrowWithinCohort.policy", "must be Never when reclaimWithinCohort is Never"
        )
    return ClusterQueue(
        name=name,
        resource_groups=groups,
        cohort=cohort,
        queueing_strategy=QueueingStrategy(strategy),
        namespace_selector=ns_selector,
        stop_policy=stop,
        flavor_fungibility=fungibility,
        preemption=Preemption(
            PreemptionPolicy(within), PreemptionPolicy(reclaim), PreemptionPolicy(bwc_policy), threshold
        ),
        fair_weight=_weight(ctx, spec),
    )


def _pod_requests(ctx: _Ctx, pod_spec: Mapping[str, Any], path: str) -> tuple[tuple[str, int], ...]:
    """Per-pod requests the Kubernetes way: sum of containers, max with each init container,
    plus overhead; a request defaults to the limit when only the limit is given."""

    def container_requests(c: Mapping[str, Any], cpath: str) -> dict[str, int]:
        res = ctx.mapping(c.get("resources"), f"{cpath}.resources")
        out: dict[str, int] = {}
        for kind in ("limits", "requests"):  # requests override limits
            for rname, qty in ctx.mapping(res.get(kind), f"{cpath}.resources.{kind}").items():
                out[str(rname)] = ctx.quantity(qty, f"{cpath}.resources.{kind}.{rname}", required=True) or 0
        return out

    total: dict[str, int] = {}
    for i, c in enumerate(ctx.seq(pod_spec.get("containers"), f"{path}.containers")):
        for rname, v in container_requests(
            ctx.mapping(c, f"{path}.containers[{i}]"), f"{path}.containers[{i}]"
        ).items():
            total[rname] = total.get(rname, 0) + v
    for i, c in enumerate(ctx.seq(pod_spec.get("initContainers"), f"{path}.initContainers")):
        cpath = f"{path}.initContainers[{i}]"
        for rname, v in container_requests(ctx.mapping(c, cpath), cpath).items():
            total[rname] = max(total.get(rname, 0), v)
    for rname, qty in ctx.mapping(pod_spec.get("overhead"), f"{path}.overhead").items():
        total[str(rname)] = total.get(str(rname), 0) + (
            ctx.quantity(qty, f"{path}.overhead.{rname}", required=True) or 0
        )
    return tuple(sorted(total.items()))


def _pod_set(ctx: _Ctx, raw: Any, path: str) -> PodSet:
    ps = ctx.mapping(raw, path)
    name = ctx.string(ps.get("name"), f"{path}.name") or "main"
    count = ctx.integer(ps.get("count"), f"{path}.count", minimum=0)
    count = 1 if count is None else count
    min_count = ctx.integer(ps.get("minCount"), f"{path}.minCount", minimum=0)
    if min_count is not None and min_count > count:
        raise ctx.fail(f"{path}.minCount", f"must be <= count ({count}), got {min_count}")
    template = ctx.mapping(ps.get("template"), f"{path}.template")
    pod_spec = ctx.mapping(template.get("spec"), f"{path}.template.spec")
    return PodSet(
        name=name,
        count=count,
        requests=_pod_requests(ctx, pod_spec, f"{path}.template.spec"),
        min_count=min_count,
        node_selector=_labels(ctx, pod_spec.get("nodeSelector"), f"{path}.template.spec.nodeSelector"),
        node_affinity=_node_affinity(ctx, pod_spec, f"{path}.template.spec"),
        tolerations=_tolerations(ctx, pod_spec, f"{path}.template.spec"),
    )


def _conditions(ctx: _Ctx, status: Mapping[str, Any]) -> dict[str, tuple[bool, float | None]]:
    out = {}
    for i, raw in enumerate(ctx.seq(status.get("conditions"), "status.conditions")):
        cond = ctx.mapping(raw, f"status.conditions[{i}]")
        ctype = str(cond.get("type", ""))
        out[ctype] = (
            str(cond.get("status", "")) == "True",
            ctx.timestamp(cond.get("lastTransitionTime"), f"status.conditions[{i}].lastTransitionTime"),
        )
    return out


def _admission(ctx: _Ctx, status: Mapping[str, Any], pod_sets: tuple[PodSet, ...]) -> Admission | None:
    raw = status.get("admission")
    if raw is None:
        return None
    adm = ctx.mapping(raw, "status.admission")
    cq = ctx.string(adm.get("clusterQueue"), "status.admission.clusterQueue", required=True) or ""
    by_name = {ps.name: ps for ps in pod_sets}
    psas = []
    for i, praw in enumerate(
        ctx.seq(adm.get("podSetAssignments"), "status.admission.podSetAssignments", required=True)
    ):
        path = f"status.admission.podSetAssignments[{i}]"
        psa = ctx.mapping(praw, path)
        name = ctx.string(psa.get("name"), f"{path}.name") or "main"
        flavors = tuple(
            sorted((str(r), str(f)) for r, f in ctx.mapping(psa.get("flavors"), f"{path}.flavors").items())
        )
        spec_ps = by_name.get(name)
        count = ctx.integer(psa.get("count"), f"{path}.count", minimum=0)
        if count is None:
            count = spec_ps.count if spec_ps else 1
        usage_raw = ctx.mapping(psa.get("resourceUsage"), f"{path}.resourceUsage")
        if usage_raw:
            usage = tuple(
                sorted(
                    (str(r), ctx.quantity(q, f"{path}.resourceUsage.{r}", required=True) or 0)
                    for r, q in usage_raw.items()
                )
            )
        elif spec_ps is not None:
            usage = tuple((r, v * count) for r, v in spec_ps.requests)
        else:
            raise ctx.fail(f"{path}.name", f"pod set {name} is not in spec.podSets and has no resourceUsage")
        psas.append(PodSetAdmission(name, flavors, count, usage))
    return Admission(cq, tuple(psas))


class _Loader:
    def __init__(self) -> None:
        self.flavors: dict[str, ResourceFlavor] = {}
        self.cqs: dict[str, ClusterQueue] = {}
        self.cohorts: dict[str, Cohort] = {}
        self.lqs: dict[tuple[str, str], LocalQueue] = {}
        self.wpcs: dict[str, int] = {}
        self.pcs: dict[str, int] = {}
        self.namespaces: dict[str, Namespace] = {}
        self.raw_workloads: list[tuple[_Ctx, dict[str, Any]]] = []
        self.config = Config()
        self.warnings: list[str] = []
        self._seen: dict[tuple[str, str], str] = {}

    def add(self, source: str, doc: Any) -> None:
        if doc is None:
            return
        if not isinstance(doc, Mapping):
            raise ConfigError(source, "document", "(root)", f"must be a mapping, got {type(doc).__name__}")
        kind = doc.get("kind")
        api = str(doc.get("apiVersion", ""))
        if kind == "List" and isinstance(doc.get("items"), list):
            for item in doc["items"]:
                self.add(source, item)
            return
        meta = doc.get("metadata") if isinstance(doc.get("metadata"), Mapping) else {}
        name = meta.get("name")
        obj = f"{kind} {name}" if name else f"{kind} (unnamed)"
        ctx = _Ctx(source, obj)
        kueue = api.startswith(KUEUE_GROUP)
        handled = (
            (
                kueue
                and kind
                in (
                    "ResourceFlavor",
                    "ClusterQueue",
                    "Cohort",
                    "LocalQueue",
                    "WorkloadPriorityClass",
                    "Workload",
                )
            )
            or (kind == "Configuration" and api.startswith("config.kueue.x-k8s.io/"))
            or (kind == "Job" and api == "batch/v1")
            or (kind == "Namespace" and api == "v1")
            or (kind == "PriorityClass" and api.startswith("scheduling.k8s.io/"))
        )
        if not handled:
            return
        if kind != "Configuration":
            ctx.string(name, "metadata.name", required=True)
        namespace = str(meta.get("namespace") or "default")
        ident = (str(kind), f"{namespace}/{name}" if kind in ("LocalQueue", "Workload", "Job") else str(name))
        if ident in self._seen:
            raise ctx.fail("metadata.name", f"duplicate {kind}, first defined in {self._seen[ident]}")
        self._seen[ident] = source
        spec = ctx.mapping(doc.get("spec"), "spec")
        if kind == "ResourceFlavor":
            self.flavors[name] = ResourceFlavor(name, _labels(ctx, spec.get("nodeLabels"), "spec.nodeLabels"),
                                                _taints(ctx, spec.get("nodeTaints"), "spec.nodeTaints"))
        elif kind == "ClusterQueue":
            self.cqs[name] = _cluster_queue(ctx, spec, self.warnings)
        elif kind == "Cohort":
            parent = ctx.string(spec.get("parentName", spec.get("parent")), "spec.parentName")
            groups = _resource_groups(
                ctx, spec.get("resourceGroups"), "spec.resourceGroups", self.warnings, parent is not None
            )
            self.cohorts[name] = Cohort(name, parent, groups, _weight(ctx, spec))
        elif kind == "LocalQueue":
            cq = ctx.string(spec.get("clusterQueue"), "spec.clusterQueue", required=True) or ""
            self.lqs[(namespace, name)] = LocalQueue(namespace, name, cq)
        elif kind == "WorkloadPriorityClass":
            value = ctx.integer(doc.get("value"), "value")
            if value is None:
                raise ctx.fail("value", "is required")
            self.wpcs[name] = value
        elif kind == "PriorityClass":
            self.pcs[name] = ctx.integer(doc.get("value"), "value") or 0
        elif kind == "Namespace":
            self.namespaces[name] = Namespace(name, _labels(ctx, meta.get("labels"), "metadata.labels"))
        elif kind == "Configuration":
            fs = ctx.mapping(doc.get("fairSharing"), "fairSharing")
            if "fairSharing" in doc:
                default_enabled = not api.endswith("/v1beta1")  # v1beta2: present means on
                enabled = fs.get("enable", default_enabled)
                if not isinstance(enabled, bool):
                    raise ctx.fail("fairSharing.enable", f"must be a boolean, got {enabled!r}")
                strategies = (
                    tuple(
                        FairSharingStrategy(
                            ctx.enum(
                                s,
                                f"fairSharing.preemptionStrategies[{i}]",
                                [x.value for x in FairSharingStrategy],
                                "",
                            )
                        )
                        for i, s in enumerate(
                            ctx.seq(fs.get("preemptionStrategies"), "fairSharing.preemptionStrategies")
                        )
                    )
                    or FairSharingConfig().preemption_strategies
                )
                self.config = Config(FairSharingConfig(enabled, strategies))
        else:  # Workload, Job: resolved after all priority classes are known
            self.raw_workloads.append((ctx, dict(doc)))

    def _priority(
        self, ctx: _Ctx, explicit: Any, class_name: str | None, path: str
    ) -> tuple[int, str | None]:
        if class_name is not None:
            if class_name in self.wpcs:
                return self.wpcs[class_name], class_name
            if class_name in self.pcs:
                return self.pcs[class_name], class_name
            if explicit is None:
                self.warnings.append(
                    f"{ctx.source}: {ctx.obj}: {path}: priority class {class_name} not found; using 0"
                )
        return ctx.integer(explicit, "spec.priority") or 0, class_name

    def _workload(self, ctx: _Ctx, doc: Mapping[str, Any]) -> Workload | None:
        meta = ctx.mapping(doc.get("metadata"), "metadata")
        spec = ctx.mapping(doc.get("spec"), "spec")
        status = ctx.mapping(doc.get("status"), "status")
        namespace = str(meta.get("namespace") or "default")
        created = ctx.timestamp(meta.get("creationTimestamp"), "metadata.creationTimestamp") or 0.0
        uid = str(meta.get("uid") or "")
        labels = ctx.mapping(meta.get("labels"), "metadata.labels")
        conds = _conditions(ctx, status)
        if conds.get("Finished", (False, None))[0]:
            return None
        if doc.get("kind") == "Job":
            annotations = ctx.mapping(meta.get("annotations"), "metadata.annotations")
            queue = labels.get(QUEUE_LABEL) or annotations.get(QUEUE_LABEL)
            if not queue:
                return None  # not managed by Kueue
            parallelism = ctx.integer(spec.get("parallelism"), "spec.parallelism", minimum=0)
            completions = ctx.integer(spec.get("completions"), "spec.completions", minimum=0)
            count = 1 if parallelism is None else parallelism
            if completions is not None:
                count = min(count, completions)
            min_count = None
            if JOB_MIN_PARALLELISM in annotations:
                try:
                    min_count = int(annotations[JOB_MIN_PARALLELISM])
                except (TypeError, ValueError):
                    raise ctx.fail(
                        f"metadata.annotations.{JOB_MIN_PARALLELISM}", "must be an integer"
                    ) from None
                if not 0 < min_count <= count:
                    raise ctx.fail(f"metadata.annotations.{JOB_MIN_PARALLELISM}", f"must be in 1..{count}")
            template = ctx.mapping(spec.get("template"), "spec.template")
            pod_spec = ctx.mapping(template.get("spec"), "spec.template.spec")
            pod_set = PodSet(
                "main",
                count,
                _pod_requests(ctx, pod_spec, "spec.template.spec"),
                min_count,
                _labels(ctx, pod_spec.get("nodeSelector"), "spec.template.spec.nodeSelector"),
                node_affinity=_node_affinity(ctx, pod_spec, "spec.template.spec"),
                tolerations=_tolerations(ctx, pod_spec, "spec.template.spec"),
            )
            pclass = labels.get(PRIORITY_CLASS_LABEL) or pod_spec.get("priorityClassName")
            priority, pclass = self._priority(ctx, None, pclass, "metadata.labels")
            return Workload(
                namespace,
                str(meta["name"]),
                str(queue),
                (pod_set,),
                priority,
                pclass,
                created,
                uid,
                source=ctx.source,
            )
        queue = ctx.string(spec.get("queueName"), "spec.queueName")
        raw_sets = ctx.seq(spec.get("podSets"), "spec.podSets", required=True)
        if not raw_sets:
            raise ctx.fail("spec.podSets", "must have at least one pod set")
        pod_sets = tuple(_pod_set(ctx, raw, f"spec.podSets[{i}]") for i, raw in enumerate(raw_sets))
        names = [ps.name for ps in pod_sets]
        if len(set(names)) != len(names):
            raise ctx.fail("spec.podSets", f"pod set names must be unique, got {names}")
        ref = ctx.mapping(spec.get("priorityClassRef"), "spec.priorityClassRef")
        pclass = spec.get("priorityClassName") or ref.get("name")
        priority, pclass = self._priority(ctx, spec.get("priority"), pclass, "spec.priorityClassName")
        admission = _admission(ctx, status, pod_sets)
        reserved, reserved_at = conds.get("QuotaReserved", (admission is not None, None))
        if admission is not None and not reserved:
            admission = None
        if queue is None and admission is None:
            self.warnings.append(
                f"{ctx.source}: {ctx.obj}: spec.queueName is not set; not managed by Kueue, ignored"
            )
            return None
        return Workload(
            namespace,
            str(meta["name"]),
            queue,
            pod_sets,
            priority,
            pclass,
            created,
            uid,
            admission,
            reserved_at if admission is not None else None,
            conds.get("Evicted", (False, None))[0],
            ctx.source,
        )

    def finish(self) -> Objects:
        workloads = []
        for ctx, doc in self.raw_workloads:
            wl = self._workload(ctx, doc)
            if wl is not None:
                workloads.append(wl)
        for cq in self.cqs.values():
            if cq.cohort is not None and cq.cohort not in self.cohorts:
                self.cohorts[cq.cohort] = Cohort(cq.cohort)  # implicit cohort, as in Kueue
        for cohort in list(self.cohorts.values()):
            if cohort.parent is not None and cohort.parent not in self.cohorts:
                self.cohorts[cohort.parent] = Cohort(cohort.parent)
        for name in self.cohorts:  # cycle check
            seen, cur = set(), name
            while cur is not None:
                if cur in seen:
                    raise ConfigError(
                        "(all files)", f"Cohort {name}", "spec.parentName", "cohort hierarchy has a cycle"
                    )
                seen.add(cur)
                cur = self.cohorts[cur].parent
        return Objects(
            flavors=self.flavors,
            cluster_queues=self.cqs,
            cohorts=self.cohorts,
            local_queues=self.lqs,
            priority_classes={**self.pcs, **self.wpcs},
            namespaces=self.namespaces,
            workloads=tuple(workloads),
            config=self.config,
            warnings=tuple(self.warnings),
        )


def load_objects(documents: Iterable[tuple[str, Any]]) -> Objects:
    """Build :class:`Objects` from ``(source, document)`` pairs (source: a file name)."""
    loader = _Loader()
    for source, doc in documents:
        loader.add(source, doc)
    return loader.finish()
