"""QM_EVENT_LOOP picks the workers' event loop before faust creates it (ADR 0019)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from services.adapters.runtime import choose_event_loop


@pytest.fixture
def restore_policy():
    policy = asyncio.get_event_loop_policy()
    yield
    asyncio.set_event_loop_policy(policy)


def test_uvloop_makes_new_loops_uvloop_loops(restore_policy):
    choose_event_loop("test", "uvloop")
    loop = asyncio.new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_an_unknown_loop_stops_the_worker_with_the_choices_named(restore_policy):
    with pytest.raises(SystemExit, match=r"admission: QM_EVENT_LOOP='trio' is not one of uvloop, aio"):
        choose_event_loop("admission", "trio")
