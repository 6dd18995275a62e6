"""The queue-manager's fold over a list of events, for its unit tests."""

from __future__ import annotations

from services.queue_manager.state import apply


def fold_all(events, ctx, state=None):
    """Each event through `apply` in turn: the last state and every output, in order."""
    outputs = []
    for envelope in events:
        state, out = apply(state, envelope, ctx)
        outputs += out
    return state, outputs
