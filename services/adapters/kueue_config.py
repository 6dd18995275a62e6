"""The active Kueue configuration, read from a directory of YAML (QM_CONFIG_DIR); shared by the
services that need queues and cohorts: admission (routing), queue-manager, preemption."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.contracts import yaml_documents
from services.core.quota import Objects, build_snapshot, load_objects


def load_config_dir(directory: str | Path) -> Objects:
    """Every Kueue document in the *.yaml / *.yml files of `directory` (not its subdirectories)."""
    return load_objects(
        (path, document)
        for path, document in yaml_documents.documents_in(directory)
        if isinstance(document, dict) and str(document.get("apiVersion", "")).startswith("kueue.x-k8s.io/")
    )


@dataclass(frozen=True)
class KueueConfig:
    """Kueue objects plus the lookups every event needs, computed once per config version."""

    objects: Objects
    root_of: dict[str, str] = field(default_factory=dict)  # ClusterQueue -> qm.workloads key

    @classmethod
    def from_objects(cls, objects: Objects) -> KueueConfig:
        snapshot = build_snapshot(objects, [])
        return cls(objects, {name: snapshot.root_name(name) for name in objects.cluster_queues})

    @classmethod
    def load(cls, directory: str | Path) -> KueueConfig:
        return cls.from_objects(load_config_dir(directory))

    def cluster_queue_of(self, namespace: str, queue_name: str | None) -> str | None:
        local = self.objects.local_queues.get((namespace, queue_name)) if queue_name else None
        return local.cluster_queue if local else None

    def routing_key(self, namespace: str, queue_name: str | None, cluster_queue: str | None = None) -> str | None:
        """The qm.workloads key of a workload: its cohort tree ("cohort:<root>"), or its
        ClusterQueue when that has no cohort. None when the queue is unknown."""
        cluster_queue = cluster_queue or self.cluster_queue_of(namespace, queue_name)
        return self.root_of.get(cluster_queue) if cluster_queue else None

    def cohort_keys(self) -> list[str]:
        return sorted(set(self.root_of.values()))

    def node_labels(self) -> dict[str, dict[str, str]]:
        """Flavor -> the node labels an admitted workload is pinned to."""
        return {name: dict(flavor.node_labels) for name, flavor in self.objects.flavors.items()}
