"""Typed, frozen views of Kueue's objects and of the core's decisions.

Amounts are integer milli-units (see :mod:`services.core.quantity`); an unset limit is
``None`` (:data:`~services.core.quantity.UNLIMITED`). Times are POSIX seconds (``float``):
the core never reads a clock, the caller passes ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from services.core.frozen import quick_init

# A (flavor, resource) pair: Kueue's FlavorResource.
FlavorResource = tuple[str, str]


class QueueingStrategy(StrEnum):
    STRICT_FIFO = "StrictFIFO"
    BEST_EFFORT_FIFO = "BestEffortFIFO"


class PreemptionPolicy(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"
    ANY = "Any"


class FungibilityPolicy(StrEnum):
    """flavorFungibility.whenCanBorrow / whenCanPreempt. v1beta1's ``Borrow`` and ``Preempt``
    and v1beta2's ``MayStopSearch`` all mean: stop at this flavor."""

    MAY_STOP_SEARCH = "MayStopSearch"
    TRY_NEXT_FLAVOR = "TryNextFlavor"


class FairSharingStrategy(StrEnum):
    LESS_THAN_OR_EQUAL_TO_FINAL_SHARE = "LessThanOrEqualToFinalShare"
    LESS_THAN_INITIAL_SHARE = "LessThanInitialShare"


class WorkloadStatus(StrEnum):
    ADMITTED = "Admitted"
    PENDING = "Pending"
    PREEMPTING = "Preempting"


class Reason(StrEnum):
    """Why a workload is where it is after a cycle (Kueue's condition / requeue reasons)."""

    QUOTA_RESERVED = "QuotaReserved"
    WAITING_FOR_QUOTA = "WaitingForQuota"
    EXCEEDS_MAX_QUOTA = "ExceedsMaxQuota"
    NO_MATCHING_FLAVOR = "NoMatchingFlavor"
    PENDING_PREEMPTION = "PendingPreemption"
    FAILED_AFTER_NOMINATION = "FailedAfterNomination"
    INADMISSIBLE = "Inadmissible"
    NAMESPACE_MISMATCH = "NamespaceMismatch"
    QUEUED = "Queued"


class PreemptionReason(StrEnum):
    IN_CLUSTER_QUEUE = "InClusterQueue"
    IN_COHORT_RECLAMATION = "InCohortReclamation"
    IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"
    IN_COHORT_FAIR_SHARING = "InCohortFairSharing"


# ----------------------------------------------------------------------------- config objects


@quick_init
@dataclass(frozen=True, slots=True)
class ResourceQuota:
    resource: str
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class FlavorQuotas:
    flavor: str
    resources: tuple[ResourceQuota, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class ResourceGroup:
    covered_resources: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class LabelRequirement:
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist; and Gt, Lt in a node affinity
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` meet it, as Kubernetes' label and node selectors read it."""
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op in ("Gt", "Lt") and value is not None and len(self.values) == 1:
            try:
                have, bound = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > bound if op == "Gt" else have < bound
        return False


@quick_init
@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes label selector. ``None`` where a selector is expected matches nothing."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        return all(req.holds(labels) for req in self.match_expressions)


@quick_init
@dataclass(frozen=True, slots=True)
class Preemption:
    within_cluster_queue: PreemptionPolicy = PreemptionPolicy.NEVER
    reclaim_within_cohort: PreemptionPolicy = PreemptionPolicy.NEVER
    borrow_within_cohort: PreemptionPolicy = PreemptionPolicy.NEVER  # Never | LowerPriority
    max_priority_threshold: int | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class FlavorFungibility:
    when_can_borrow: FungibilityPolicy = FungibilityPolicy.MAY_STOP_SEARCH
    when_can_preempt: FungibilityPolicy = FungibilityPolicy.TRY_NEXT_FLAVOR


@quick_init
@dataclass(frozen=True, slots=True)
class ResourceFlavor:
    name: str
    node_labels: tuple[tuple[str, str], ...] = ()
    node_taints: tuple[Taint, ...] = ()  # a pod set must tolerate them to be given the flavor


@quick_init
@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""  # NoSchedule, NoExecute (PreferNoSchedule asks nothing of a pod)

    def __str__(self) -> str:  # as Kubernetes writes one: key=value:effect
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


@quick_init
@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty with Exists: every key
    operator: str = "Equal"  # Equal, Exists
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' ToleratesTaint."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("Equal", "") and self.value == taint.value


@quick_init
@dataclass(frozen=True, slots=True)
class ClusterQueue:
    name: str
    resource_groups: tuple[ResourceGroup, ...] = ()
    cohort: str | None = None
    queueing_strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    namespace_selector: LabelSelector | None = LabelSelector()
    stop_policy: str = "None"
    flavor_fungibility: FlavorFungibility = FlavorFungibility()
    preemption: Preemption = Preemption()
    fair_weight: float = 1.0


@quick_init
@dataclass(frozen=True, slots=True)
class Cohort:
    name: str
    parent: str | None = None
    resource_groups: tuple[ResourceGroup, ...] = ()
    fair_weight: float = 1.0


@quick_init
@dataclass(frozen=True, slots=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str


@quick_init
@dataclass(frozen=True, slots=True)
class Namespace:
    name: str
    labels: tuple[tuple[str, str], ...] = ()

    def label_map(self) -> dict[str, str]:
        labels = dict(self.labels)
        labels.setdefault("kubernetes.io/metadata.name", self.name)
        return labels


@quick_init
@dataclass(frozen=True, slots=True)
class FairSharingConfig:
    enabled: bool = False
    preemption_strategies: tuple[FairSharingStrategy, ...] = (
        FairSharingStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE,
        FairSharingStrategy.LESS_THAN_INITIAL_SHARE,
    )


@quick_init
@dataclass(frozen=True, slots=True)
class Config:
    """The parts of Kueue's ``Configuration`` the quota core uses."""

    fair_sharing: FairSharingConfig = FairSharingConfig()


# ----------------------------------------------------------------------------- workloads


@quick_init
@dataclass(frozen=True, slots=True)
class PodSet:
    name: str
    count: int
    requests: tuple[tuple[str, int], ...] = ()  # per pod, milli-units
    min_count: int | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    # (flavor, why): flavors the admission policies refuse this workload (ADR 0070), never assigned
    refused_flavors: tuple[tuple[str, str], ...] = ()
    # the pod template's required node affinity: terms (any may hold) of requirements (all must)
    node_affinity: tuple[tuple[LabelRequirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()  # what the pods tolerate of a flavor's nodeTaints
    # pod sets key the flavor assigner's per-queue plans, hashed once per nomination: computed
    # once here instead of rehashing every field each time
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_hash",
            hash((self.name, self.count, self.requests, self.min_count, self.node_selector, self.refused_flavors,
                  self.node_affinity, self.tolerations)),
        )

    def __hash__(self) -> int:
        return self._hash


@quick_init
@dataclass(frozen=True, slots=True)
class PodSetAdmission:
    name: str
    flavors: tuple[tuple[str, str], ...]  # resource -> flavor
    count: int
    usage: tuple[tuple[str, int], ...]  # resource -> total milli-units


@quick_init
@dataclass(frozen=True, slots=True)
class Admission:
    cluster_queue: str
    pod_sets: tuple[PodSetAdmission, ...]

    def flavor_usage(self) -> dict[FlavorResource, int]:
        out: dict[FlavorResource, int] = {}
        for ps in self.pod_sets:
            flavors = dict(ps.flavors)
            for res, amount in ps.usage:
                flavor = flavors.get(res)
                if flavor is None or amount == 0:
                    continue
                out[(flavor, res)] = out.get((flavor, res), 0) + amount
        return out


@quick_init
@dataclass(frozen=True, slots=True)
class Workload:
    """A Kueue Workload (or a batch/v1 Job turned into one), pending or admitted."""

    namespace: str
    name: str
    queue_name: str | None
    pod_sets: tuple[PodSet, ...]
    priority: int = 0
    priority_class: str | None = None
    created_at: float = 0.0
    uid: str = ""
    admission: Admission | None = None
    quota_reserved_at: float | None = None
    evicted: bool = False
    source: str = ""
    key: str = field(init=False, compare=False, repr=False, default="")
    # Kueue's order within a ClusterQueue: higher priority first, then FIFO, then key. Made
    # once here: every drain pass sorts its queues by it (the queue-manager's workloads wait
    # through hundreds of passes)
    queue_order: tuple[int, float, str] = field(init=False, compare=False, repr=False, default=())

    def __post_init__(self) -> None:
        key = f"{self.namespace}/{self.name}"
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "queue_order", (-self.priority, self.created_at, key))


@quick_init
@dataclass(frozen=True, slots=True)
class Objects:
    """Everything read from Kueue YAML, validated and defaulted."""

    flavors: Mapping[str, ResourceFlavor] = field(default_factory=dict)
    cluster_queues: Mapping[str, ClusterQueue] = field(default_factory=dict)
    cohorts: Mapping[str, Cohort] = field(default_factory=dict)
    local_queues: Mapping[tuple[str, str], LocalQueue] = field(default_factory=dict)
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    namespaces: Mapping[str, Namespace] = field(default_factory=dict)
    workloads: tuple[Workload, ...] = ()
    config: Config = Config()
    warnings: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- decisions


@quick_init
@dataclass(frozen=True, slots=True)
class PreemptionTarget:
    workload: str
    reason: PreemptionReason
    cluster_queue: str = ""


NO_ENTRIES: Mapping[str, object] = MappingProxyType({})


@quick_init
@dataclass(frozen=True, slots=True)
class Decision:
    workload: str
    status: WorkloadStatus
    cluster_queue: str | None
    reason: Reason
    message: str = ""
    # a pending decision shares one empty, read-only mapping (drain makes tens of thousands)
    flavors: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: NO_ENTRIES)
    counts: Mapping[str, int] = field(default_factory=lambda: NO_ENTRIES)
    preempts: tuple[PreemptionTarget, ...] = ()
    borrowing: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "workload": self.workload,
            "status": str(self.status),
            "clusterQueue": self.cluster_queue,
            "flavors": {ps: dict(res) for ps, res in self.flavors.items()},
            "counts": dict(self.counts),
            "reason": str(self.reason),
            "message": self.message,
            "preempts": [{"workload": t.workload, "reason": str(t.reason)} for t in self.preempts],
        }
