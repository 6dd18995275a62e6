"""What the demo shows: counters folded from the topics the services write, read without a
consumer group (the demo is a reader, never part of a service's group)."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from aiokafka import AIOKafkaConsumer

from services.contracts.codec import ContractError, decode_all, epoch_of


@dataclass
class Observed:
    validated: int = 0
    rejected: int = 0
    reserved: int = 0
    pending_now: dict[str, str] = field(default_factory=dict)  # uid -> cluster queue
    admitted_now: dict[str, str] = field(default_factory=dict)
    preempted: int = 0
    expired: int = 0
    by_queue: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    usage: dict[str, dict[str, float]] = field(default_factory=dict)  # namespace -> reserved/running GPUs
    rows: dict[str, object] = field(default_factory=dict)  # ledger row id -> row
    rejections: Counter = field(default_factory=Counter)  # message -> count
    waits_s: list[tuple[str, float]] = field(default_factory=list)  # (reserved at, wait seconds)
    validated_at: dict[str, float] = field(default_factory=dict)
    events: int = 0  # records read so far, to tell when the services have gone quiet
    timeline: list[dict] = field(default_factory=list)

    def apply(self, envelope) -> None:
        p = envelope.payload
        kind = envelope.event_type
        if kind == "workload.validated.v1":
            self.validated += 1
            self.pending_now[p.uid] = p.cluster_queue
            self.validated_at[p.uid] = epoch_of(p.created_at)
        elif kind == "workload.rejected.v1":
            self.rejected += 1
            self.rejections[p.message] += 1
        elif kind == "workload.quota_reserved.v1":
            self.reserved += 1
            self.pending_now.pop(p.uid, None)
            self.admitted_now[p.uid] = p.cluster_queue
            self.by_queue[p.cluster_queue]["admitted"] += 1
            if p.uid in self.validated_at:
                at = epoch_of(p.reserved_at)
                self.waits_s.append((p.reserved_at, max(0.0, at - self.validated_at[p.uid])))
        elif kind in ("workload.released.v1", "workload.finished.v1"):
            cq = self.admitted_now.pop(p.uid, None)
            if kind == "workload.finished.v1":
                self.pending_now.pop(p.uid, None)
            elif cq:
                self.by_queue[cq]["released"] += 1
        elif kind == "workload.requeued.v1":
            self.pending_now[p.uid] = p.cluster_queue or ""
        elif kind == "workload.evicted.v1":
            self.preempted += 1
        elif kind == "workload.prefreeze_expired.v1":
            self.expired += 1
        elif kind == "usage.snapshot.v1":
            self.usage[p.namespace] = {
                "reserved": sum(r.get("nvidia.com/gpu", 0) for r in p.reserved.values()) / 1000,
                "running": sum(r.get("nvidia.com/gpu", 0) for r in p.running.values()) / 1000,
            }
        elif kind == "billing.ledger_row.v1":
            self.rows[p.row_id] = p

    def pending_by_queue(self) -> Counter:
        return Counter(self.pending_now.values())

    def admitted_by_queue(self) -> Counter:
        return Counter(self.admitted_now.values())

    def billing(self) -> dict[str, dict[str, Decimal]]:
        """Cost center -> GPU-hours, idle GPU-hours and cost, from the deduplicated ledger."""
        out: dict[str, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
        for row in self.rows.values():
            totals = out[row.x_CostCenter]
            gpu_hours = Decimal(row.x_GpuHours or "0")
            totals["gpu_hours"] += gpu_hours
            totals["cost"] += Decimal(row.BilledCost)
            if row.x_UsageKind == "reserved-idle":
                totals["idle_gpu_hours"] += gpu_hours
            totals["currency"] = row.BillingCurrency  # type: ignore[assignment]
        return out


async def settle(observed: Observed, submitted: int, *, quiet_s: float = 3.0, cap_s: float = 60.0) -> None:
    """Wait until every submission is judged and the services have said nothing new for
    `quiet_s` (the last decisions and ledger rows have landed), at most `cap_s`: a slow
    machine takes longer than any fixed pause."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cap_s
    seen, quiet_since = observed.events, loop.time()

    def settled() -> bool:
        judged = observed.validated + observed.rejected >= submitted
        return judged and loop.time() - quiet_since >= quiet_s

    while loop.time() < deadline and not settled():
        await asyncio.sleep(0.25)
        if observed.events != seen:
            seen, quiet_since = observed.events, loop.time()


async def follow(bootstrap: str, prefix: str, observed: Observed, stop: asyncio.Event) -> None:
    topics = [prefix + t for t in ("qm.workloads", "qm.usage", "qm.billing")]
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                for record in records:
                    observed.events += 1
                    try:
                        for envelope in decode_all(record.value):  # a bundle: each of its envelopes (ADR 0034)
                            observed.apply(envelope)
                    except ContractError:
                        continue
    finally:
        await consumer.stop()
