"""Flavor assignment, as Kueue's ``flavorassigner``.

For each pod set, each requested resource is looked up in the ClusterQueue's resource group;
the group's flavors are tried in order. A flavor is checked against the pod set's
``nodeSelector`` (on the flavor's own label keys) and then against quota:

* request + earlier pod sets' requests > potential capacity → NoFit ("insufficient quota …
  > maximum capacity");
* fits in what is available → Fit, with the borrowing level needed;
* otherwise "insufficient unused quota for R in flavor F, N more needed", and, when the
  request is within nominal, may be reclaimed in the hierarchy, or the queue may preempt
  while borrowing, the preemption oracle is asked whether preemption could make room.

``flavorFungibility`` decides whether to stop at a flavor that needs borrowing
(``whenCanBorrow``) or preemption (``whenCanPreempt``) or to try the next one; the best mode
seen wins otherwise. Pod sets are all-or-nothing: one pod set that gets no flavor fails the
workload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from services.core.quantity import format_milli
from services.core.quota.model import (
    FlavorFungibility,
    FlavorResource,
    FungibilityPolicy,
    LabelRequirement,
    PodSet,
    Reason,
    ResourceFlavor,
    ResourceGroup,
    Taint,
    Toleration,
)
from services.core.quota.snapshot import ClusterQueueState
from services.core.quota.tree import available, height_of_lowest_subtree_that_fits, potential_available

_NO_BORROW = 1 << 60  # worst borrowing level, for comparisons


#: Kueue's pod-count resource: a ClusterQueue that covers it counts each pod as 1 (1,000 milli)
PODS = "pods"


class Mode(IntEnum):
    """Kueue's granular preemption mode, worst to best."""

    NO_FIT = 0
    NO_CANDIDATES = 1
    PREEMPT = 2
    RECLAIM = 3
    FIT = 4


class AssignmentMode(IntEnum):
    """Kueue's FlavorAssignmentMode (representative mode of a pod set / workload)."""

    NO_FIT = 0
    PREEMPT = 1
    FIT = 3


def _assignment_mode(mode: Mode) -> AssignmentMode:
    if mode is Mode.NO_FIT:
        return AssignmentMode.NO_FIT
    if mode is Mode.FIT:
        return AssignmentMode.FIT
    return AssignmentMode.PREEMPT


_SEVERITY = {
    None: 0,
    Reason.WAITING_FOR_QUOTA: 2,
    Reason.EXCEEDS_MAX_QUOTA: 3,
    Reason.NO_MATCHING_FLAVOR: 4,
}


def _worse(a: Reason | None, b: Reason | None) -> Reason | None:
    return a if _SEVERITY[a] >= _SEVERITY[b] else b


@dataclass(slots=True)
class FlavorChoice:
    flavor: str
    mode: AssignmentMode
    borrow: int
    granular: Mode = Mode.FIT


@dataclass(slots=True)
class PodSetAssignment:
    name: str
    count: int
    requests: dict[str, int]  # totals for the pod set at this count, milli-units
    flavors: dict[str, FlavorChoice] | None  # None: no flavor could be assigned
    reasons: list[str] = field(default_factory=list)
    no_fit_reason: Reason | None = None

    def representative_mode(self) -> AssignmentMode:
        if not self.reasons and self.flavors is not None:
            return AssignmentMode.FIT
        if not self.flavors:
            return AssignmentMode.NO_FIT
        mode = AssignmentMode.FIT
        for choice in self.flavors.values():  # a loop, not min(): called per nomination
            if choice.mode < mode:
                mode = choice.mode
        return mode

    def message(self) -> str:
        return ", ".join(sorted(self.reasons))


@dataclass(slots=True)
class Assignment:
    pod_sets: list[PodSetAssignment] = field(default_factory=list)
    borrowing: int = 0
    usage: dict[FlavorResource, int] = field(default_factory=dict)

    def representative_mode(self) -> AssignmentMode:
        if not self.pod_sets:
            return AssignmentMode.NO_FIT
        mode = AssignmentMode.FIT
        for ps in self.pod_sets:
            ps_mode = ps.representative_mode()
            if ps_mode < mode:
                mode = ps_mode
        return mode

    def message(self) -> str:
        parts = []
        for ps in self.pod_sets:
            if ps.representative_mode() is AssignmentMode.FIT:
                continue
            parts.append(f"couldn't assign flavors to pod set {ps.name}: {ps.message()}")
        return "; ".join(parts)

    def no_fit_reason(self) -> Reason:
        reason: Reason | None = None
        for ps in self.pod_sets:
            if ps.representative_mode() is AssignmentMode.NO_FIT:
                reason = _worse(reason, ps.no_fit_reason or Reason.WAITING_FOR_QUOTA)
        return reason or Reason.WAITING_FOR_QUOTA

    def flavors(self) -> dict[str, dict[str, str]]:
        return {
            ps.name: {res: choice.flavor for res, choice in sorted(ps.flavors.items())}
            for ps in self.pod_sets
            if ps.flavors
        }

    def counts(self) -> dict[str, int]:
        return {ps.name: ps.count for ps in self.pod_sets}

    def preemption_known_impossible(self) -> bool:
        """The oracle already found no candidates for one of the flavor-resources that need
        preemption: victims for the whole request cannot exist either (they would have to
        free that same flavor-resource), so the search can be skipped."""
        return any(
            choice.granular is Mode.NO_CANDIDATES
            for ps in self.pod_sets
            for choice in (ps.flavors or {}).values()
        )

    def resources_requiring_preemption(self) -> set[FlavorResource]:
        out = set()
        for ps in self.pod_sets:
            for res, choice in (ps.flavors or {}).items():
                if choice.mode is AssignmentMode.PREEMPT:
                    out.add((choice.flavor, res))
        return out


# Oracle: (fr, total quantity) -> (mode, borrowing level after preemptions)
PreemptionOracle = Callable[[FlavorResource, int], tuple[Mode, int]]


def _should_try_next(mode: Mode, borrow: int, ff: FlavorFungibility) -> bool:
    if mode in (Mode.NO_FIT, Mode.NO_CANDIDATES):
        return True
    if mode in (Mode.PREEMPT, Mode.RECLAIM) and ff.when_can_preempt is FungibilityPolicy.TRY_NEXT_FLAVOR:
        return True
    return borrow > 0 and ff.when_can_borrow is FungibilityPolicy.TRY_NEXT_FLAVOR


def _is_preferred(a: tuple[Mode, int], b: tuple[Mode, int]) -> bool:
    """Kueue's isPreferred with the default BorrowingOverPreemption preference."""
    if a[0] is Mode.NO_FIT:
        return False
    if b[0] is Mode.NO_FIT:
        return True
    a_none = a[0] is Mode.NO_CANDIDATES
    b_none = b[0] is Mode.NO_CANDIDATES
    if a_none != b_none:
        return not a_none
    if a[0] != b[0]:
        return a[0] > b[0]
    return a[1] < b[1]


def required_node_affinity(pod_spec: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    """A pod template's required node affinity as events carry it: terms, each a list of
    {key, operator, values} (ADR 0071). matchFields name nodes, not flavors, and are left to
    kube-scheduler; a requirement without a key or an operator is dropped. [] when there is none."""
    affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = [[{"key": str(r["key"]), "operator": str(r["operator"]), "values": [str(v) for v in r.get("values") or []]}
              for r in (term or {}).get("matchExpressions") or []
              if isinstance(r, Mapping) and r.get("key") and r.get("operator")]
             for term in required.get("nodeSelectorTerms") or []]
    return terms if any(terms) else []


def untolerated_taint(flavor: ResourceFlavor, tolerations: tuple[Toleration, ...]) -> Taint | None:
    """The first of the flavor's NoSchedule/NoExecute taints the pods do not tolerate (Kueue's
    check: the pods' own tolerations; the flavor's `tolerations` are added at admission, and
    are not counted here)."""
    for taint in flavor.node_taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None


def pod_tolerations(pod_spec: Mapping[str, Any]) -> list[dict[str, str]]:
    """A pod template's tolerations as events carry them ({key, operator, value, effect}; ADR
    0072); tolerationSeconds is the node's business. [] when there are none."""
    return [{"key": str(t.get("key") or ""), "operator": str(t.get("operator") or "Equal"),
             "value": str(t.get("value") or ""), "effect": str(t.get("effect") or "")}
            for t in pod_spec.get("tolerations") or () if isinstance(t, Mapping)
            and (t.get("operator") or "Equal") in ("Equal", "Exists")
            and (t.get("effect") or "") in ("", "NoSchedule", "PreferNoSchedule", "NoExecute")]


def tolerations_of(tolerations: Iterable[Mapping[str, Any]] | None) -> tuple[Toleration, ...]:
    """A pod set's `tolerations` as events carry them ({key, operator, value, effect}) -> the core's."""
    return tuple(Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"), str(t.get("value") or ""),
                            str(t.get("effect") or "")) for t in tolerations or ())


def node_affinity_of(terms: Iterable[Iterable[Mapping[str, Any]]] | None) -> tuple[tuple[LabelRequirement, ...], ...]:
    """A pod set's `node_affinity` as events carry it (terms of {key, operator, values}) -> the core's."""
    return tuple(tuple(LabelRequirement(r["key"], r["operator"], tuple(r.get("values") or ())) for r in term)
                 for term in terms or ())


def flavor_matches_selector(
    flavor: ResourceFlavor, node_selector: tuple[tuple[str, str], ...], flavors: Mapping[str, ResourceFlavor],
    rg: ResourceGroup, node_affinity: tuple[tuple[LabelRequirement, ...], ...] = (),
) -> bool:
    """Kueue's flavorSelector: the pod set's nodeSelector and required node affinity, cut to the
    label keys some flavor of the resource group has, must hold on this flavor's nodeLabels (a
    key only another flavor has rules this one out; a key no flavor has is the node scheduler's
    business). An affinity term left with no requirement is dropped, as Kueue drops it; with no
    term left, the affinity holds."""
    if not node_selector and not node_affinity:
        return True
    labels = dict(flavor.node_labels)
    keys = None

    def group_keys() -> set[str]:
        nonlocal keys
        if keys is None:
            keys = {k for fq in rg.flavors if (f := flavors.get(fq.flavor)) is not None for k, _ in f.node_labels}
        return keys

    for key, value in node_selector:
        found = labels.get(key)
        if found == value:
            continue
        if found is not None or key in group_keys():
            return False
    if node_affinity:
        terms = [kept for term in node_affinity if (kept := [r for r in term if r.key in group_keys()])]
        if terms and not any(all(r.holds(labels) for r in term) for term in terms):
            return False
    return True


class FlavorAssigner:
    """Assigns flavors for one workload in one ClusterQueue of a snapshot."""

    __slots__ = ("cq", "flavors", "pod_sets", "oracle", "can_preempt_while_borrowing", "memo", "oracle_asked")

    def __init__(
        self,
        cq: ClusterQueueState,
        flavors: dict[str, ResourceFlavor] | object,
        pod_sets: tuple[PodSet, ...],
        oracle: PreemptionOracle | None,
        fair_sharing: bool,
        memo: tuple[dict[object, object], object] | None = None,
    ) -> None:
        self.cq = cq
        self.flavors = flavors
        self.pod_sets = pod_sets
        self.oracle = oracle
        # memo: (dict valid for the current snapshot state, key of the oracle's inputs): a
        # resource group's flavor search is pure in (state, oracle, requests, assumed usage);
        # one that never asked the oracle is pure in (state, ClusterQueue, requests, assumed
        # usage): whether the oracle is asked does not depend on the preemptor
        self.memo = memo
        self.oracle_asked = 0
        pre = cq.spec.preemption
        self.can_preempt_while_borrowing = pre.borrow_within_cohort != "Never" or (
            fair_sharing and pre.reclaim_within_cohort != "Never"
        )

    def _plan(
        self, ps: PodSet, count: int
    ) -> tuple[dict[str, int], list[tuple[str, ResourceGroup | None, tuple[tuple[str, int], ...]]]]:
        """The pod set's requests at ``count`` and, per requested resource in name order, its
        resource group and the group's requests: fixed by the spec, so kept per ClusterQueue."""
        plans = self.cq.plans
        key = (ps, count)
        plan = plans.get(key)
        if plan is None:
            requests = {res: per_pod * count for res, per_pod in ps.requests}
            if PODS in self.cq.rg_by_resource:
                requests[PODS] = count * 1000
            steps = []
            for res in sorted(requests):
                rg = self.cq.rg_by_resource.get(res)
                covered = rg.covered_resources if rg is not None else ()
                steps.append((res, rg, tuple(sorted((r, v) for r, v in requests.items() if r in covered))))
            plan = plans[key] = (requests, steps)
        return plan  # type: ignore[return-value]

    def assign(self, counts: list[int] | None = None) -> Assignment:
        assignment = Assignment()
        usage = assignment.usage
        memo = self.memo
        if memo is not None:
            memo_dict, memo_key = memo
        for i, ps in enumerate(self.pod_sets):
            count = ps.count if counts is None else counts[i]
            requests, steps = self._plan(ps, count)
            psa = PodSetAssignment(ps.name, count, requests, {})
            flavors = psa.flavors
            failed = False
            for res, rg, group in steps:
                if rg is None:
                    if requests[res] == 0:
                        continue
                    psa.reasons.append(f"resource {res} unavailable in ClusterQueue")
                    psa.no_fit_reason = Reason.NO_MATCHING_FLAVOR
                    failed = True
                    break
                if res in flavors:  # type: ignore[operator]
                    continue
                if memo is None:
                    chosen, reasons, no_fit = self._find_flavor(ps, group, rg, usage)
                else:
                    assumed = (
                        tuple(usage.get((fq.flavor, r), 0) for fq in rg.flavors for r, _ in group)
                        if usage
                        else ()
                    )
                    search = (res, ps.node_selector, ps.node_affinity, ps.tolerations, ps.refused_flavors, group, assumed)
                    free_key = ("flavor", self.cq.name, search)
                    hit = memo_dict.get(free_key)
                    if hit is None:
                        mkey = ("flavor", memo_key, search)
                        hit = memo_dict.get(mkey)
                        if hit is None:
                            asked = self.oracle_asked
                            hit = self._find_flavor(ps, group, rg, usage)
                            memo_dict[mkey if self.oracle_asked != asked else free_key] = hit
                    chosen, reasons, no_fit = hit  # type: ignore[misc]
                if chosen is None:
                    psa.reasons = list(reasons)
                    psa.no_fit_reason = no_fit
                    failed = True
                    break
                flavors.update(chosen)  # type: ignore[union-attr]
                psa.reasons.extend(reasons)
            if failed:
                psa.flavors = None
                assignment.pod_sets.append(psa)
                return assignment
            assignment.pod_sets.append(psa)
            for res, choice in flavors.items():  # type: ignore[union-attr]
                if choice.borrow > assignment.borrowing:
                    assignment.borrowing = choice.borrow
                fr = (choice.flavor, res)
                usage[fr] = usage.get(fr, 0) + requests[res]
        return assignment

    def _find_flavor(
        self,
        ps: PodSet,
        group_requests: tuple[tuple[str, int], ...],
        rg: ResourceGroup,
        usage: dict[FlavorResource, int],
    ) -> tuple[dict[str, FlavorChoice] | None, list[str], Reason | None]:
        """The flavor for the resource group's requests (``group_requests``: the pod set's
        requests of the group's covered resources, in name order)."""
        reasons: list[str] = []
        no_fit: Reason | None = None
        best: dict[str, FlavorChoice] | None = None
        best_mode: tuple[Mode, int] = (Mode.NO_FIT, _NO_BORROW)
        ff = self.cq.spec.flavor_fungibility
        for fq in rg.flavors:
            fname = fq.flavor
            flavor = self.flavors.get(fname)  # type: ignore[attr-defined]
            if flavor is None:
                reasons.append(f"flavor {fname} not found")
                no_fit = _worse(no_fit, Reason.NO_MATCHING_FLAVOR)
                continue
            if not flavor_matches_selector(flavor, ps.node_selector, self.flavors, rg, ps.node_affinity):
                reasons.append(f"flavor {fname} doesn't match node affinity")
                no_fit = _worse(no_fit, Reason.NO_MATCHING_FLAVOR)
                continue
            if flavor.node_taints:
                taint = untolerated_taint(flavor, ps.tolerations)
                if taint is not None:
                    reasons.append(f"untolerated taint {taint} in flavor {fname}")
                    no_fit = _worse(no_fit, Reason.NO_MATCHING_FLAVOR)
                    continue
            if ps.refused_flavors:
                why = dict(ps.refused_flavors).get(fname)
                if why is not None:
                    reasons.append(f"flavor {fname} refused by policy: {why}")
                    no_fit = _worse(no_fit, Reason.NO_MATCHING_FLAVOR)
                    continue
            choices: dict[str, FlavorChoice] = {}
            rep: tuple[Mode, int] = (Mode.FIT, 0)
            for rname, value in group_requests:
                fr = (fname, rname)
                mode, borrow, reason, why = self._fits_quota(fr, usage.get(fr, 0), value)
                if reason is not None:
                    reasons.append(reason)
                    no_fit = _worse(no_fit, why)
                if _is_preferred(rep, (mode, borrow)):
                    rep = (mode, borrow)
                if rep[0] is Mode.NO_FIT:
                    continue
                choices[rname] = FlavorChoice(fname, _assignment_mode(mode), borrow, mode)
            if not _should_try_next(rep[0], rep[1], ff):
                best, best_mode = choices, rep
                break
            if _is_preferred(rep, best_mode):
                best, best_mode = choices, rep
        if best is not None and best_mode[0] is Mode.FIT:
            return best, [], None
        if best is None:
            return None, reasons, no_fit
        return best, reasons, None

    def _fits_quota(
        self, fr: FlavorResource, assumed: int, request: int
    ) -> tuple[Mode, int, str | None, Reason | None]:
        node = self.cq.node
        value = assumed + request
        max_capacity = node.potential.get(fr)
        if max_capacity is None:
            max_capacity = potential_available(node, fr)
        res = fr[1]
        if value > max_capacity:
            return (
                Mode.NO_FIT,
                0,
                f"insufficient quota for {res} in flavor {fr[0]}, previously considered podsets requests "
                f"({format_milli(assumed, res)}) + current podset request ({format_milli(request, res)}) > "
                f"maximum capacity ({format_milli(max_capacity, res)})",
                Reason.EXCEEDS_MAX_QUOTA,
            )
        avail = available(node, fr)
        if value <= avail:
            if node.parent is None or node.usage.get(fr, 0) + value <= node.subtree.get(fr, 0):
                return Mode.FIT, 0, None, None
            return Mode.FIT, height_of_lowest_subtree_that_fits(node, fr, value)[0], None, None
        borrow, may_reclaim = height_of_lowest_subtree_that_fits(node, fr, value)
        message = f"insufficient unused quota for {res} in flavor {fr[0]}, {format_milli(value - avail, res)} more needed"
        if self.oracle is not None and (
            self.cq.nominal(fr) >= value or may_reclaim or self.can_preempt_while_borrowing
        ):
            self.oracle_asked += 1
            mode, borrow_after = self.oracle(fr, value)
            return (
                mode,
                borrow_after,
                message,
                (None if mode is not Mode.NO_FIT else Reason.WAITING_FOR_QUOTA),
            )
        return Mode.NO_FIT, borrow, message, Reason.WAITING_FOR_QUOTA


def pod_set_counts_to_try(pod_sets: tuple[PodSet, ...]) -> Callable[[int], list[int]] | None:
    """Kueue's PodSetReducer: counts for a "down factor" in 1..total delta, or None if the
    workload cannot be partially admitted (no pod set has minCount < count)."""
    deltas = [(ps.count - ps.min_count) if ps.min_count is not None else 0 for ps in pod_sets]
    total = sum(deltas)
    if total <= 0:
        return None
    full = [ps.count for ps in pod_sets]

    def counts(down: int) -> list[int]:
        return [full[i] - (deltas[i] * down) // total for i in range(len(full))]

    counts.total = total  # type: ignore[attr-defined]
    return counts
