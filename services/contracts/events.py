"""Typed, frozen payload records, one per event type in schemas/events/.

schemas/ is the source of truth; tests/contract/test_records_match_schemas.py fails when a
record and its schema disagree. Nested maps (resources, flavors) stay plain dicts of
integer milli-units: treat them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.core.frozen import quick_init


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ActionAdmit:
    """Command to the watcher: unsuspend the workload and pin it to its flavor's nodes."""

    EVENT_TYPE = "action.admit.v1"

    workload_uid: str
    namespace: str
    name: str
    kind: str
    node_selector: dict | None = None
    tolerations: list | None = None
    flavors: dict | None = None
    counts: dict | None = None  # pod set -> pods admitted; said only under partial admission


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ActionCleanup:
    """Command to the watcher: delete an expired or orphaned workload."""

    EVENT_TYPE = "action.cleanup.v1"

    workload_uid: str
    namespace: str
    name: str
    kind: str
    reason: str


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ActionEvict:
    """Command to the watcher: signal a checkpoint, wait the grace period, then stop the workload."""

    EVENT_TYPE = "action.evict.v1"
    #: The reason of the queue-manager's stop of a reservation whose pods were not ready within
    #: podsReadyTimeout (Kueue's eviction reason); a preemption's evictions name other reasons.
    PODS_READY_TIMEOUT = "PodsReadyTimeout"
    #: ... and of its stop of a queued workload found running before it was admitted (a Job
    #: unsuspended by hand, or created where the mutating webhook is not installed).
    NOT_ADMITTED = "NotAdmitted"

    workload_uid: str
    namespace: str
    name: str
    kind: str
    reason: str
    grace_period_s: int


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ActionOutcome:
    """What happened when the watcher applied an action."""

    EVENT_TYPE = "action.outcome.v1"

    action_event_id: str
    workload_uid: str
    action: str
    outcome: str
    message: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class AlertRaised:
    """Something a person should know (a budget threshold crossed, a workload deactivated)."""

    EVENT_TYPE = "alert.raised.v1"

    alert_id: str
    severity: str
    kind: str
    subject: str
    message: str


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerRow:
    """One ledger row: a workload's usage of one flavor, of one kind, within one hour (FOCUS 1.2 columns, as services/core/cost/focus.py emits them; x_ columns are Quartermaster's)."""

    EVENT_TYPE = "billing.ledger_row.v1"

    row_id: str
    BilledCost: str
    EffectiveCost: str
    ListCost: str
    ContractedCost: str
    BillingCurrency: str
    ChargePeriodStart: str
    ChargePeriodEnd: str
    ChargeCategory: str
    ChargeDescription: str
    PricingQuantity: str
    PricingUnit: str
    ConsumedQuantity: str
    ConsumedUnit: str
    ResourceId: str
    SubAccountId: str
    SkuId: str
    ServiceCategory: str
    Tags: dict
    x_CostCenter: str
    x_UsageKind: str
    ResourceName: str | None = None
    x_Correction: bool | None = None
    x_CorrectsRowId: str | None = None
    BillingAccountId: str | None = None
    BillingAccountName: str | None = None
    BillingAccountType: str | None = None
    BillingPeriodEnd: str | None = None
    BillingPeriodStart: str | None = None
    ChargeClass: str | None = None
    ChargeFrequency: str | None = None
    InvoiceIssuerName: str | None = None
    PricingCategory: str | None = None
    ProviderName: str | None = None
    PublisherName: str | None = None
    ResourceType: str | None = None
    ServiceName: str | None = None
    ServiceSubcategory: str | None = None
    SkuPriceId: str | None = None
    SubAccountName: str | None = None
    SubAccountType: str | None = None
    x_RowId: str | None = None
    x_Revision: int | None = None
    x_GpuHours: str | None = None
    x_CoreHours: str | None = None
    x_MemoryGiBHours: str | None = None
    x_Priced: bool | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetStatus:
    """A cost center's budget for the period: used, remaining, exhausted."""

    EVENT_TYPE = "budget.status.v1"

    cost_center: str
    period: str
    unit: str
    limit: str
    used: str
    remaining: str
    exhausted: bool
    thresholds_crossed: list | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ClockTick:
    """Event time advanced; timeouts and billing periods move on ticks, never on a wall clock."""

    EVENT_TYPE = "clock.tick.v1"

    at: str
    source: str


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class DrainDue:
    """The queue-manager's note to itself on a cohort's stream: the cohort drained at `since`;
    what freed quota until this note came back is drained together now (ADR 0016)."""

    EVENT_TYPE = "queue.drain_due.v1"

    cohort: str
    since: str


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSignals:
    """Live cluster figures at a tick, for the dynamic quota rules of one cohort."""

    EVENT_TYPE = "cluster.signals.v1"

    at: str
    signals: dict


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigSnapshot:
    """The active configuration set, one version all services agree on."""

    EVENT_TYPE = "config.snapshot.v1"

    version: int
    digest: str
    objects: list
    source: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class NamespaceLabels:
    """A namespace's labels (cost center and approvals live here)."""

    EVENT_TYPE = "namespace.labels.v1"

    namespace: str
    labels: dict
    deleted: bool | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCapacity:
    """A node's allocatable resources, matched to a ResourceFlavor through its labels."""

    EVENT_TYPE = "node.capacity.v1"

    node: str
    allocatable: dict
    flavor: str | None = None
    labels: dict | None = None
    capacity: dict | None = None
    unschedulable: bool | None = None
    deleted: bool | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class PodFinished:
    """A pod of a workload stopped (succeeded, failed, or deleted)."""

    EVENT_TYPE = "pod.finished.v1"

    uid: str
    workload_uid: str
    namespace: str
    name: str
    phase: str
    finished_at: str
    node: str | None = None
    queue_name: str | None = None
    workload_name: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class PodRunning:
    """A pod of a workload started running on a node."""

    EVENT_TYPE = "pod.running.v1"

    uid: str
    workload_uid: str
    namespace: str
    name: str
    started_at: str
    node: str | None = None
    requests: dict | None = None
    queue_name: str | None = None
    workload_name: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptionNeeded:
    """A workload cannot get quota without someone giving way; carries what the preemption service needs."""

    EVENT_TYPE = "preemption.needed.v1"

    preemptor: dict
    cohort: str
    snapshot: dict
    message: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptionVictimsSelected:
    """The preemption service chose victims (or found no allowed set and says why)."""

    EVENT_TYPE = "preemption.victims_selected.v1"

    preemptor_uid: str
    cohort: str
    victims: list
    blocked_message: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaLimitsChanged:
    """A QuotaRule changed a ClusterQueue's effective borrowingLimit (milli; None: no limit;
    rule None: no rule was true, the configured limit applies)."""

    EVENT_TYPE = "quota.limits_changed.v1"

    cluster_queue: str
    flavor: str
    resource: str
    signals: dict
    changed_at: str
    message: str
    static_borrowing_limit: int | None = None
    previous_borrowing_limit: int | None = None
    effective_borrowing_limit: int | None = None
    rule: str | None = None
    errors: list | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class UsageSnapshot:
    """Live usage of one namespace, reserved and running by flavor, in milli-units."""

    EVENT_TYPE = "usage.snapshot.v1"

    namespace: str
    reserved: dict
    running: dict
    total: dict
    as_of: str
    effective_borrowing_limits: dict | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadDeactivated:
    """The workload will not be retried (for example after too many pre-freeze expiries)."""

    EVENT_TYPE = "workload.deactivated.v1"

    uid: str
    namespace: str
    name: str
    reason: str
    message: str
    cluster_queue: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadEvicted:
    """The workload was told to stop (preempted or deactivated); it gets a grace period."""

    EVENT_TYPE = "workload.evicted.v1"

    uid: str
    namespace: str
    name: str
    reason: str
    evicted_at: str
    cluster_queue: str | None = None
    preemptor: str | None = None
    grace_period_s: int | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadFinished:
    """The workload completed (or failed) and its pods are gone."""

    EVENT_TYPE = "workload.finished.v1"

    uid: str
    namespace: str
    name: str
    succeeded: bool
    finished_at: str
    cluster_queue: str | None = None
    queue_name: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadPending:
    """The workload waits; the reason changed since the last Pending event."""

    EVENT_TYPE = "workload.pending.v1"

    uid: str
    namespace: str
    name: str
    reason: str
    message: str
    cluster_queue: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadPrefreezeExpired:
    """A reservation did not start running within podsReadyTimeout; its idle time is billed."""

    EVENT_TYPE = "workload.prefreeze_expired.v1"

    uid: str
    namespace: str
    name: str
    cluster_queue: str
    reserved_at: str
    expired_at: str
    idle_s: float
    usage: dict
    expiries: int | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadQuotaReserved:
    """The queue-manager reserved (pre-froze) quota for the workload."""

    EVENT_TYPE = "workload.quota_reserved.v1"

    uid: str
    namespace: str
    name: str
    cluster_queue: str
    flavors: dict
    counts: dict
    usage: dict
    reserved_at: str
    cohort: str | None = None
    borrowing: bool | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadRejected:
    """Admission policy refused the workload; every violated rule is listed with its message."""

    EVENT_TYPE = "workload.rejected.v1"

    uid: str
    namespace: str
    name: str
    violations: list
    message: str


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadReleased:
    """The workload's quota reservation was given back."""

    EVENT_TYPE = "workload.released.v1"

    uid: str
    namespace: str
    name: str
    cluster_queue: str
    reason: str
    usage: dict
    released_at: str
    cohort: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadRequeued:
    """The workload went back to its queue and may be retried after a backoff."""

    EVENT_TYPE = "workload.requeued.v1"

    uid: str
    namespace: str
    name: str
    reason: str
    requeue_at: str
    attempt: int
    cluster_queue: str | None = None
    backoff_s: int | None = None
    queue_order_at: str | None = None  # its place in the queue counts from this time (ADR 0074)


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadRunning:
    """All pods of an admitted workload are running: its reservation is no longer idle."""

    EVENT_TYPE = "workload.running.v1"

    uid: str
    namespace: str
    name: str
    started_at: str
    cluster_queue: str | None = None
    pods_running: int | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSubmitted:
    """A workload was created in the cluster and asks to run (a Job with the queue-name label, or a Kueue Workload)."""

    EVENT_TYPE = "workload.submitted.v1"

    uid: str
    namespace: str
    name: str
    kind: str
    pod_sets: list
    created_at: str
    queue_name: str | None = None
    priority_class: str | None = None
    priority: int | None = None
    labels: dict | None = None
    annotations: dict | None = None
    owner: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadValidated:
    """Admission policy allowed the workload; re-keyed by cohort for the queue-manager."""

    EVENT_TYPE = "workload.validated.v1"

    uid: str
    namespace: str
    name: str
    queue_name: str
    cluster_queue: str
    pod_sets: list
    priority: int
    created_at: str
    cohort: str | None = None
    priority_class: str | None = None
    labels: dict | None = None
    warnings: list | None = None


RECORD_TYPES: dict[str, type] = {
    "action.admit.v1": ActionAdmit,
    "action.cleanup.v1": ActionCleanup,
    "action.evict.v1": ActionEvict,
    "action.outcome.v1": ActionOutcome,
    "alert.raised.v1": AlertRaised,
    "billing.ledger_row.v1": LedgerRow,
    "budget.status.v1": BudgetStatus,
    "clock.tick.v1": ClockTick,
    "cluster.signals.v1": ClusterSignals,
    "config.snapshot.v1": ConfigSnapshot,
    "namespace.labels.v1": NamespaceLabels,
    "node.capacity.v1": NodeCapacity,
    "pod.finished.v1": PodFinished,
    "pod.running.v1": PodRunning,
    "preemption.needed.v1": PreemptionNeeded,
    "preemption.victims_selected.v1": PreemptionVictimsSelected,
    "quota.limits_changed.v1": QuotaLimitsChanged,
    "queue.drain_due.v1": DrainDue,
    "usage.snapshot.v1": UsageSnapshot,
    "workload.deactivated.v1": WorkloadDeactivated,
    "workload.evicted.v1": WorkloadEvicted,
    "workload.finished.v1": WorkloadFinished,
    "workload.pending.v1": WorkloadPending,
    "workload.prefreeze_expired.v1": WorkloadPrefreezeExpired,
    "workload.quota_reserved.v1": WorkloadQuotaReserved,
    "workload.rejected.v1": WorkloadRejected,
    "workload.released.v1": WorkloadReleased,
    "workload.requeued.v1": WorkloadRequeued,
    "workload.running.v1": WorkloadRunning,
    "workload.submitted.v1": WorkloadSubmitted,
    "workload.validated.v1": WorkloadValidated,
}
