"""Dynamic quota, the pure half: what the cluster looks like now (signals) and a config with
some ClusterQueues' borrowingLimits replaced by the values the rules chose.

The rules themselves are CEL (`services.policy.quota_rules`); everything here is arithmetic
over the facts events carry, so a replay of the same events gives the same limits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from services.core.quota.model import Objects

GPU = "nvidia.com/gpu"

#: (ClusterQueue, flavor, resource) -> borrowingLimit in milli-units (None: unlimited)
LimitKey = tuple[str, str, str]


def nominal_capacity(objects: Objects, resource: str = GPU) -> dict[str, int]:
    """Flavor -> the sum of every ClusterQueue's nominal quota of `resource` (milli): the
    capacity the config promises, used where no node of a flavor has been seen."""
    totals: dict[str, int] = {}
    for cq in objects.cluster_queues.values():
        for group in cq.resource_groups:
            for flavor in group.flavors:
                for quota in flavor.resources:
                    if quota.resource == resource:
                        totals[flavor.flavor] = totals.get(flavor.flavor, 0) + quota.nominal
    return totals


def cluster_signals(nodes: Mapping[str, Mapping[str, Any]], usages: Iterable[Mapping[str, Any]],
                    objects: Objects) -> dict[str, Any]:
    """GPU capacity, use and utilization of the whole cluster and per flavor, in GPUs.

    `nodes`: node -> {"flavor", "gpu" (allocatable milli)} of schedulable nodes;
    `usages`: the latest qm.usage record of every namespace (reserved / running, flavor ->
    resource -> milli). A flavor's capacity is its nodes' GPUs; with no node of it known,
    the nominal quota all ClusterQueues hold of it (`capacitySource` says which)."""
    from_nodes: dict[str, int] = {}
    for node in nodes.values():
        if node.get("flavor"):
            from_nodes[node["flavor"]] = from_nodes.get(node["flavor"], 0) + int(node.get("gpu") or 0)
    promised = nominal_capacity(objects)
    reserved: dict[str, int] = {}
    running: dict[str, int] = {}
    for usage in usages:
        for target, by_flavor in ((reserved, usage.get("reserved") or {}), (running, usage.get("running") or {})):
            for flavor, by_resource in by_flavor.items():
                amount = int((by_resource or {}).get(GPU, 0))
                if amount:
                    target[flavor] = target.get(flavor, 0) + amount
    flavors = sorted(set(from_nodes) | set(promised) | set(reserved) | set(running))
    by_flavor = {}
    for flavor in flavors:
        capacity = from_nodes.get(flavor, promised.get(flavor, 0))
        by_flavor[flavor] = _figures(capacity, reserved.get(flavor, 0), running.get(flavor, 0))
        by_flavor[flavor]["capacitySource"] = "nodes" if flavor in from_nodes else "quota"
    whole = _figures(sum(from_nodes.get(f, promised.get(f, 0)) for f in flavors),
                     sum(reserved.values()), sum(running.values()))
    sources = {figures["capacitySource"] for figures in by_flavor.values()}
    return {
        "gpuCapacity": whole["capacity"], "gpuReserved": whole["reserved"], "gpuRunning": whole["running"],
        "gpuInUse": whole["inUse"], "gpuUtilization": whole["utilization"],
        "capacitySource": sources.pop() if len(sources) == 1 else ("mixed" if sources else "none"),
        "byFlavor": by_flavor,
    }


def _figures(capacity: int, reserved: int, running: int) -> dict[str, Any]:
    in_use = reserved + running
    return {
        "capacity": capacity / 1000, "reserved": reserved / 1000, "running": running / 1000,
        "inUse": in_use / 1000,
        # GPUs held (reserved or running) per GPU that exists; 1.0 when nothing exists at all.
        "utilization": round(in_use / capacity, 6) if capacity else 1.0,
    }


def static_borrowing_limit(objects: Objects, key: LimitKey) -> tuple[bool, int | None]:
    """(found, the configured borrowingLimit) of one (ClusterQueue, flavor, resource)."""
    cq_name, flavor_name, resource = key
    cq = objects.cluster_queues.get(cq_name)
    for group in cq.resource_groups if cq else ():
        for flavor in group.flavors:
            if flavor.flavor != flavor_name:
                continue
            for quota in flavor.resources:
                if quota.resource == resource:
                    return True, quota.borrowing_limit
    return False, None


def with_borrowing_limits(objects: Objects, limits: Mapping[LimitKey, int | None]) -> Objects:
    """`objects` with the borrowingLimit of each (ClusterQueue, flavor, resource) in `limits`
    replaced; everything else (nominal, lendingLimit, other queues) as configured."""
    if not limits:
        return objects
    queues = dict(objects.cluster_queues)
    for cq_name in {key[0] for key in limits}:
        cq = queues.get(cq_name)
        if cq is None:
            continue
        groups = []
        for group in cq.resource_groups:
            flavors = []
            for flavor in group.flavors:
                resources = tuple(
                    dataclasses.replace(quota, borrowing_limit=limits[(cq_name, flavor.flavor, quota.resource)])
                    if (cq_name, flavor.flavor, quota.resource) in limits else quota
                    for quota in flavor.resources
                )
                flavors.append(dataclasses.replace(flavor, resources=resources))
            groups.append(dataclasses.replace(group, flavors=tuple(flavors)))
        queues[cq_name] = dataclasses.replace(cq, resource_groups=tuple(groups))
    return dataclasses.replace(objects, cluster_queues=queues)
