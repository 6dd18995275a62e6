"""Fluent builders for Kueue objects as plain dicts (what YAML loading yields), in the style of
Kueue's ``utiltesting`` wrappers: ``make_cq("a").gpu("a100", 32).cohort("c").obj()``."""

from __future__ import annotations

import copy
from typing import Any

from services.core.quota import Decision, build_snapshot, drain, load_objects, run_cycles

V1B1 = "kueue.x-k8s.io/v1beta1"
GPU = "nvidia.com/gpu"
T0 = 1_700_000_000.0  # a fixed "now" base for tests


def ts(offset_s: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(T0 + offset_s, tz=UTC).isoformat().replace("+00:00", "Z")


def make_flavor(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": V1B1,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": labels},
    }


def make_lq(name: str, cq: str, ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": V1B1,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterQueue": cq},
    }


class _QuotaBuilder:
    def __init__(self) -> None:
        self._groups: list[list[tuple[str, list[dict[str, Any]]]]] = [[]]

    def group(self) -> Any:
        self._groups.append([])
        return self

    def resource(
        self, flavor: str, res: str, nominal: Any, borrowing: Any = None, lending: Any = None
    ) -> Any:
        entry: dict[str, Any] = {"name": res, "nominalQuota": nominal}
        if borrowing is not None:
            entry["borrowingLimit"] = borrowing
        if lending is not None:
            entry["lendingLimit"] = lending
        group = self._groups[-1]
        for fname, resources in group:
            if fname == flavor:
                resources.append(entry)
                return self
        group.append((flavor, [entry]))
        return self

    def gpu(self, flavor: str, nominal: Any, borrowing: Any = None, lending: Any = None) -> Any:
        return self.resource(flavor, GPU, nominal, borrowing, lending)

    def cpu(self, flavor: str, nominal: Any, borrowing: Any = None, lending: Any = None) -> Any:
        return self.resource(flavor, "cpu", nominal, borrowing, lending)

    def _resource_groups(self) -> list[dict[str, Any]]:
        out = []
        for group in self._groups:
            if not group:
                continue
            covered: list[str] = []
            for _, resources in group:
                for r in resources:
                    if r["name"] not in covered:
                        covered.append(r["name"])
            out.append(
                {"coveredResources": covered, "flavors": [{"name": f, "resources": rs} for f, rs in group]}
            )
        return out


class make_cq(_QuotaBuilder):  # noqa: N801 - reads like Kueue's MakeClusterQueue
    def __init__(self, name: str) -> None:
        super().__init__()
        self._spec: dict[str, Any] = {"namespaceSelector": {}}
        self._name = name

    def cohort(self, name: str) -> make_cq:
        self._spec["cohort"] = name
        return self

    def strict_fifo(self) -> make_cq:
        self._spec["queueingStrategy"] = "StrictFIFO"
        return self

    def preemption(
        self,
        within: str | None = None,
        reclaim: str | None = None,
        borrow_within: str | None = None,
        threshold: int | None = None,
    ) -> make_cq:
        pre: dict[str, Any] = {}
        if within:
            pre["withinClusterQueue"] = within
        if reclaim:
            pre["reclaimWithinCohort"] = reclaim
        if borrow_within:
            pre["borrowWithinCohort"] = {"policy": borrow_within}
            if threshold is not None:
                pre["borrowWithinCohort"]["maxPriorityThreshold"] = threshold
        self._spec["preemption"] = pre
        return self

    def fungibility(self, when_can_borrow: str | None = None, when_can_preempt: str | None = None) -> make_cq:
        ff = {}
        if when_can_borrow:
            ff["whenCanBorrow"] = when_can_borrow
        if when_can_preempt:
            ff["whenCanPreempt"] = when_can_preempt
        self._spec["flavorFungibility"] = ff
        return self

    def weight(self, w: Any) -> make_cq:
        self._spec["fairSharing"] = {"weight": w}
        return self

    def spec(self, **fields: Any) -> make_cq:
        self._spec.update(fields)
        return self

    def obj(self) -> dict[str, Any]:
        spec = copy.deepcopy(self._spec)
        spec["resourceGroups"] = self._resource_groups()
        return {"apiVersion": V1B1, "kind": "ClusterQueue", "metadata": {"name": self._name}, "spec": spec}


class make_cohort(_QuotaBuilder):  # noqa: N801
    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name
        self._spec: dict[str, Any] = {}

    def parent(self, name: str) -> make_cohort:
        self._spec["parent"] = name
        return self

    def weight(self, w: Any) -> make_cohort:
        self._spec["fairSharing"] = {"weight": w}
        return self

    def obj(self) -> dict[str, Any]:
        spec = dict(self._spec)
        rgs = self._resource_groups()
        if rgs:
            spec["resourceGroups"] = rgs
        return {"apiVersion": V1B1, "kind": "Cohort", "metadata": {"name": self._name}, "spec": spec}


class make_wl:  # noqa: N801 - reads like Kueue's MakeWorkload
    def __init__(self, name: str, ns: str = "default") -> None:
        self._meta: dict[str, Any] = {"name": name, "namespace": ns, "creationTimestamp": ts(0)}
        self._spec: dict[str, Any] = {"queueName": "main", "podSets": []}
        self._status: dict[str, Any] = {}

    def queue(self, name: str) -> make_wl:
        self._spec["queueName"] = name
        return self

    def priority(self, p: int) -> make_wl:
        self._spec["priority"] = p
        return self

    def created(self, offset_s: float) -> make_wl:
        self._meta["creationTimestamp"] = ts(offset_s)
        return self

    def podset(
        self,
        name: str = "main",
        count: int = 1,
        min_count: int | None = None,
        node_selector: dict[str, str] | None = None,
        node_affinity: list[list[dict[str, Any]]] | None = None,
        tolerations: list[dict[str, str]] | None = None,
        **requests: Any,
    ) -> make_wl:
        reqs = {("nvidia.com/gpu" if k == "gpu" else k): v for k, v in requests.items()}
        ps: dict[str, Any] = {
            "name": name,
            "count": count,
            "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": reqs}}]}},
        }
        if min_count is not None:
            ps["minCount"] = min_count
        if node_selector:
            ps["template"]["spec"]["nodeSelector"] = node_selector
        if node_affinity:  # required terms, each a list of matchExpressions
            ps["template"]["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": term} for term in node_affinity]}}}
        if tolerations:
            ps["template"]["spec"]["tolerations"] = tolerations
        self._spec["podSets"].append(ps)
        return self

    def gpu(self, n: Any, count: int = 1) -> make_wl:
        return self.podset("main", count, gpu=n)

    def admitted(self, cq: str, flavor: str | dict[str, str], at: float = 0.0) -> make_wl:
        psas = []
        for ps in self._spec["podSets"]:
            reqs = ps["template"]["spec"]["containers"][0]["resources"]["requests"]
            flavors = {r: (flavor if isinstance(flavor, str) else flavor[r]) for r in reqs}
            psas.append({"name": ps["name"], "count": ps["count"], "flavors": flavors})
        self._status = {
            "admission": {"clusterQueue": cq, "podSetAssignments": psas},
            "conditions": [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": ts(at)}],
        }
        return self

    def obj(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "apiVersion": V1B1,
            "kind": "Workload",
            "metadata": dict(self._meta),
            "spec": copy.deepcopy(self._spec),
        }
        if self._status:
            doc["status"] = copy.deepcopy(self._status)
        return doc


def fair_sharing_config(*strategies: str) -> dict[str, Any]:
    fs: dict[str, Any] = {"enable": True}
    if strategies:
        fs["preemptionStrategies"] = list(strategies)
    return {"apiVersion": "config.kueue.x-k8s.io/v1beta1", "kind": "Configuration", "fairSharing": fs}


def schedule(
    docs: list[dict[str, Any]], *, mode: str = "cycle", cycles: int = 1, now: float = T0 + 3600,
    sticky: tuple[str, ...] = (),
) -> dict[str, Decision]:
    """Load docs, build the snapshot from admitted workloads, schedule the pending ones
    (`sticky`: a drain's standing preemptors)."""
    objects = load_objects(("test.yaml", d) for d in docs)
    snap = build_snapshot(objects)
    pending = [w for w in objects.workloads if w.admission is None]
    if mode == "drain":
        result = drain(snap, pending, now, sticky=sticky)
    else:
        result = run_cycles(snap, pending, now, cycles=cycles)
    return result.by_workload()


def summary(decisions: dict[str, Decision]) -> dict[str, tuple[str, ...]]:
    """Compact view for table assertions: key -> (status, flavor of first resource, preempted keys...)."""
    out = {}
    for key, d in decisions.items():
        flavor = ""
        for res in d.flavors.values():
            flavor = ",".join(sorted(set(res.values())))
            break
        out[key] = (str(d.status), flavor, *sorted(f"{t.workload}:{t.reason}" for t in d.preempts))
    return out
