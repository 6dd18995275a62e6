"""Pure translation for the bus path: a submitted workload -> the Kubernetes object policies
see, and an admission decision -> the events the queue-manager and on-call read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.contracts.events import WorkloadPending, WorkloadRejected, WorkloadSubmitted, WorkloadValidated
from services.core.quantity import format_milli

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _resources(requests: dict[str, int]) -> dict[str, str]:
    return {res: format_milli(milli, res) for res, milli in requests.items()}


def kubernetes_object(w: WorkloadSubmitted) -> dict[str, Any]:
    """The object as the API server would show it: a batch/v1 Job for one-pod-set Jobs, else a
    Kueue Workload; requests become quantities again (GPU as limits too, as device plugins need)."""
    metadata = {
        "name": w.name,
        "namespace": w.namespace,
        "uid": w.uid,
        "labels": dict(w.labels or {}),
        "annotations": dict(w.annotations or {}),
        "creationTimestamp": w.created_at,
    }

    def pod_spec(ps: dict[str, Any]) -> dict[str, Any]:
        quantities = _resources(ps["requests"])
        limits = {r: q for r, q in quantities.items() if "/" in r}  # extended resources
        spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": quantities, "limits": limits}}]}
        if ps.get("node_selector"):
            spec["nodeSelector"] = dict(ps["node_selector"])
        if ps.get("tolerations"):
            spec["tolerations"] = [dict(t) for t in ps["tolerations"]]
        if ps.get("node_affinity"):
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [dict(r) for r in term]} for term in ps["node_affinity"]]}}}
        return spec

    if w.kind == "Job" and len(w.pod_sets) == 1:
        ps = w.pod_sets[0]
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": metadata,
            "spec": {
                "parallelism": ps["count"],
                "completions": ps["count"],
                "suspend": True,
                "template": {"spec": pod_spec(ps)},
            },
        }
    spec: dict[str, Any] = {
        "queueName": w.queue_name,
        "podSets": [
            {"name": ps["name"], "count": ps["count"], **({"minCount": ps["min_count"]} if ps.get("min_count") else {}),
             "template": {"spec": pod_spec(ps)}}
            for ps in w.pod_sets
        ],
    }
    if w.priority_class:
        spec["priorityClassName"] = w.priority_class
    if w.priority is not None:
        spec["priority"] = w.priority
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "metadata": metadata, "spec": spec}


def priority_of(w: WorkloadSubmitted, priority_classes: Mapping[str, int]) -> tuple[int, str | None]:
    """The workload's priority, as Kueue sets it (and `qm simulate` reads it): the value of its
    priority class (a WorkloadPriorityClass named by the kueue.x-k8s.io/priority-class label, or
    the pods' PriorityClass) when that is configured, else the value it carries, else 0. With a
    warning when the class is not configured and no value was given (ADR 0066)."""
    if w.priority_class and w.priority_class in priority_classes:
        return priority_classes[w.priority_class], None
    if w.priority is not None:
        return w.priority, None
    if w.priority_class:
        return 0, (f"priority class {w.priority_class} is not configured (no WorkloadPriorityClass or PriorityClass "
                   "of that name): priority 0")
    return 0, None


def validated(w: WorkloadSubmitted, cluster_queue: str, cohort: str | None, warnings: tuple[str, ...],
              priority_classes: Mapping[str, int], refused_flavors: Mapping[str, str] | None = None) -> WorkloadValidated:
    """`refused_flavors`: flavor -> why the policies refuse the workload there (ADR 0070), on
    every pod set, where the queue-manager's flavor assignment reads it."""
    priority, unknown = priority_of(w, priority_classes)
    pod_sets = w.pod_sets
    if refused_flavors:
        pod_sets = [{**ps, "refused_flavors": dict(refused_flavors)} for ps in pod_sets]
    return WorkloadValidated(
        uid=w.uid, namespace=w.namespace, name=w.name, queue_name=w.queue_name or "",
        cluster_queue=cluster_queue, cohort=cohort, priority=priority, priority_class=w.priority_class,
        pod_sets=pod_sets, labels=w.labels, created_at=w.created_at,
        warnings=[*warnings, unknown] if unknown else list(warnings),
    )


def rejected(w: WorkloadSubmitted, violations) -> WorkloadRejected:
    items = [{"policy": v.policy, "enforcement_action": str(v.enforcement_action), "message": v.message}
             for v in violations]
    return WorkloadRejected(
        uid=w.uid, namespace=w.namespace, name=w.name, violations=items,
        message="; ".join(f"[{v['policy']}] {v['message']}" for v in items if v["enforcement_action"] == "deny"),
    )


def not_in_a_queue(w: WorkloadSubmitted) -> WorkloadPending:
    """Kueue's wording for a workload whose LocalQueue does not exist."""
    if not w.queue_name:
        message = f"workload has no {QUEUE_LABEL} label: add it to join a LocalQueue in namespace {w.namespace}"
    else:
        message = f"LocalQueue {w.queue_name} doesn't exist in namespace {w.namespace}: create it or fix the {QUEUE_LABEL} label"
    return WorkloadPending(uid=w.uid, namespace=w.namespace, name=w.name, cluster_queue=None,
                           reason="Inadmissible", message=message)
