"""Fluent builders for cost-fold tests: ``Stream().reserve("wl", gpus=16, at="10:00").expire(at="10:05")``."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

from services.core.cost import (
    ClockTick,
    CostEvent,
    Evicted,
    Finished,
    LedgerRow,
    NamespaceLabeled,
    PodsRunning,
    PodsStopped,
    PreFreezeExpired,
    PriceListConfigured,
    Released,
    ReservationStarted,
    ResourceAmounts,
    price_list_from_dict,
)
from services.core.cost.units import parse_iso_utc_ms

DAY = "2023-07-01"
CC_LABEL = "quartermaster.dev/cost-center"


def at(clock: str, day: str = DAY) -> int:
    """``"10:05"`` or ``"10:05:30"`` on the test day → epoch ms; a full ISO string is used as is."""
    if "T" in clock:
        return parse_iso_utc_ms(clock)
    if clock.count(":") == 1:
        clock += ":00"
    return parse_iso_utc_ms(f"{day}T{clock}Z")


MINUTE = 60_000  # ms
HOUR = 60 * MINUTE
T0 = at("08:00")  # where the property tests' streams start


def gpu_hours(gpu_milli: int, seconds: int) -> Decimal:
    """The exact value rounded to 9 places, ROUND_HALF_EVEN — computed independently with Fraction."""
    exact = Fraction(gpu_milli * seconds, 1000 * 3600)
    return round_9(exact)


def round_9(exact: Fraction) -> Decimal:
    """Nearest 1e-9, ties to even (Python's ``round`` of a Fraction is half-even)."""
    return Decimal(round(exact * 10**9)).scaleb(-9)


PRICE_LIST_DOC = {
    "apiVersion": "quartermaster.dev/v1alpha1",
    "kind": "PriceList",
    "metadata": {"name": "default"},
    "spec": {
        "currency": "USD",
        "flavors": [
            {
                "name": "a100-flavor",
                "resources": [
                    {"name": "nvidia.com/gpu", "listPrice": "3.20", "contractedPrice": "2.40"},
                    {"name": "cpu", "listPrice": "0.04", "contractedPrice": "0.03"},
                    {"name": "memory", "listPrice": "0.005"},
                ],
            }
        ],
        "default": {"resources": [{"name": "nvidia.com/gpu", "listPrice": "1.00"}]},
    },
}


class Stream:
    """Builds an event list with deterministic ids (``e1``, ``e2``...)."""

    def __init__(self) -> None:
        self.events: list[CostEvent] = []

    def _id(self) -> str:
        return f"e{len(self.events) + 1}"

    def namespace(self, name: str, cost_center: str, clock: str = "00:00") -> Stream:
        self.events.append(NamespaceLabeled(self._id(), name, ((CC_LABEL, cost_center),), at(clock)))
        return self

    def prices(self, clock: str = "00:00", doc: dict | None = None) -> Stream:
        self.events.append(
            PriceListConfigured(self._id(), price_list_from_dict(doc or PRICE_LIST_DOC), at(clock))
        )
        return self

    def reserve(
        self,
        uid: str,
        *,
        at_: str,
        gpus: float = 0,
        cpu_milli: int = 0,
        ns: str = "ml-team",
        flavor: str = "a100-flavor",
    ) -> Stream:
        amounts = ResourceAmounts(gpu_milli=int(gpus * 1000), cpu_milli=cpu_milli)
        self.events.append(ReservationStarted(self._id(), uid, ns, flavor, amounts, at(at_)))
        return self

    def run(
        self,
        uid: str,
        *,
        at_: str,
        gpus: float = 0,
        cpu_milli: int = 0,
        memory_gib: int = 0,
        pod: str = "",
        ns: str = "ml-team",
        flavor: str = "a100-flavor",
    ) -> Stream:
        amounts = ResourceAmounts(
            gpu_milli=int(gpus * 1000), cpu_milli=cpu_milli, memory_milli=memory_gib * 2**30 * 1000
        )
        self.events.append(PodsRunning(self._id(), uid, ns, flavor, amounts, at(at_), pod_name=pod))
        return self

    def stop(self, uid: str, *, at_: str, pod: str = "") -> Stream:
        self.events.append(PodsStopped(self._id(), uid, at(at_), pod))
        return self

    def expire(self, uid: str, *, at_: str) -> Stream:
        self.events.append(PreFreezeExpired(self._id(), uid, at(at_)))
        return self

    def release(self, uid: str, *, at_: str) -> Stream:
        self.events.append(Released(self._id(), uid, at(at_)))
        return self

    def evict(self, uid: str, *, at_: str) -> Stream:
        self.events.append(Evicted(self._id(), uid, at(at_)))
        return self

    def finish(self, uid: str, *, at_: str) -> Stream:
        self.events.append(Finished(self._id(), uid, at(at_)))
        return self

    def tick(self, clock: str) -> Stream:
        self.events.append(ClockTick(f"tick-{clock}", at(clock)))
        return self


def rows(outputs: list) -> list[LedgerRow]:
    return [output for output in outputs if isinstance(output, LedgerRow)]
