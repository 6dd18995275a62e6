"""The active Kueue configuration for the queue-manager, read from a directory of YAML."""

from __future__ import annotations

from pathlib import Path

import yaml

from services.core.quota import Objects, build_snapshot, load_objects


def load_config_dir(directory: str | Path) -> Objects:
    """Every Kueue document in the *.yaml / *.yml files of `directory` (not its subdirectories)."""
    documents = []
    for path in sorted(Path(directory).glob("*.y*ml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and str(document.get("apiVersion", "")).startswith("kueue.x-k8s.io/"):
                documents.append((str(path), document))
    return load_objects(documents)


def routing_key(objects: Objects, namespace: str, queue_name: str | None, cluster_queue: str | None = None) -> str | None:
    """The qm.workloads key of a workload: its cohort tree ("cohort:<root>"), or its
    ClusterQueue when that has no cohort. None when the queue is unknown."""
    snapshot = build_snapshot(objects, [])
    if cluster_queue is None and queue_name is not None:
        local = objects.local_queues.get((namespace, queue_name))
        cluster_queue = local.cluster_queue if local else None
    if cluster_queue is None or cluster_queue not in objects.cluster_queues:
        return None
    return snapshot.root_name(cluster_queue)


def cohort_keys(objects: Objects) -> list[str]:
    snapshot = build_snapshot(objects, [])
    return sorted({snapshot.root_name(name) for name in objects.cluster_queues})


def flavor_node_labels(objects: Objects) -> dict[str, dict[str, str]]:
    return {name: dict(flavor.node_labels) for name, flavor in objects.flavors.items()}
