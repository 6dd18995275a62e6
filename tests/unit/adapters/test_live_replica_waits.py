"""LiveReplica.namespace_soon: the webhook's wait for a namespace the watcher has not reported yet
(ADR 0040). The replica is never run: the tests apply what the watcher would report."""

from __future__ import annotations

import asyncio

from services.adapters.live_replica import LiveReplica
from services.contracts.events import NamespaceLabels


async def test_a_namespace_reported_during_the_wait_ends_every_wait_for_it():
    replica = LiveReplica("127.0.0.1:1", {})

    async def reported_soon() -> None:
        await asyncio.sleep(0.05)
        replica.apply(NamespaceLabels(namespace="fresh", labels={"team": "ml"}))

    reporting = asyncio.create_task(reported_soon())
    first, second = await asyncio.gather(replica.namespace_soon("fresh", 5), replica.namespace_soon("fresh", 5))
    await reporting
    assert first == second and first["metadata"]["labels"] == {"team": "ml"}
    assert replica._awaited == {} and not replica._waiters


async def test_a_namespace_never_reported_leaves_nothing_behind_once_its_waits_end():
    """With the watcher down, reviews in ever new namespaces each wait and are refused; the
    replica must not keep a waiting Event per namespace for the rest of its life."""
    replica = LiveReplica("127.0.0.1:1", {})
    early = asyncio.create_task(replica.namespace_soon("never", 0.05))
    late = asyncio.create_task(replica.namespace_soon("never", 0.2))
    assert await early is None
    assert "never" in replica._awaited  # the later review still waits for it
    assert await late is None
    others = await asyncio.gather(*(replica.namespace_soon(f"new-{i}", 0.01) for i in range(50)))
    assert others == [None] * 50
    assert replica._awaited == {} and not replica._waiters
    replica.apply(NamespaceLabels(namespace="never", labels={}))  # arriving after every wait: no error
    assert await replica.namespace_soon("never", 0.01) == {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": "never", "labels": {}}}
