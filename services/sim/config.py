"""The simulated cluster's Kueue configuration, generated from a trace's node list.

Conventions (the simulator, the demo and `qm explain` rely on them):

* Every team namespace has one LocalQueue ``lq-<namespace>`` pointing at one ClusterQueue
  ``cq-<namespace>``. The ClusterQueues sit in two cohorts (``research`` and ``product``,
  alternating over the namespaces) so teams can borrow from each other.
* ResourceFlavors: ``cpu-flavor`` (no node labels; quota for ``cpu`` and ``memory`` of every
  node) and one per GPU model, ``<model lower-case>-flavor`` with the node label
  ``gpu.nvidia.com/class: <model lower-case>`` (the trace's own flavor names, see
  services.trace.alibaba.flavor_for).
* Each ClusterQueue has two resource groups: ``[cpu, memory]`` on ``cpu-flavor`` and
  ``[nvidia.com/gpu]`` on the GPU flavors, largest fleet first. Nominal quota is the fleet's
  capacity × ``quota_scale`` split evenly over the teams, in milli-units (a fractional GPU
  request of 460 milli counts 460 against it, exactly as Kueue counts ``nvidia.com/gpu``);
  the split never adds up to more than the fleet. ``borrowingLimit`` is
  ``borrow_factor`` × nominal (default 3, so an 8-GPU gang fits by borrowing from the cohort;
  none when ``borrow_factor`` is None).

Pure functions build the objects; :func:`write_kueue_config` writes them as YAML for
``QM_CONFIG_DIR``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from services.core.quantity import format_milli
from services.trace.alibaba import TEAM_NAMESPACES, TraceNode, flavor_for

__all__ = [
    "CPU_FLAVOR",
    "GPU_CLASS_LABEL",
    "QUEUE_LABEL",
    "SimQueues",
    "build_kueue_objects",
    "cluster_queue_name",
    "cohort_for",
    "fleet_capacity",
    "local_queue_name",
    "synthetic_nodes",
    "team_quotas",
    "write_kueue_config",
]

QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
GPU_CLASS_LABEL: Final = "gpu.nvidia.com/class"
CPU_FLAVOR: Final = "cpu-flavor"
GPU: Final = "nvidia.com/gpu"
MIB_MILLI: Final = 2**20 * 1000
COHORTS: Final = ("research", "product")

#: A small heterogeneous fleet with the Alibaba trace's GPU models and node shapes
#: (model, GPUs per node, nodes, CPU cores per node, memory GiB per node).
_SYNTHETIC_FLEET: Final = (
    ("G2", 8, 3, 96, 512),
    ("T4", 2, 6, 64, 256),
    ("P100", 2, 2, 64, 256),
    ("V100M16", 8, 1, 96, 512),
    ("V100M32", 8, 1, 96, 512),
    ("G3", 8, 1, 96, 512),
    ("A10", 1, 2, 32, 128),
)


def local_queue_name(namespace: str) -> str:
    return f"lq-{namespace}"


def cluster_queue_name(namespace: str) -> str:
    return f"cq-{namespace}"


def cohort_for(namespace: str, namespaces: Sequence[str] = TEAM_NAMESPACES) -> str:
    index = list(namespaces).index(namespace) if namespace in namespaces else 0
    return COHORTS[index % len(COHORTS)]


def synthetic_nodes() -> list[TraceNode]:
    """The default fleet for the synthetic trace: 64 GPUs of 7 models on 16 nodes."""
    nodes = []
    for model, gpus, count, cores, gib in _SYNTHETIC_FLEET:
        for index in range(count):
            nodes.append(TraceNode(f"sim-{model.lower()}-{index}", cores * 1000, gib * 1024, gpus, model))
    return nodes


def fleet_capacity(nodes: Sequence[TraceNode]) -> dict[str, dict[str, int]]:
    """flavor -> resource -> milli-units over the fleet (GPUs by model, CPU/memory on cpu-flavor)."""
    capacity: dict[str, dict[str, int]] = {CPU_FLAVOR: {"cpu": 0, "memory": 0}}
    for node in nodes:
        capacity[CPU_FLAVOR]["cpu"] += node.cpu_milli
        capacity[CPU_FLAVOR]["memory"] += node.memory_mib * MIB_MILLI
        if node.gpu_count > 0 and node.gpu_model:
            flavor = flavor_for(node.gpu_count, (node.gpu_model,))
            by_res = capacity.setdefault(flavor, {GPU: 0})
            by_res[GPU] += node.gpu_count * 1000
    return capacity


def _gpu_flavors(capacity: dict[str, dict[str, int]]) -> list[str]:
    """GPU flavors, largest fleet first (ties by name): the order Kueue tries them in."""
    return sorted((f for f in capacity if f != CPU_FLAVOR), key=lambda f: (-capacity[f][GPU], f))


def team_quotas(
    capacity: dict[str, dict[str, int]], teams: int, quota_scale: float = 1.0
) -> dict[str, dict[str, int]]:
    """flavor -> resource -> nominal milli-units per team: capacity × scale / teams, rounded down
    to a whole milli-unit (memory to a whole MiB) so the teams' sum never exceeds the fleet."""
    quotas: dict[str, dict[str, int]] = {}
    for flavor, by_res in capacity.items():
        for resource, amount in by_res.items():
            share = int(amount * quota_scale) // teams
            if resource == "memory":
                share -= share % MIB_MILLI
            quotas.setdefault(flavor, {})[resource] = share
    return quotas


@dataclass(frozen=True, slots=True)
class SimQueues:
    """Where each namespace's workloads go: its LocalQueue, ClusterQueue and cohort."""

    local_queue: dict[str, str]
    cluster_queue: dict[str, str]
    cohort: dict[str, str]
    flavor_order: tuple[str, ...]
    nominal: dict[str, dict[str, int]]  # per team, flavor -> resource -> milli


def _quantity(milli: int, resource: str) -> str:
    return format_milli(milli, resource)


def build_kueue_objects(
    nodes: Sequence[TraceNode],
    namespaces: Sequence[str] = TEAM_NAMESPACES,
    *,
    quota_scale: float = 1.0,
    borrow_factor: float | None = 3.0,
) -> tuple[list[dict[str, Any]], SimQueues]:
    """Kueue objects (plain dicts, ready for YAML) and the queue mapping for the simulator."""
    capacity = fleet_capacity(nodes)
    quotas = team_quotas(capacity, len(namespaces), quota_scale)
    gpu_flavors = _gpu_flavors(capacity)
    objects: list[dict[str, Any]] = [
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": CPU_FLAVOR}, "spec": {}}
    ]
    for flavor in gpu_flavors:
        model = flavor.removesuffix("-flavor")
        objects.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {"nodeLabels": {GPU_CLASS_LABEL: model}},
            }
        )

    def resource(flavor: str, name: str) -> dict[str, Any]:
        nominal = quotas[flavor][name]
        entry: dict[str, Any] = {"name": name, "nominalQuota": _quantity(nominal, name)}
        if borrow_factor is not None:
            limit = int(nominal * borrow_factor)
            if name == "memory":
                limit -= limit % MIB_MILLI
            entry["borrowingLimit"] = _quantity(limit, name)
        return entry

    for namespace in namespaces:
        groups = [
            {
                "coveredResources": ["cpu", "memory"],
                "flavors": [{"name": CPU_FLAVOR, "resources": [resource(CPU_FLAVOR, "cpu"), resource(CPU_FLAVOR, "memory")]}],
            }
        ]
        if gpu_flavors:
            groups.append(
                {
                    "coveredResources": [GPU],
                    "flavors": [{"name": f, "resources": [resource(f, GPU)]} for f in gpu_flavors],
                }
            )
        objects.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "ClusterQueue",
                "metadata": {"name": cluster_queue_name(namespace)},
                "spec": {
                    "cohort": cohort_for(namespace, namespaces),
                    "namespaceSelector": {},
                    "queueingStrategy": "BestEffortFIFO",
                    "resourceGroups": groups,
                    "preemption": {
                        "reclaimWithinCohort": "Any",
                        "withinClusterQueue": "LowerPriority",
                    },
                },
            }
        )
        objects.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "LocalQueue",
                "metadata": {"name": local_queue_name(namespace), "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue_name(namespace)},
            }
        )
    queues = SimQueues(
        local_queue={ns: local_queue_name(ns) for ns in namespaces},
        cluster_queue={ns: cluster_queue_name(ns) for ns in namespaces},
        cohort={ns: cohort_for(ns, namespaces) for ns in namespaces},
        flavor_order=(CPU_FLAVOR, *gpu_flavors),
        nominal=quotas,
    )
    return objects, queues


def write_kueue_config(
    directory: str | Path,
    nodes: Sequence[TraceNode] | None = None,
    namespaces: Sequence[str] = TEAM_NAMESPACES,
    *,
    quota_scale: float = 1.0,
    borrow_factor: float | None = 3.0,
) -> Path:
    """Write ``kueue.yaml`` into ``directory`` (created if missing); returns the file's path.
    ``nodes`` defaults to :func:`synthetic_nodes`."""
    objects, _ = build_kueue_objects(
        nodes if nodes is not None else synthetic_nodes(), namespaces, quota_scale=quota_scale,
        borrow_factor=borrow_factor,
    )
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    path = target / "kueue.yaml"
    header = "# Generated by services/sim/config.py for the trace-driven cluster simulator.\n"
    path.write_text(header + yaml.safe_dump_all(objects, sort_keys=False))
    return path
