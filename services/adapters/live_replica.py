"""Read-only replicas for admission (and cost):  live usage (qm.usage), budgets (qm.budgets),
namespace labels and node capacity (namespace.labels.v1, node.capacity.v1 on qm.cluster), kept
current by a consumer that reads every partition without a consumer group, so each replica
sees everything. The queue-manager reads one too when dynamic quota rules need `cluster`.

It is the webhook's `LiveState` too: both paths evaluate against the same replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

from services.adapters.bus import Follower
from services.contracts.events import BudgetStatus, NamespaceLabels, NodeCapacity, UsageSnapshot
from services.core.quota import Objects
from services.core.quota.dynamic import GPU, cluster_signals

FETCH_GATHER_BYTES = 512 * 1024  # a lagging replica's fetch: enough for ~1,000 pod facts
APPLIED = frozenset(t.EVENT_TYPE for t in (UsageSnapshot, BudgetStatus, NodeCapacity, NamespaceLabels))


class LiveReplica:
    def __init__(self, bootstrap: str, topics: dict[str, str], *, behind_by_ms: int | None = None) -> None:
        """`topics`: logical name (qm.usage, qm.budgets, qm.cluster) -> actual (prefixed) name.

        `behind_by_ms`: for a reader that can be that far behind (the cost service's namespace
        labels), the broker gathers up to FETCH_GATHER_BYTES for at most that long before it
        answers. By default it answers as soon as anything is there, for admission, whose
        policies must see a namespace created just before its first workload. On qm.cluster
        under load that was a fetch for every handful of pod facts: about a sixth of the cost
        service's CPU in kueue-large-scale (ADR 0028)."""
        self._bootstrap = bootstrap
        self._topics = topics
        self._fetch = {} if behind_by_ms is None else {"fetch_max_wait_ms": behind_by_ms,
                                                       "fetch_min_bytes": FETCH_GATHER_BYTES}
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.usages: dict[str, dict[str, Any]] = {}
        self.budgets: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}  # schedulable nodes: name -> {flavor, gpu milli}
        self.objects = Objects()  # the active Kueue config: capacity of flavors without known nodes
        self.caught_up = asyncio.Event()
        self._changes = 0  # counts usage and node updates, so cluster() knows when to recompute
        self._signals: tuple[tuple[int, int], dict[str, Any]] | None = None
        self._follower: Follower | None = None
        self._awaited: dict[str, asyncio.Event] = {}  # namespaces a namespace_soon() waits for
        self._waiters: Counter[str] = Counter()  # how many wait for each, so the last drops it

    # -- LiveState --------------------------------------------------------------------
    def namespace(self, name: str) -> dict[str, Any] | None:
        return self.namespaces.get(name)

    async def namespace_soon(self, name: str, within_s: float) -> dict[str, Any] | None:
        """The Namespace, waiting up to `within_s` for the replica to receive it (the webhook: the
        API server admits objects only in namespaces that exist, so an unknown one is new)."""
        if name not in self.namespaces:
            arrived = self._awaited.setdefault(name, asyncio.Event())
            self._waiters[name] += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), within_s)
            finally:
                # the last waiter drops a namespace that never came: with the watcher down,
                # reviews in ever new namespaces would otherwise keep an Event each
                self._waiters[name] -= 1
                if not self._waiters[name]:
                    del self._waiters[name]
                    self._awaited.pop(name, None)
        return self.namespaces.get(name)

    def usage(self, namespace: str) -> dict[str, Any] | None:
        return self.usages.get(namespace)

    def budget(self, cost_center: str) -> dict[str, Any] | None:
        return self.budgets.get(cost_center)

    def cluster(self) -> dict[str, Any] | None:
        """GPU capacity, use and utilization of the whole cluster (`cluster` in CEL); recomputed
        only after usage, nodes or config changed (admission asks on every request)."""
        inputs = (self._changes, id(self.objects))
        if self._signals is None or self._signals[0] != inputs:
            self._signals = (inputs, cluster_signals(self.nodes, self.usages.values(), self.objects))
        return self._signals[1]

    def ready(self) -> bool:
        return self.caught_up.is_set()

    # -- folding ----------------------------------------------------------------------
    def apply(self, payload: Any) -> None:
        if isinstance(payload, UsageSnapshot | NodeCapacity):
            self._changes += 1
        if isinstance(payload, UsageSnapshot):
            self.usages[payload.namespace] = {
                "namespace": payload.namespace,
                "reserved": payload.reserved,
                "running": payload.running,
                "total": payload.total,
            }
        elif isinstance(payload, BudgetStatus):
            self.budgets[payload.cost_center] = {
                "costCenter": payload.cost_center,
                "period": payload.period,
                "unit": payload.unit,
                "limit": payload.limit,
                "used": payload.used,
                "remaining": payload.remaining,
                "exhausted": payload.exhausted,
            }
        elif isinstance(payload, NodeCapacity):
            if payload.deleted or payload.unschedulable or not payload.flavor:
                self.nodes.pop(payload.node, None)
            else:
                self.nodes[payload.node] = {"flavor": payload.flavor, "gpu": (payload.allocatable or {}).get(GPU, 0)}
        elif isinstance(payload, NamespaceLabels):
            if payload.deleted:
                self.namespaces.pop(payload.namespace, None)
            else:
                self.namespaces[payload.namespace] = {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": payload.namespace, "labels": dict(payload.labels)},
                }
                if payload.namespace in self._awaited:
                    self._awaited.pop(payload.namespace).set()

    async def run(self) -> None:
        """Read every partition from the beginning, then follow; caught_up at the end offsets."""
        # Only what apply() folds is validated: the rest of qm.cluster (pods, submissions) is
        # passed over once its type is read.
        self._follower = Follower(self._bootstrap, list(self._topics.values()), self.apply, self.caught_up,
                                  wanted=APPLIED, **self._fetch)
        await self._follower.run()

    async def read_past(self, topic: str, partition: int, offset: int, timeout_s: float) -> bool:
        """Wait until the replica has applied what was appended before that record of one of its
        topics (Follower.read_past); False if it could not within `timeout_s`."""
        if self._follower is None:
            return False
        return await self._follower.read_past(topic, partition, offset, timeout_s)
