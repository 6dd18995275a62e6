"""ADR 0050: while a cohort's drain_due is on its way, the namespaces whose usage changed wait
for it, and its return says each once with its usage of that moment (a tick, if it is lost)."""

from __future__ import annotations

from services.contracts.codec import make_envelope
from services.contracts.events import WorkloadRunning
from tests.unit.queue_manager.test_drain_coalescing import (
    CTX,
    busy_cohort,
    drain_dues,
    finished,
    reserved,
    step,
)
from tests.unit.queue_manager.test_fold import tick


def usage_records(outputs):
    return [o.envelope.payload for o in outputs if o.topic == "qm.usage"]


def running(name: str, at: str):
    return make_envelope(WorkloadRunning(uid=f"uid-{name}", namespace="ml-team", name=name, started_at=at),
                         producer="test", occurred_at=at)


def test_a_quiet_cohort_says_usage_at_once():
    state = busy_cohort()
    state, outputs = step(state, finished("a", "2026-11-29T11:00:00Z"))  # opens the window
    assert reserved(outputs) == ["c"]
    (said,) = usage_records(outputs)  # a's release and c's reservation, in one record
    assert said.reserved == {"a100-flavor": {"nvidia.com/gpu": 32000}}


def test_changes_in_the_window_are_said_once_when_the_drain_due_returns():
    state = busy_cohort()
    state, outputs = step(state, finished("a", "2026-11-29T11:00:00Z"))
    (due,) = drain_dues(outputs)

    # three changes of ml-team's usage while the drain_due is on its way: none is said yet
    for event in (running("b", "2026-11-29T11:00:01Z"), running("c", "2026-11-29T11:00:02Z"),
                  finished("b", "2026-11-29T11:00:03Z")):
        state, outputs = step(state, event)
        assert usage_records(outputs) == []
    assert state["usage_due"] == {"ml-team": True}

    # it returns: d is admitted into b's quota, and the namespace is said once, as it is now
    state, outputs = step(state, due.envelope)
    assert reserved(outputs) == ["d"]
    (said,) = usage_records(outputs)
    assert said.running == {"a100-flavor": {"nvidia.com/gpu": 16000}}  # c
    assert said.reserved == {"a100-flavor": {"nvidia.com/gpu": 8000}}  # d
    assert "usage_due" not in state


def test_a_tick_says_what_waits_when_the_drain_due_is_lost():
    state = busy_cohort()
    state, _ = step(state, finished("a", "2026-11-29T11:00:00Z"))
    state, outputs = step(state, running("c", "2026-11-29T11:00:01Z"))
    assert usage_records(outputs) == []
    state, outputs = step(state, tick("2026-11-29T11:00:05Z"))
    (said,) = usage_records(outputs)
    assert said.running == {"a100-flavor": {"nvidia.com/gpu": 16000}}
    assert "usage_due" not in state


def test_without_coalescing_every_change_is_said_at_once():
    state = busy_cohort()
    state, _ = step(state, finished("a", "2026-11-29T11:00:00Z"), CTX)
    for event in (running("b", "2026-11-29T11:00:01Z"), running("c", "2026-11-29T11:00:02Z")):
        state, outputs = step(state, event, CTX)
        assert len(usage_records(outputs)) == 1
    assert "usage_due" not in state
