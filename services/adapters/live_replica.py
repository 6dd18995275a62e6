"""Read-only replicas for admission (and cost):  live usage (qm.usage), budgets (qm.budgets) and
namespace labels (namespace.labels.v1 on qm.cluster), kept current by a consumer that reads
every partition without a consumer group, so each admission replica sees everything.

It is the webhook's `LiveState` too: both paths evaluate against the same replica.
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.adapters.bus import follow
from services.contracts.events import BudgetStatus, NamespaceLabels, UsageSnapshot


class LiveReplica:
    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        """`topics`: logical name (qm.usage, qm.budgets, qm.cluster) -> actual (prefixed) name."""
        self._bootstrap = bootstrap
        self._topics = topics
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.usages: dict[str, dict[str, Any]] = {}
        self.budgets: dict[str, dict[str, Any]] = {}
        self.caught_up = asyncio.Event()

    # -- LiveState --------------------------------------------------------------------
    def namespace(self, name: str) -> dict[str, Any] | None:
        return self.namespaces.get(name)

    def usage(self, namespace: str) -> dict[str, Any] | None:
        return self.usages.get(namespace)

    def budget(self, cost_center: str) -> dict[str, Any] | None:
        return self.budgets.get(cost_center)

    def cluster(self) -> dict[str, Any] | None:
        return None

    def ready(self) -> bool:
        return self.caught_up.is_set()

    # -- folding ----------------------------------------------------------------------
    def apply(self, payload: Any) -> None:
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
        elif isinstance(payload, NamespaceLabels):
            if payload.deleted:
                self.namespaces.pop(payload.namespace, None)
            else:
                self.namespaces[payload.namespace] = {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": payload.namespace, "labels": dict(payload.labels)},
                }

    async def run(self) -> None:
        """Read every partition from the beginning, then follow; caught_up at the end offsets."""
        await follow(self._bootstrap, list(self._topics.values()), self.apply, self.caught_up)
