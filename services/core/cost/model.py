"""Events the cost fold consumes and the outputs it produces: frozen, plain, typed.

Times are integer epoch milliseconds, UTC, taken from the event (event time). Resource
amounts are integer milli-units (``gpu_milli=16000`` is 16 GPUs; memory is milli-bytes, as
:func:`services.core.quantity.parse_quantity_milli` returns).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from services.core.frozen import quick_init
from services.core.quantity import parse_quantity_milli

__all__ = [
    "Budget",
    "BudgetAlert",
    "BudgetStatus",
    "BudgetUnit",
    "BudgetsConfigured",
    "ChargeClass",
    "ClockTick",
    "CostEvent",
    "CostOutput",
    "CostSettings",
    "FlavorPrices",
    "EventIgnored",
    "Evicted",
    "Finished",
    "IgnoreReason",
    "LedgerRow",
    "NamespaceLabeled",
    "PodsRunning",
    "PodsStopped",
    "PreFreezeExpired",
    "PriceList",
    "PriceListConfigured",
    "Released",
    "ReservationStarted",
    "ResourceAmounts",
    "UnitPrice",
    "UsageKind",
    "WorkloadEvent",
]

GPU_RESOURCE = "nvidia.com/gpu"


class UsageKind(StrEnum):
    """What a ledger row bills."""

    #: Quota reserved ("pre-frozen") for the workload but not used by a running pod:
    #: ``max(0, reserved - running)`` per resource and flavor.
    RESERVED_IDLE = "reserved-idle"
    #: Resources of running pods (each pod its own interval).
    RUNNING = "running"


class ChargeClass(StrEnum):
    """FOCUS ``ChargeClass``: empty for regular rows, ``Correction`` for late-event deltas."""

    REGULAR = ""
    CORRECTION = "Correction"


class IgnoreReason(StrEnum):
    TOO_LATE = "TooLate"  # would correct an hour older than the correction horizon
    AFTER_FINISH = "AfterFinish"  # a start for a workload that already finished
    FORGOTTEN_WORKLOAD = "ForgottenWorkload"  # finished and pruned past the horizon


class BudgetUnit(StrEnum):
    GPU_HOURS = "gpu-hours"
    CURRENCY = "currency"


@quick_init
@dataclass(frozen=True, slots=True)
class ResourceAmounts:
    """Requested/used amounts in integer milli-units."""

    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_milli: int = 0  # milli-bytes

    @classmethod
    def from_k8s(cls, requests: Mapping[str, object], gpu_resource: str = GPU_RESOURCE) -> ResourceAmounts:
        """From a Kubernetes resource map (``{"nvidia.com/gpu": 8, "cpu": "500m", "memory": "16Gi"}``)."""
        return cls(
            gpu_milli=parse_quantity_milli(requests.get(gpu_resource, 0)),
            cpu_milli=parse_quantity_milli(requests.get("cpu", 0)),
            memory_milli=parse_quantity_milli(requests.get("memory", 0)),
        )

    @classmethod
    def from_mib(cls, gpu_milli: int = 0, cpu_milli: int = 0, memory_mib: int = 0) -> ResourceAmounts:
        return cls(gpu_milli=gpu_milli, cpu_milli=cpu_milli, memory_milli=memory_mib * 2**20 * 1000)


Labels = tuple[tuple[str, str], ...]


# --------------------------------------------------------------------------- events


@quick_init
@dataclass(frozen=True, slots=True)
class ReservationStarted:
    """Quota was reserved (pre-frozen) for the workload in ``flavor`` (Kueue QuotaReserved)."""

    event_id: str
    workload_uid: str
    namespace: str
    flavor: str
    resources: ResourceAmounts
    at_ms: int
    workload_name: str = ""
    labels: Labels = ()


@quick_init
@dataclass(frozen=True, slots=True)
class PodsRunning:
    """Pods of the workload started running.

    ``pod_name=""`` means the workload's pods as one unit (all started together);
    a named pod is its own interval, so a gang whose pods start at different times is billed
    per pod. A second start for the same pod replaces the first from ``at_ms`` (resize).
    """

    event_id: str
    workload_uid: str
    namespace: str
    flavor: str
    resources: ResourceAmounts
    at_ms: int
    pod_name: str = ""
    workload_name: str = ""
    labels: Labels = ()


@quick_init
@dataclass(frozen=True, slots=True)
class PodsStopped:
    """A pod (or, with ``pod_name=""``, the workload's unnamed pod interval) stopped running."""

    event_id: str
    workload_uid: str
    at_ms: int
    pod_name: str = ""


@quick_init
@dataclass(frozen=True, slots=True)
class PreFreezeExpired:
    """The reservation did not become running within podsReadyTimeout: reservation ends."""

    event_id: str
    workload_uid: str
    at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class Released:
    """Quota was released: reservation and all pod intervals end (workload may be requeued)."""

    event_id: str
    workload_uid: str
    at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class Evicted:
    """The workload was evicted/preempted: reservation and all pod intervals end."""

    event_id: str
    workload_uid: str
    at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class Finished:
    """The workload finished (or was deleted): everything ends, later starts are ignored."""

    event_id: str
    workload_uid: str
    at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class NamespaceLabeled:
    """A namespace's labels as observed (the cost center is one of them)."""

    event_id: str
    namespace: str
    labels: Labels
    at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class PriceListConfigured:
    event_id: str
    price_list: PriceList
    at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class BudgetsConfigured:
    """The complete set of budgets (replaces the previous set)."""

    event_id: str
    budgets: tuple[Budget, ...]
    at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class ClockTick:
    """Event time advanced (``qm.clock``); closes billing hours."""

    event_id: str
    at_ms: int


WorkloadEvent = (
    ReservationStarted | PodsRunning | PodsStopped | PreFreezeExpired | Released | Evicted | Finished
)
CostEvent = WorkloadEvent | NamespaceLabeled | PriceListConfigured | BudgetsConfigured | ClockTick

# --------------------------------------------------------------------------- config values
# (defined here so events can carry them; parsing from YAML-shaped dicts is in pricing.py)


@quick_init
@dataclass(frozen=True, slots=True)
class UnitPrice:
    """Price per unit-hour: GPU-hour, core-hour or GiB-hour."""

    list_price: Decimal
    contracted_price: Decimal


ZERO_PRICE = UnitPrice(Decimal(0), Decimal(0))


@quick_init
@dataclass(frozen=True, slots=True)
class FlavorPrices:
    gpu: UnitPrice = ZERO_PRICE
    cpu: UnitPrice = ZERO_PRICE
    memory: UnitPrice = ZERO_PRICE


@quick_init
@dataclass(frozen=True, slots=True)
class PriceList:
    name: str
    currency: str
    flavors: tuple[tuple[str, FlavorPrices], ...] = ()
    default: FlavorPrices | None = None

    def prices_for(self, flavor: str) -> FlavorPrices | None:
        for name, prices in self.flavors:
            if name == flavor:
                return prices
        return self.default


@quick_init
@dataclass(frozen=True, slots=True)
class Budget:
    """A monthly (UTC calendar month) limit for one cost center."""

    name: str
    cost_center: str
    unit: BudgetUnit
    limit: Decimal
    thresholds_pct: tuple[int, ...] = (50, 80, 100)
    currency: str = ""  # for BudgetUnit.CURRENCY


# --------------------------------------------------------------------------- outputs


@quick_init
@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One row per (workload, flavor, usage kind, UTC hour[, correction revision]).

    Quantities are ``Decimal`` with 9 places; costs are exact products (see ``units``).
    ``pricing_*`` is the row's primary quantity: GPU-hours when the row has GPU usage,
    core-hours otherwise. The cost columns include every resource (GPU, CPU, memory).
    """

    row_id: str
    revision: int
    charge_class: ChargeClass
    workload_uid: str
    workload_name: str
    namespace: str
    cost_center: str
    flavor: str
    usage_kind: UsageKind
    charge_period_start_ms: int
    charge_period_end_ms: int
    gpu_hours: Decimal
    core_hours: Decimal
    memory_gib_hours: Decimal
    list_cost: Decimal
    contracted_cost: Decimal
    currency: str
    priced: bool
    tags: Labels = ()

    @property
    def billed_cost(self) -> Decimal:
        return self.contracted_cost

    @property
    def effective_cost(self) -> Decimal:
        return self.contracted_cost


@quick_init
@dataclass(frozen=True, slots=True)
class BudgetAlert:
    alert_id: str
    budget_name: str
    cost_center: str
    month: str  # "2023-07"
    threshold_pct: int
    unit: BudgetUnit
    used: Decimal
    limit: Decimal
    at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """Month-to-date consumption of a budget (compacted ``qm.budgets``, keyed by budget+month)."""

    budget_name: str
    cost_center: str
    month: str
    unit: BudgetUnit
    limit: Decimal
    used: Decimal
    remaining: Decimal  # may be negative when over budget
    used_pct: Decimal  # 2 places, ROUND_HALF_EVEN
    at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class EventIgnored:
    event_id: str
    workload_uid: str
    reason: IgnoreReason
    message: str
    at_ms: int


CostOutput = LedgerRow | BudgetAlert | BudgetStatus | EventIgnored


@quick_init
@dataclass(frozen=True, slots=True)
class CostSettings:
    """Static settings of the fold (stored in the state so a restore is self-contained)."""

    cost_center_label: str = "quartermaster.dev/cost-center"
    default_cost_center: str = "unallocated"
    #: An hour closes (rows are emitted) once event time is this far past its end.
    close_delay_ms: int = 0
    #: Late events may correct closed hours this far back; older ones are ignored (TooLate).
    correction_horizon_ms: int = 7 * 24 * 3_600_000
    billing_account_id: str = "quartermaster"
    default_currency: str = "USD"
    #: Only :class:`ClockTick` moves the watermark (hours close on ticks only). For inputs
    #: merged from several topics, where one topic's event times can run ahead of another's
    #: and would close hours before the other topic's facts for them arrived (ADR 0007).
    close_on_ticks_only: bool = False
