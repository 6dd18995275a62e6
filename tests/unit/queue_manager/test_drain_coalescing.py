"""ADR 0016: while a cohort's last drain is in flight, changes that free quota wait for its
queue.drain_due.v1 and are drained together, at the same place in the stream on every replay."""

from __future__ import annotations

import dataclasses

from services.contracts.codec import make_envelope
from services.contracts.events import ClockTick, WorkloadFinished
from services.queue_manager.state import apply
from tests.unit.queue_manager.test_fold import CONFIG, CTX, validated

(COHORT,) = CONFIG.cohort_keys()
COALESCING = dataclasses.replace(CTX, coalesce_drains=True, cache_key=COHORT)


def finished(name: str, at: str):
    return make_envelope(WorkloadFinished(uid=f"uid-{name}", namespace="ml-team", name=name, succeeded=True,
                                          finished_at=at), producer="test", occurred_at=at)


def step(state, event, ctx=COALESCING):
    state, outputs = apply(state, event, ctx)
    return state, outputs


def reserved(outputs):
    return [o.envelope.payload.name for o in outputs if o.envelope.event_type == "workload.quota_reserved.v1"]


def drain_dues(outputs):
    return [o for o in outputs if o.envelope.event_type == "queue.drain_due.v1"]


def busy_cohort():
    """gpu-queue (32 GPUs) full with a and b (16 each); c (16) and d (8) waiting, oldest first."""
    state = None
    for event in (validated("a", 16), validated("b", 16), validated("c", 16, at="2026-11-29T10:00:01Z"),
                  validated("d", 8, at="2026-11-29T10:00:02Z")):
        state, outputs = step(state, event)
        assert drain_dues(outputs) == []  # arrivals are judged alone, at once
    assert set(state["admitted"]) == {"uid-a", "uid-b"}
    return state


def test_a_quiet_cohort_drains_at_once_and_the_changes_of_the_round_trip_wait_for_one_drain():
    state = busy_cohort()
    state, outputs = step(state, finished("a", "2026-11-29T11:00:00Z"))
    assert reserved(outputs) == ["c"]  # drained at once...
    (due,) = drain_dues(outputs)  # ...and the cohort tells itself on its own stream
    assert due.topic == "qm.workloads" and due.key == COHORT
    assert due.envelope.payload.cohort == COHORT

    # before it comes back: b's quota is released, nothing is admitted, a newcomer waits too
    state, outputs = step(state, finished("b", "2026-11-29T11:00:01Z"))
    assert "workload.released.v1" in [o.envelope.event_type for o in outputs]
    assert reserved(outputs) == [] and drain_dues(outputs) == []
    state, outputs = step(state, validated("e", 4, at="2026-11-29T11:00:02Z"))
    assert outputs == [] and "uid-e" in state["pending"]

    # it comes back: one drain judges them all in Kueue's order, and the window stays open
    state, outputs = step(state, due.envelope)
    assert reserved(outputs) == ["d", "e"]
    (again,) = drain_dues(outputs)

    # the next one finds nothing waiting: the window closes, and a finish drains at once again
    state, outputs = step(state, again.envelope)
    assert outputs == []
    state, outputs = step(state, finished("c", "2026-11-29T11:00:03Z"))
    assert len(drain_dues(outputs)) == 1


def test_a_tick_drains_what_waits_when_the_drain_due_is_late_or_lost():
    state = busy_cohort()
    state, _ = step(state, finished("a", "2026-11-29T11:00:00Z"))
    state, outputs = step(state, finished("b", "2026-11-29T11:00:01Z"))
    assert reserved(outputs) == []
    tick = make_envelope(ClockTick(at="2026-11-29T11:00:05Z", source="test"), producer="test",
                         occurred_at="2026-11-29T11:00:05Z")
    state, outputs = step(state, tick)
    assert reserved(outputs) == ["d"]
    state, outputs = step(state, finished("c", "2026-11-29T11:00:06Z"))
    assert len(drain_dues(outputs)) == 1  # the window was closed by the tick


def test_the_same_stream_gives_the_same_outputs_and_ids():
    def replay():
        state, ids = busy_cohort(), []
        state, outputs = step(state, finished("a", "2026-11-29T11:00:00Z"))
        ids += [o.envelope.event_id for o in outputs]
        (due,) = drain_dues(outputs)
        for event in (finished("b", "2026-11-29T11:00:01Z"), due.envelope):
            state, outputs = step(state, event)
            ids += [o.envelope.event_id for o in outputs]
        return ids, state

    first, state = replay()
    second, again = replay()
    assert first == second and state == again


def test_without_coalescing_every_finish_drains_at_once_and_says_nothing_more():
    state = busy_cohort()
    state, outputs = step(state, finished("a", "2026-11-29T11:00:00Z"), CTX)
    assert reserved(outputs) == ["c"] and drain_dues(outputs) == []
    state, outputs = step(state, finished("b", "2026-11-29T11:00:01Z"), CTX)
    assert reserved(outputs) == ["d"]
