"""Precomputed, CEL-friendly views of the workload and the live tables.

Policies should not re-derive "how many GPUs does this Job ask for" in CEL every time;
the evaluator computes it once per request in Python and binds it as `workload`.
Live tables arrive in milli-units (as `qm.usage` publishes them); the views add whole-GPU
counts so messages read `used 28 GPU`.
"""

from __future__ import annotations

import math
from typing import Any

from services.core.quota.flavors import required_node_affinity
from services.policy.quantity import quantity_milli

GPU = "nvidia.com/gpu"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: The flavor the watcher's Admit put a Job on (services/watcher/actuate.py ANN_ADMITTED_FLAVOR)
ADMITTED_FLAVOR_ANNOTATION = "quartermaster.dev/admitted-flavor"
COST_CENTER_LABELS = ("quartermaster.dev/cost-center", "cost-center")


def _get(d: Any, *path: str, default: Any = None) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return default
        d = d.get(key)
    return default if d is None else d


def _container_milli(container: dict[str, Any]) -> dict[str, int]:
    res = container.get("resources") or {}
    requests = res.get("requests") or {}
    limits = res.get("limits") or {}
    out: dict[str, int] = {}
    for name in set(requests) | set(limits):
        raw = requests.get(name, limits.get(name))
        try:
            out[name] = quantity_milli(raw)
        except (ValueError, TypeError):
            continue
    return out


def pod_milli(pod_spec: dict[str, Any]) -> dict[str, int]:
    """Effective per-pod requests, Kubernetes' rule: max(sum(containers), max(init)) + overhead."""
    total: dict[str, int] = {}
    for c in pod_spec.get("containers") or []:
        for k, v in _container_milli(c).items():
            total[k] = total.get(k, 0) + v
    for c in pod_spec.get("initContainers") or []:
        for k, v in _container_milli(c).items():
            total[k] = max(total.get(k, 0), v)
    for k, raw in (pod_spec.get("overhead") or {}).items():
        try:
            total[k] = total.get(k, 0) + quantity_milli(raw)
        except (ValueError, TypeError):
            pass
    return total


def pod_sets(obj: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """(name, count, pod template spec) for the kinds Quartermaster admits."""
    kind = obj.get("kind", "")
    spec = obj.get("spec") or {}
    api = str(obj.get("apiVersion", ""))
    if kind == "Pod":
        return [("main", 1, spec)]
    if kind == "Job" and api.startswith("batch.volcano.sh"):
        return [
            (t.get("name", f"task-{i}"), int(t.get("replicas", 1)), _get(t, "template", "spec", default={}))
            for i, t in enumerate(spec.get("tasks") or [])
        ]
    if kind == "Job":
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        count = min(parallelism, int(completions)) if completions is not None else parallelism
        return [("main", count, _get(spec, "template", "spec", default={}))]
    if kind == "Workload":
        return [
            (ps.get("name", f"ps-{i}"), int(ps.get("count", 1)), _get(ps, "template", "spec", default={}))
            for i, ps in enumerate(spec.get("podSets") or [])
        ]
    if kind == "JobSet":
        out = []
        for rj in spec.get("replicatedJobs") or []:
            job_spec = _get(rj, "template", "spec", default={})
            per_job = int(job_spec.get("parallelism", 1))
            out.append(
                (
                    rj.get("name", "job"),
                    int(rj.get("replicas", 1)) * per_job,
                    _get(job_spec, "template", "spec", default={}),
                )
            )
        return out
    if kind in ("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob"):
        for key, replica_specs in spec.items():
            if key.endswith("ReplicaSpecs") and isinstance(replica_specs, dict):
                return [
                    (role, int(rs.get("replicas", 1)), _get(rs, "template", "spec", default={}))
                    for role, rs in replica_specs.items()
                ]
        return []
    if kind in ("Deployment", "StatefulSet", "ReplicaSet", "LeaderWorkerSet"):
        return [("main", int(spec.get("replicas", 1)), _get(spec, "template", "spec", default={}))]
    return []


def _node_labels(pod_spec: dict[str, Any], into: dict[str, list[str]]) -> None:
    """Add, per node label key, the values a pod of `pod_spec` may run on, as kube-scheduler
    reads them: the nodeSelector's value AND one of the required affinity's terms (terms are
    ORed; a term's `In` expressions on one key are ANDed). A key some term leaves free is free:
    the term can place the pod on any of its values, and a free key is not listed (as a key
    the pod never names). A nodeSelector of h100 with an affinity `In [a100, h100]` so lists
    h100 alone: the pod cannot land on an A100."""
    allowed: dict[str, list[str]] = {k: [str(v)] for k, v in (pod_spec.get("nodeSelector") or {}).items()}
    for key, values in _affinity_values(required_node_affinity(pod_spec)).items():
        chosen = allowed.get(key)
        allowed[key] = values if chosen is None else [v for v in chosen if v in values]
    for key, values in allowed.items():
        listed = into.setdefault(key, [])
        listed.extend(v for v in values if v not in listed)


def _affinity_values(terms: list[list[dict[str, Any]]]) -> dict[str, list[str]]:
    """Per key that every term (as `required_node_affinity` reads them) constrains with `In`,
    the values the terms allow together."""
    per_term = []
    for term in terms:
        values: dict[str, list[str]] = {}
        for requirement in term:
            if requirement["operator"] != "In":
                continue
            key, these = requirement["key"], requirement["values"]
            values[key] = these if key not in values else [v for v in values[key] if v in these]
        per_term.append(values)
    if not per_term:
        return {}
    out: dict[str, list[str]] = {}
    for key in per_term[0]:
        if all(key in values for values in per_term):
            merged = out.setdefault(key, [])
            for values in per_term:
                merged.extend(v for v in values[key] if v not in merged)
    return out


def _gpus(milli: int) -> int:
    return math.ceil(milli / 1000)


def workload_view(obj: dict[str, Any], namespace_object: dict[str, Any] | None = None) -> dict[str, Any]:
    """The workload's totals: `gpus`, `gpuMilli`, `resources` (milli), `podSets`, labels of interest."""
    sets = pod_sets(obj)
    totals: dict[str, int] = {}
    view_sets = []
    node_labels: dict[str, list[str]] = {}
    priority_class = ""
    for name, count, pod_spec in sets:
        per_pod = pod_milli(pod_spec or {})
        for k, v in per_pod.items():
            totals[k] = totals.get(k, 0) + v * count
        view_sets.append({"name": name, "count": count, "gpusPerPod": _gpus(per_pod.get(GPU, 0))})
        _node_labels(pod_spec or {}, node_labels)
        priority_class = priority_class or str((pod_spec or {}).get("priorityClassName", ""))
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Workload":
        priority_class = str(spec.get("priorityClassName", "")) or priority_class
        for psa in _get(obj, "status", "admission", "podSetAssignments", default=[]):
            for _res, flavor in (psa.get("flavors") or {}).items():
                node_labels.setdefault("kueue.x-k8s.io/flavor", [])
                if flavor not in node_labels["kueue.x-k8s.io/flavor"]:
                    node_labels["kueue.x-k8s.io/flavor"].append(flavor)
    # where the watcher's Admit put it (admission judges each flavor so, ADR 0070)
    admitted_flavor = (meta.get("annotations") or {}).get(ADMITTED_FLAVOR_ANNOTATION)
    if admitted_flavor:
        flavors = node_labels.setdefault("kueue.x-k8s.io/flavor", [])
        if admitted_flavor not in flavors:
            flavors.append(str(admitted_flavor))
    priority_class = str(labels.get(PRIORITY_LABEL, "")) or priority_class
    gpu_milli = totals.get(GPU, 0)
    return {
        "kind": obj.get("kind", ""),
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "gpus": _gpus(gpu_milli),
        "gpuMilli": gpu_milli,
        "resources": totals,
        "podSets": view_sets,
        "podCount": sum(c for _n, c, _s in sets),
        "queueName": str(labels.get(QUEUE_LABEL, "") or spec.get("queueName", "")),
        "priorityClass": priority_class,
        "costCenter": cost_center_of(obj, namespace_object),
        "nodeLabels": node_labels,
    }


def cost_center_of(obj: dict[str, Any], namespace_object: dict[str, Any] | None) -> str:
    """The workload's cost center: its own label, else its namespace's label, else ''."""
    for source in (obj, namespace_object or {}):
        labels = _get(source, "metadata", "labels", default={})
        for key in COST_CENTER_LABELS:
            if labels.get(key):
                return str(labels[key])
    return ""


def usage_view(usage: dict[str, Any] | None, namespace: str = "") -> dict[str, Any]:
    """`qm.usage` record plus GPU counts: `gpus`, `reservedGpus`, `runningGpus`, `flavors[f].gpus`."""
    usage = usage or {}
    reserved = usage.get("reserved") or {}
    running = usage.get("running") or {}
    total = usage.get("total") or {}
    if not total:
        total = {}
        for table in (reserved, running):
            for per_flavor in table.values():
                for k, v in per_flavor.items():
                    total[k] = total.get(k, 0) + int(v)
    flavors: dict[str, Any] = {}
    for flavor in set(reserved) | set(running):
        r = int((reserved.get(flavor) or {}).get(GPU, 0))
        u = int((running.get(flavor) or {}).get(GPU, 0))
        flavors[flavor] = {"gpus": _gpus(r + u), "reservedGpus": _gpus(r), "runningGpus": _gpus(u)}
    reserved_gpu = sum(int((v or {}).get(GPU, 0)) for v in reserved.values())
    running_gpu = sum(int((v or {}).get(GPU, 0)) for v in running.values())
    return {
        **usage,
        "namespace": usage.get("namespace", namespace),
        "reserved": reserved,
        "running": running,
        "total": total,
        "gpus": _gpus(int(total.get(GPU, 0))),
        "gpuMilli": int(total.get(GPU, 0)),
        "reservedGpus": _gpus(reserved_gpu),
        "runningGpus": _gpus(running_gpu),
        "flavors": flavors,
        "known": bool(usage),
    }


def budget_view(budget: dict[str, Any] | None) -> dict[str, Any]:
    """`qm.budgets` record; unknown budget → `known: false, exhausted: false`."""
    budget = budget or {}
    view = {
        "costCenter": "",
        "period": "",
        "limit": "0",
        "used": "0",
        "remaining": "0",
        "unit": "",
        "exhausted": False,
        **budget,
        "known": bool(budget),
    }
    for key in ("limit", "used", "remaining"):
        view[key] = str(view[key])
    view["exhausted"] = bool(view["exhausted"])
    return view


def cluster_view(cluster: dict[str, Any] | None) -> dict[str, Any]:
    """Cluster-wide signals (services.core.quota.dynamic.cluster_signals: gpuUtilization in 0..1,
    gpuCapacity, gpuInUse, ...); the defaults keep expressions total before any signal arrived."""
    return {"gpuUtilization": 0.0, "gpuCapacity": 0, "gpuInUse": 0, "gpuReserved": 0, "gpuRunning": 0,
            "byFlavor": {}, **(cluster or {})}
