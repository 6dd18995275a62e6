"""The snapshot: quota tree + admitted usage, the thing every decision is made over.

A :class:`Snapshot` is built once from :class:`~services.core.quota.model.Objects`
(:func:`build_snapshot`). Decisions never mutate the snapshot they are given: the scheduler
works on :meth:`Snapshot.copy`. "What if" questions use :meth:`Snapshot.simulate_removal`,
which returns an undo function (Kueue's ``SimulateWorkloadUsageRemoval``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from services.core.frozen import quick_init
from services.core.quota.errors import UnknownWorkloadError
from services.core.quota.model import (
    ClusterQueue,
    Config,
    FlavorResource,
    LocalQueue,
    Namespace,
    Objects,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Workload,
)
from services.core.quota.tree import Node, add_usage, compute_subtree, remove_usage


@quick_init
@dataclass(frozen=True, slots=True)
class AdmittedWorkload:
    """A workload holding quota in a ClusterQueue."""

    key: str
    cluster_queue: str
    priority: int
    usage: tuple[tuple[FlavorResource, int], ...]
    quota_reserved_at: float | None = None
    created_at: float = 0.0
    uid: str = ""
    evicted: bool = False
    # hashed on every admission and (simulated) removal, for the tree fingerprint: computed once
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "_hash",
            hash(
                (self.key, self.cluster_queue, self.priority, self.usage, self.quota_reserved_at,
                 self.created_at, self.uid, self.evicted)
            ),
        )

    def __hash__(self) -> int:
        return self._hash

    @staticmethod
    def from_workload(wl: Workload) -> AdmittedWorkload:
        if wl.admission is None:
            raise ValueError(f"workload {wl.key} is not admitted")
        return AdmittedWorkload(
            wl.key,
            wl.admission.cluster_queue,
            wl.priority,
            tuple(sorted(wl.admission.flavor_usage().items())),
            wl.quota_reserved_at,
            wl.created_at,
            wl.uid,
            wl.evicted,
        )


class ClusterQueueState:
    """Per-ClusterQueue view in a snapshot: spec, tree node, admitted workloads."""

    __slots__ = ("spec", "name", "node", "workloads", "rg_by_resource", "inactive_reason", "root_key", "plans")

    def __init__(self, spec: ClusterQueue, node: Node, inactive_reason: str | None) -> None:
        self.spec = spec
        self.name = spec.name
        self.node = node
        self.workloads: dict[str, AdmittedWorkload] = {}
        self.rg_by_resource: dict[str, ResourceGroup] = {
            res: rg for rg in spec.resource_groups for res in rg.covered_resources
        }
        self.inactive_reason = inactive_reason
        # key of the cohort tree (see Snapshot.root_name); set once the tree is linked
        self.root_key = spec.name
        # FlavorAssigner's per-pod-set plans (requests and resource groups): they depend on
        # the spec only, so copies share them
        self.plans: dict[object, object] = {}

    def nominal(self, fr: FlavorResource) -> int:
        quota = self.node.quotas.get(fr)
        return 0 if quota is None else quota.nominal


def _quotas(groups: tuple[ResourceGroup, ...]) -> dict[FlavorResource, ResourceQuota]:
    return {(fq.flavor, rq.resource): rq for rg in groups for fq in rg.flavors for rq in fq.resources}


class _Forgetful(dict):  # type: ignore[type-arg]
    """A memo that stores nothing: every lookup misses (Snapshot.memoise = False)."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


class Snapshot:
    """Quota tree with admitted usage. Copy before mutating (the scheduler does)."""

    __slots__ = (
        "flavors",
        "cluster_queues",
        "cohorts",
        "workloads",
        "config",
        "namespaces",
        "local_queues",
        "_members",
        "_fingerprints",
        "_caches",
        "memoise",
    )

    def __init__(self) -> None:
        self.flavors: Mapping[str, ResourceFlavor] = {}
        self.cluster_queues: dict[str, ClusterQueueState] = {}
        self.cohorts: dict[str, Node] = {}
        self.workloads: dict[str, AdmittedWorkload] = {}
        self.config = Config()
        self.namespaces: Mapping[str, Namespace] = {}
        self.local_queues: Mapping[tuple[str, str], LocalQueue] = {}
        self._members: dict[str, list[ClusterQueueState]] = {}
        # per cohort tree: XOR of hash(AdmittedWorkload) over its admitted workloads. Quotas
        # are fixed, so the admitted set determines every usage and candidate in the tree:
        # equal fingerprints mean an unchanged tree (simulate-and-undo leaves it as it was).
        self._fingerprints: dict[str, int] = {}
        # per cohort tree: (fingerprint, memo) for pure functions of the tree's state
        self._caches: dict[str, tuple[int, dict[object, object]]] = {}
        # False: every memo is a dict that keeps nothing (tests compare decisions with and
        # without memos; copies keep the setting)
        self.memoise = True

    # ------------------------------------------------------------------ structure

    def cluster_queue(self, name: str) -> ClusterQueueState | None:
        return self.cluster_queues.get(name)

    def tree_members(self, cq: ClusterQueueState) -> list[ClusterQueueState]:
        """All ClusterQueues sharing ``cq``'s root cohort (just ``cq`` if it has none)."""
        if cq.node.parent is None:
            return [cq]
        root = cq.node.root()
        members = self._members.get(root.name)
        if members is None:
            members = []
            stack = [root]
            while stack:
                n = stack.pop()
                members.extend(self.cluster_queues[c.name] for c in n.child_cqs)
                stack.extend(n.child_cohorts)
            members.sort(key=lambda m: m.name)
            self._members[root.name] = members
        return members

    def root_name(self, cq_name: str) -> str:
        """The key of the cohort tree a ClusterQueue belongs to (its own name if alone)."""
        cq = self.cluster_queues[cq_name]
        if cq.node.parent is None:
            return cq_name
        return "cohort:" + cq.node.root().name

    def fingerprint(self, root_key: str) -> int:
        """Changes whenever the admitted set (hence usage) of that cohort tree changes."""
        return self._fingerprints.get(root_key, 0)

    def tree_cache(self, root_key: str) -> dict[object, object]:
        """A memo for values that depend only on the cohort tree's admitted set; emptied as
        soon as that set changes (by fingerprint), and never shared with copies."""
        if not self.memoise:
            return _Forgetful()
        fp = self._fingerprints.get(root_key, 0)
        entry = self._caches.get(root_key)
        if entry is None or entry[0] != fp:
            entry = (fp, {})
            self._caches[root_key] = entry
        return entry[1]

    def drop_caches(self) -> None:
        """Forget all memos (the scheduler does before handing its snapshot back)."""
        self._caches = {}

    # ------------------------------------------------------------------ usage

    def add_workload(self, wl: AdmittedWorkload) -> None:
        cq = self.cluster_queues.get(wl.cluster_queue)
        if cq is None:
            return  # usage in an unknown ClusterQueue counts nowhere (as in Kueue's cache)
        if wl.key in self.workloads:
            raise ValueError(f"workload {wl.key} is already admitted")
        self.workloads[wl.key] = wl
        cq.workloads[wl.key] = wl
        fps = self._fingerprints
        fps[cq.root_key] = fps.get(cq.root_key, 0) ^ hash(wl)
        node = cq.node
        for fr, value in wl.usage:
            add_usage(node, fr, value)

    def add_unlisted_usage(self, cluster_queue: str, usage: Iterable[tuple[FlavorResource, int]]) -> None:
        """Usage held in a ClusterQueue by admitted workloads that are not listed one by one
        (a preemption request lists only the possible victims). Usage adds up the same whether
        it comes in one sum or workload by workload (what exceeds a node's quota bubbles up)."""
        cq = self.cluster_queues.get(cluster_queue)
        if cq is None:
            return  # as add_workload: an unknown ClusterQueue's usage counts nowhere
        usage = tuple(usage)
        fps = self._fingerprints
        fps[cq.root_key] = fps.get(cq.root_key, 0) ^ hash((cluster_queue, usage))
        for fr, value in usage:
            add_usage(cq.node, fr, value)

    def remove_workload(self, key: str) -> AdmittedWorkload:
        wl = self.workloads.pop(key, None)
        if wl is None:
            raise UnknownWorkloadError(key)
        cq = self.cluster_queues[wl.cluster_queue]
        del cq.workloads[key]
        fps = self._fingerprints
        fps[cq.root_key] = fps.get(cq.root_key, 0) ^ hash(wl)
        node = cq.node
        for fr, value in wl.usage:
            remove_usage(node, fr, value)
        return wl

    def simulate_removal(self, keys: Iterable[str]) -> Callable[[], None]:
        """Remove workloads' usage; return a function that puts it back."""
        removed = [self.remove_workload(k) for k in keys]

        def undo() -> None:
            for wl in reversed(removed):
                self.add_workload(wl)

        return undo

    def simulate_addition(self, wl: AdmittedWorkload) -> Callable[[], None]:
        self.add_workload(wl)
        return lambda: self.remove_workload(wl.key) and None

    def usage(self) -> dict[str, dict[str, dict[str, int]]]:
        """Usage per ClusterQueue → flavor → resource, in milli-units (zero entries omitted)."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for name in sorted(self.cluster_queues):
            per_flavor: dict[str, dict[str, int]] = {}
            for (flavor, res), value in sorted(self.cluster_queues[name].node.usage.items()):
                if value:
                    per_flavor.setdefault(flavor, {})[res] = value
            out[name] = per_flavor
        return out

    def cohort_usage(self) -> dict[str, dict[FlavorResource, int]]:
        return {name: dict(node.usage) for name, node in sorted(self.cohorts.items())}

    # ------------------------------------------------------------------ copy

    def copy(self) -> Snapshot:
        """An independent snapshot: same quotas, own usage and admitted set."""
        new = Snapshot()
        new.flavors = self.flavors
        new.config = self.config
        new.namespaces = self.namespaces
        new.local_queues = self.local_queues
        new._members = {}
        new._fingerprints = dict(self._fingerprints)
        new._caches = {}
        new.memoise = self.memoise
        clones: dict[int, Node] = {}

        def clone(node: Node) -> Node:
            c = clones.get(id(node))
            if c is None:
                c = node.clone_shallow()
                clones[id(node)] = c
                if node.parent is not None:
                    c.parent = clone(node.parent)
            return c

        for name, node in self.cohorts.items():
            new.cohorts[name] = clone(node)
        for name, cq in self.cluster_queues.items():
            state = ClusterQueueState.__new__(ClusterQueueState)
            state.spec = cq.spec
            state.name = cq.name
            state.plans = cq.plans
            state.node = clone(cq.node)
            state.workloads = dict(cq.workloads)
            state.rg_by_resource = cq.rg_by_resource
            state.inactive_reason = cq.inactive_reason
            state.root_key = cq.root_key
            new.cluster_queues[name] = state
        for node in clones.values():
            if node.parent is not None:
                if node.is_cq:
                    node.parent.child_cqs.append(node)
                else:
                    node.parent.child_cohorts.append(node)
        new.workloads = dict(self.workloads)
        return new


def build_snapshot(
    objects: Objects,
    admitted: Iterable[Workload | AdmittedWorkload] | None = None,
    unlisted_usage: Mapping[str, Iterable[tuple[FlavorResource, int]]] | None = None,
) -> Snapshot:
    """Build the quota tree from Kueue objects and add admitted usage.

    ``admitted`` defaults to the workloads in ``objects`` that carry ``status.admission``.
    ``unlisted_usage``: per ClusterQueue, the usage of admitted workloads not in ``admitted``
    (see :meth:`Snapshot.add_unlisted_usage`).
    """
    snap = Snapshot()
    snap.flavors = objects.flavors
    snap.config = objects.config
    snap.namespaces = objects.namespaces
    snap.local_queues = objects.local_queues
    for name, cohort in objects.cohorts.items():
        snap.cohorts[name] = Node(name, False, _quotas(cohort.resource_groups), cohort.fair_weight)
    for name, cohort in objects.cohorts.items():
        if cohort.parent is not None:
            node = snap.cohorts[name]
            node.parent = snap.cohorts[cohort.parent]
            node.parent.child_cohorts.append(node)
    for name in sorted(objects.cluster_queues):
        spec = objects.cluster_queues[name]
        node = Node(name, True, _quotas(spec.resource_groups), spec.fair_weight)
        if spec.cohort is not None:
            node.parent = snap.cohorts[spec.cohort]
            node.parent.child_cqs.append(node)
        inactive = None
        if spec.stop_policy != "None":
            inactive = f"ClusterQueue {name} is inactive"
        else:
            missing = sorted(
                {fq.flavor for rg in spec.resource_groups for fq in rg.flavors} - set(objects.flavors)
            )
            if missing:
                inactive = f"ClusterQueue {name} is inactive"
        snap.cluster_queues[name] = ClusterQueueState(spec, node, inactive)
    for node in snap.cohorts.values():
        if node.parent is None:
            compute_subtree(node)
    for cq in snap.cluster_queues.values():
        if cq.node.parent is None:
            compute_subtree(cq.node)
        cq.root_key = snap.root_name(cq.name)
    if admitted is None:
        admitted = [wl for wl in objects.workloads if wl.admission is not None]
    for wl in sorted(
        (w if isinstance(w, AdmittedWorkload) else AdmittedWorkload.from_workload(w) for w in admitted),
        key=lambda w: w.key,
    ):
        snap.add_workload(wl)
    for name, usage in sorted((unlisted_usage or {}).items()):
        snap.add_unlisted_usage(name, usage)
    return snap


_OBJECTS_BEHIND: dict[tuple[int, str], tuple[Objects, Objects]] = {}


def objects_behind(objects: Objects, root_key: str) -> Objects:
    """Only the ClusterQueues, cohorts and LocalQueues of one cohort tree (``root_key`` as
    Snapshot.root_name says it: ``cohort:<root>``, or a lone ClusterQueue's name); all of
    ``objects`` when no ClusterQueue is behind the key. A snapshot of it is what one queue-manager
    key or one preemption request needs; a tree of the whole cluster (1,000 ClusterQueues in
    kueue-large-scale) was rebuilt or copied on every event. Memoised per objects."""
    memo = _OBJECTS_BEHIND.get((id(objects), root_key))
    if memo is not None and memo[0] is objects:
        return memo[1]
    whole = build_snapshot(objects, [])
    queues = {name: cq for name, cq in objects.cluster_queues.items() if whole.root_name(name) == root_key}
    if not queues:
        return objects
    cohorts = {name: c for name, c in objects.cohorts.items() if "cohort:" + _root_cohort(objects, name) == root_key}
    local = {k: lq for k, lq in objects.local_queues.items() if lq.cluster_queue in queues}
    subset = dataclasses.replace(objects, cluster_queues=queues, cohorts=cohorts, local_queues=local, workloads=())
    if len(_OBJECTS_BEHIND) >= 4096:
        _OBJECTS_BEHIND.clear()  # each change of quota limits is new objects: keep no stale ones alive
    _OBJECTS_BEHIND[(id(objects), root_key)] = (objects, subset)
    return subset


def _root_cohort(objects: Objects, cohort: str) -> str:
    while cohort in objects.cohorts and objects.cohorts[cohort].parent is not None:
        cohort = objects.cohorts[cohort].parent
    return cohort
