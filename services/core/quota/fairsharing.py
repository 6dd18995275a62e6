"""Fair sharing: Kueue's dominant resource share (DRS) with weights.

For a node with a parent, per resource name: ``borrowed`` = Σ over its flavors of
``max(0, usage + extra − subtree quota)``, and ``lendable`` = Σ over the tree's flavors of
what the parent could potentially lend. The share is ``max(borrowed × 1000 / lendable)``
divided by the node's ``fairSharing.weight``, rounded up to an integer (Kueue's
``roundedWeightedShare``). A zero weight that borrows has an infinite share (``MAX_SHARE``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from services.core.quota.model import FairSharingStrategy, FlavorResource
from services.core.quota.tree import Node, potential_available

MAX_SHARE = 2**63 - 1


def _lendable(parent: Node) -> dict[str, int]:
    if parent.lendable is None:
        root = parent.root()
        lendable: dict[str, int] = {}
        for fr in root.subtree:
            lendable[fr[1]] = lendable.get(fr[1], 0) + potential_available(parent, fr)
        parent.lendable = lendable
    return parent.lendable


def dominant_resource_share(
    node: Node,
    extra: Mapping[FlavorResource, int] | None = None,
    without: Mapping[FlavorResource, int] | None = None,
) -> tuple[int, str]:
    """The node's weighted DRS (and its dominant resource), optionally with ``extra`` usage
    added (Kueue's DominantResourceShareWith) or ``without`` usage removed (…Without)."""
    if node.parent is None:
        return 0, ""
    borrowed: dict[str, int] = {}
    usage = node.usage
    for fr, quota in node.subtree.items():
        amount = usage.get(fr, 0) - quota
        if extra:
            amount += extra.get(fr, 0)
        if without:
            amount -= without.get(fr, 0)
        if amount > 0:
            borrowed[fr[1]] = borrowed.get(fr[1], 0) + amount
    if not borrowed:
        return 0, ""
    if node.fair_weight == 0:
        return MAX_SHARE, min(borrowed)
    lendable = _lendable(node.parent)
    best_ratio = -1.0
    best_res = ""
    for res in sorted(borrowed):
        lr = lendable.get(res, 0)
        if lr > 0:
            ratio = borrowed[res] * 1000 / lr
            if ratio > best_ratio:
                best_ratio, best_res = ratio, res
    if best_ratio <= 0:
        return 0, best_res
    return math.ceil(best_ratio / node.fair_weight), best_res


def strategy_allows(
    strategy: FairSharingStrategy,
    preemptor_new_share: int,
    preemptee_old_share: int,
    preemptee_new_share: int,
) -> bool:
    """Kueue's fair-sharing preemption rules S2-a / S2-b (KEP-1714)."""
    if strategy is FairSharingStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE:
        return preemptor_new_share <= preemptee_new_share
    return preemptor_new_share < preemptee_old_share
