"""Policies judged where a workload would run (ADR 0070). Pure.

A policy such as "only approved projects may use A100s" reads where the workload runs: its
nodeSelector, or the flavor it was admitted to. A Job that names no GPU class has neither
when admission judges it, and the queue-manager picks its flavor afterwards. So admission
also judges the workload as it would be once admitted to each flavor its ClusterQueue could
give it (the flavor's nodeLabels merged into its pods' nodeSelector, the flavor's name on it,
as the watcher's Admit leaves the Job). Flavors the policies refuse travel with the verdict,
and the queue-manager never assigns them. A workload whose every flavor for some resource
is refused can never run in its queue, and is refused outright.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from services.core.quota.flavors import (
    flavor_matches_selector,
    node_affinity_of,
    pod_tolerations,
    required_node_affinity,
    tolerations_of,
    untolerated_taint,
)
from services.core.quota.model import ClusterQueue, Objects, ResourceGroup
from services.policy import PolicySet, placement_sensitive
from services.policy.views import ADMITTED_FLAVOR_ANNOTATION, pod_milli, pod_sets


@dataclass(frozen=True)
class Refusal:
    """A flavor the policies refuse this workload, with their words."""

    flavor: str
    violations: tuple[Any, ...]  # services.policy.evaluate.Violation, the denying ones

    @property
    def message(self) -> str:
        return "; ".join(v.render() for v in self.violations)


@dataclass(frozen=True)
class Judgement:
    refused: tuple[Refusal, ...] = ()
    # (pod set, resource, the flavors offered) for which every flavor is refused: never admissible
    dead_ends: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def refused_flavors(self) -> dict[str, str]:
        return {r.flavor: r.message for r in self.refused}


def _group_of(cq: ClusterQueue, resource: str) -> ResourceGroup | None:
    for rg in cq.resource_groups:
        if resource in rg.covered_resources:
            return rg
    return None


def _offers(objects: Objects, cluster_queue: str, pod_sets: Iterable[dict]
            ) -> list[tuple[str, str, list[tuple[str, str | None]]]]:
    """(pod set, resource, [(flavor, why it is not offered, or None)]) for each resource a pod
    set requests, over the flavors of the queue's resource group for it, in the queue's order:
    the flavor assigner's own checks (the nodeSelector and required node affinity, the taints)."""
    cq = objects.cluster_queues.get(cluster_queue)
    if cq is None:
        return []
    out = []
    for ps in pod_sets:
        selector = tuple(sorted((ps.get("node_selector") or {}).items()))
        affinity = node_affinity_of(ps.get("node_affinity"))
        tolerations = tolerations_of(ps.get("tolerations"))
        for resource, milli in sorted(ps["requests"].items()):
            rg = _group_of(cq, resource) if milli else None
            if rg is None:
                continue
            flavors = []
            for fq in rg.flavors:
                flavor = objects.flavors.get(fq.flavor)
                if flavor is None:
                    why: str | None = "flavor not found"
                elif not flavor_matches_selector(flavor, selector, objects.flavors, rg, affinity):
                    why = "doesn't match the pods' nodeSelector or required node affinity"
                elif (taint := untolerated_taint(flavor, tolerations)) is not None:
                    why = f"untolerated taint {taint}"
                else:
                    why = None
                flavors.append((fq.flavor, why))
            out.append((ps["name"], resource, flavors))
    return out


def offered_flavors(objects: Objects, cluster_queue: str, pod_sets: Iterable[dict]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(pod set, resource, flavors) for each resource a pod set requests: the flavors of the
    queue's resource group for it that the pod set may be given, in the queue's order."""
    out = []
    for ps_name, resource, flavors in _offers(objects, cluster_queue, pod_sets):
        names = tuple(name for name, why in flavors if why is None)
        if names:
            out.append((ps_name, resource, names))
    return out


def placed(obj: dict[str, Any], flavor: str, node_labels: dict[str, str],
           serves: dict[str, list[str]]) -> dict[str, Any]:
    """The object as the watcher's Admit would leave it on `flavor`: the flavor's nodeLabels in
    the nodeSelector of the pod sets it serves (`serves`: pod set -> its resources the flavor
    would hold), its name in an annotation (and, on a Kueue Workload, in status.admission)."""
    # copies of only the parts changed (a deep copy was most of judging a flavor)
    meta = obj.get("metadata") or {}
    out = {**obj, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}),
                                                       ADMITTED_FLAVOR_ANNOTATION: flavor}}}
    spec = obj.get("spec") or {}
    if str(obj.get("apiVersion", "")).startswith("batch.volcano.sh"):
        out["spec"] = {**spec, "tasks": [
            _with_selector(t, node_labels) if t.get("name") in serves else t for t in spec.get("tasks") or []]}
    elif obj.get("kind") == "Workload":
        out["spec"] = {**spec, "podSets": [
            _with_selector(ps, node_labels) if ps.get("name") in serves else ps for ps in spec.get("podSets") or []]}
        out["status"] = {"admission": {"podSetAssignments": [
            {"name": name, "flavors": dict.fromkeys(resources, flavor)} for name, resources in sorted(serves.items())]}}
    else:
        out["spec"] = _with_selector(spec, node_labels)
    return out


def _with_selector(holder: dict[str, Any], node_labels: dict[str, str]) -> dict[str, Any]:
    """`holder` (a Job's spec, a pod set) with node_labels merged into its pod template's nodeSelector."""
    template = holder.get("template") or {}
    pod_spec = template.get("spec") or {}
    return {**holder, "template": {**template, "spec": {
        **pod_spec, "nodeSelector": {**(pod_spec.get("nodeSelector") or {}), **node_labels}}}}


def pod_sets_of(obj: dict[str, Any]) -> list[dict]:
    """A Kubernetes object's pod sets as `workload.submitted.v1` carries them (for the webhook,
    which judges the object itself)."""
    out = []
    for name, count, pod_spec in pod_sets(obj):
        ps: dict[str, Any] = {"name": name, "count": count, "requests": pod_milli(pod_spec or {})}
        if (pod_spec or {}).get("nodeSelector"):
            ps["node_selector"] = {str(k): str(v) for k, v in pod_spec["nodeSelector"].items()}
        terms = required_node_affinity(pod_spec or {})
        if terms:
            ps["node_affinity"] = terms
        tolerations = pod_tolerations(pod_spec or {})
        if tolerations:
            ps["tolerations"] = tolerations
        out.append(ps)
    return out


def judge(
    judge_object: Callable[[dict[str, Any], frozenset[int]], Any],
    policy_set: PolicySet,
    obj: dict[str, Any],
    objects: Objects,
    cluster_queue: str,
    pod_sets: list[dict],
) -> Judgement:
    """Each flavor the queue could give the workload, judged on the object as it would be
    admitted there by `judge_object(object, only)`: the policies' evaluate, bound to the
    request's live state, for the policies whose indexes are in `only` (those of the set that
    can read a placement; the others judged the workload already, and a placement does not
    change what they read)."""
    sensitive = placement_sensitive(policy_set)
    if not sensitive:
        return Judgement()
    offered = offered_flavors(objects, cluster_queue, pod_sets)
    serves: dict[str, dict[str, list[str]]] = {}  # flavor -> pod set -> resources
    for ps_name, resource, names in offered:
        for name in names:
            serves.setdefault(name, {}).setdefault(ps_name, []).append(resource)
    refused = []
    for name in sorted(serves):
        decision = judge_object(placed(obj, name, dict(objects.flavors[name].node_labels), serves[name]), sensitive)
        if not decision.allowed:
            refused.append(Refusal(name, decision.denials))
    if not refused:
        return Judgement()
    names_refused = {r.flavor for r in refused}
    dead_ends = tuple((ps, res, names) for ps, res, names in offered if names_refused.issuperset(names))
    return Judgement(tuple(refused), dead_ends)


def dead_end_violations(judgement: Judgement, cluster_queue: str) -> list[Any]:
    """The refusals that leave the workload nowhere to run, each saying so: the rejection's words."""
    by_flavor = {r.flavor: r for r in judgement.refused}
    out = []
    seen: set[str] = set()
    for ps, resource, names in judgement.dead_ends:
        for name in names:
            if name in seen:
                continue
            seen.add(name)
            where = (f"if admitted to flavor {name}; ClusterQueue {cluster_queue} offers {resource} to pod set "
                     f"{ps} only on {', '.join(names)}, and the policies refuse each")
            out += [dataclasses.replace(v, message=f"{v.message} ({where})") for v in by_flavor[name].violations]
    return out


@dataclass(frozen=True)
class FlavorRow:
    """One flavor of the workload's queue, for one pod set and resource, and what became of it."""

    pod_set: str
    resource: str
    flavor: str
    verdict: str  # "allowed", "refused by policy", "not offered"
    why: str = ""


def flavor_rows(
    judge_object: Callable[[dict[str, Any], frozenset[int]], Any],
    policy_set: PolicySet,
    obj: dict[str, Any],
    objects: Objects,
    cluster_queue: str,
    pod_sets: list[dict],
) -> list[FlavorRow]:
    """Every flavor the queue has for what the pod sets request: offered or not (and why not, in
    the flavor assigner's words), and the policies' verdict on the offered ones (`qm policy where`)."""
    refused = judge(judge_object, policy_set, obj, objects, cluster_queue, pod_sets).refused_flavors()
    rows = []
    for ps_name, resource, flavors in _offers(objects, cluster_queue, pod_sets):
        for name, why in flavors:
            if why is not None:
                rows.append(FlavorRow(ps_name, resource, name, "not offered", why))
            elif name in refused:
                rows.append(FlavorRow(ps_name, resource, name, "refused by policy", refused[name]))
            else:
                rows.append(FlavorRow(ps_name, resource, name, "allowed"))
    return rows
