"""The quota tree: ClusterQueues and (hierarchical) Cohorts as resource nodes.

A faithful port of Kueue's ``resource_node.go`` arithmetic, in integer milli-units:

* ``subtree[fr]`` — the node's nominal quota plus what its children lend it (each child keeps
  ``local`` = subtree − lendingLimit to itself);
* ``usage[fr]`` — for a ClusterQueue its admitted usage; for a Cohort the sum of children's
  usage beyond their ``local`` quota;
* :func:`available` — what the node may still use now, honouring borrowingLimit on the way up;
* :func:`potential_available` — what it could use with no usage anywhere (the "maximum capacity").

All functions take a ``(flavor, resource)`` tuple ``fr``. A missing quota entry is 0 nominal
with no limits, as in Kueue.
"""

from __future__ import annotations

from services.core.quota.model import FlavorResource, ResourceQuota


class Node:
    """A ClusterQueue or Cohort in the quota tree. Quotas are fixed; usage changes."""

    __slots__ = (
        "name",
        "is_cq",
        "parent",
        "quotas",
        "subtree",
        "local",
        "usage",
        "height",
        "child_cqs",
        "child_cohorts",
        "fair_weight",
        "potential",
        "lendable",
    )

    def __init__(
        self, name: str, is_cq: bool, quotas: dict[FlavorResource, ResourceQuota], fair_weight: float
    ) -> None:
        self.name = name
        self.is_cq = is_cq
        self.parent: Node | None = None
        self.quotas = quotas
        self.subtree: dict[FlavorResource, int] = {}
        self.local: dict[FlavorResource, int] = {}
        self.usage: dict[FlavorResource, int] = {}
        self.height = 0
        self.child_cqs: list[Node] = []
        self.child_cohorts: list[Node] = []
        self.fair_weight = fair_weight
        self.potential: dict[FlavorResource, int] = {}  # cache: depends on quotas only
        self.lendable: dict[str, int] | None = None  # cache for fair sharing, quotas only

    def clone_shallow(self) -> Node:
        """Same quotas (shared, immutable after build), own copy of usage; links left to caller."""
        n = Node.__new__(Node)
        n.name = self.name
        n.is_cq = self.is_cq
        n.parent = None
        n.quotas = self.quotas
        n.subtree = self.subtree
        n.local = self.local
        n.usage = dict(self.usage)
        n.height = self.height
        n.child_cqs = []
        n.child_cohorts = []
        n.fair_weight = self.fair_weight
        n.potential = self.potential
        n.lendable = self.lendable
        return n

    def root(self) -> Node:
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        kind = "ClusterQueue" if self.is_cq else "Cohort"
        return f"<{kind} {self.name}>"


def compute_subtree(node: Node) -> None:
    """Fill subtree/local quotas bottom-up from ``node`` (Kueue's updateCohortResourceNode)."""
    subtree = {fr: q.nominal for fr, q in node.quotas.items()}
    height = 0
    for child in node.child_cohorts:
        compute_subtree(child)
        height = max(height, child.height)
    for child in node.child_cqs:
        compute_subtree(child)
    for child in (*node.child_cohorts, *node.child_cqs):
        for fr, q in child.subtree.items():
            subtree[fr] = subtree.get(fr, 0) + q - child.local.get(fr, 0)
    node.subtree = subtree
    node.local = {}
    for fr, q in node.quotas.items():
        if q.lending_limit is not None:
            node.local[fr] = max(0, subtree.get(fr, 0) - q.lending_limit)
    node.height = 0 if node.is_cq else height + 1
    node.potential = {}
    node.lendable = None


def local_available(node: Node, fr: FlavorResource) -> int:
    """Guaranteed quota (not lent to the parent) still unused at this node."""
    return max(0, node.local.get(fr, 0) - node.usage.get(fr, 0))


def available(node: Node, fr: FlavorResource) -> int:
    """Capacity the node can still use (may be negative after over-admission)."""
    parent = node.parent
    usage = node.usage.get(fr, 0)
    if parent is None:
        return node.subtree.get(fr, 0) - usage
    parent_available = available(parent, fr)
    local = node.local.get(fr, 0)
    quota = node.quotas.get(fr)
    if quota is not None and quota.borrowing_limit is not None:
        stored_in_parent = node.subtree.get(fr, 0) - local
        used_in_parent = usage - local if usage > local else 0
        with_max_from_parent = stored_in_parent - used_in_parent + quota.borrowing_limit
        if with_max_from_parent < parent_available:
            parent_available = with_max_from_parent
    return (local - usage if local > usage else 0) + parent_available


def potential_available(node: Node, fr: FlavorResource) -> int:
    """Maximum capacity for the node assuming no usage anywhere, honouring borrowingLimit."""
    cached = node.potential.get(fr)
    if cached is not None:
        return cached
    if node.parent is None:
        value = node.subtree.get(fr, 0)
    else:
        value = node.local.get(fr, 0) + potential_available(node.parent, fr)
        quota = node.quotas.get(fr)
        if quota is not None and quota.borrowing_limit is not None:
            value = min(value, node.subtree.get(fr, 0) + quota.borrowing_limit)
    node.potential[fr] = value
    return value


def add_usage(node: Node | None, fr: FlavorResource, value: int) -> None:
    """Add usage at ``node``; what exceeds its local quota bubbles up to the parent."""
    while node is not None:
        usage = node.usage.get(fr, 0)
        local = node.local.get(fr, 0)
        local_avail = local - usage if local > usage else 0
        node.usage[fr] = usage + value
        if value <= local_avail:
            return
        value -= local_avail
        node = node.parent


def remove_usage(node: Node | None, fr: FlavorResource, value: int) -> None:
    """Remove usage at ``node`` and the part of it that was stored in the parent."""
    while node is not None:
        usage = node.usage.get(fr, 0)
        stored_in_parent = usage - node.local.get(fr, 0)
        node.usage[fr] = usage - value
        if stored_in_parent <= 0:
            return
        value = min(value, stored_in_parent)
        node = node.parent


def fits_in(node: Node, requests: dict[FlavorResource, int]) -> bool:
    """Whether all requests fit in what ``node`` has available now (Kueue's ``Fits``)."""
    for fr, value in requests.items():
        if value > available(node, fr):
            return False
    return True


def borrowing(node: Node, fr: FlavorResource, extra: int = 0) -> bool:
    """Whether the node uses (or would, with ``extra``) more than its subtree quota."""
    return node.usage.get(fr, 0) + extra > node.subtree.get(fr, 0)


def height_of_lowest_subtree_that_fits(node: Node, fr: FlavorResource, value: int) -> tuple[int, bool]:
    """Kueue's FindHeightOfLowestSubtreeThatFits: 0 when the request fits without borrowing,
    else the height of the lowest ancestor Cohort whose subtree holds it. The flag says
    whether that ancestor is below the root (quota might be reclaimed within the hierarchy)."""
    if node.parent is None or not borrowing(node, fr, value):
        return 0, node.parent is not None
    remaining = value - local_available(node, fr)
    tracking = node.parent
    while tracking.parent is not None:
        if not borrowing(tracking, fr, remaining):
            return tracking.height, True
        remaining -= local_available(tracking, fr)
        tracking = tracking.parent
    return tracking.height, False
