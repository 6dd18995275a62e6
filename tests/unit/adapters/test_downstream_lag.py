"""Admission's pace (ADR 0049): it waits while the queue-manager is too far behind, goes on when
it is back, and never stops on a lag it cannot read. GroupLag's reading of the broker is in
tests/integration/test_downstream_lag.py."""

from __future__ import annotations

import asyncio

import pytest

from services.adapters.downstream_lag import Pace, follow_lag


def test_it_pauses_over_the_limit_and_goes_on_at_or_under_it():
    pace = Pace(max_behind=300)
    assert [pace.saw(n) for n in (10, 300, 301, 5000, 301, 300, 299)] == [False, False, True, False, False, True,
                                                                            False]
    assert not pace.paused and pace.pauses == 1 and pace.behind == 299


def test_a_lag_it_cannot_read_never_holds_admission():
    pace = Pace(max_behind=300)
    pace.saw(400)
    assert pace.paused
    assert pace.saw(None) and not pace.paused  # the group gone, the broker away: go on


async def test_waiting_ends_when_the_queue_manager_catches_up():
    pace = Pace(max_behind=300)
    pace.saw(1000)
    waiting = asyncio.create_task(pace.wait())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    pace.saw(200)
    await asyncio.wait_for(waiting, 1)
    await asyncio.wait_for(pace.wait(), 1)  # not paused: at once


async def test_following_reads_until_cancelled_and_says_each_change():
    readings = iter([50, 900, 800, RuntimeError("broker away"), 100, 100])
    said: list[tuple[bool, int | None]] = []
    done = asyncio.Event()

    async def read() -> int | None:
        value = next(readings, None)
        if value is None:
            done.set()
            return 0
        if isinstance(value, Exception):
            raise value
        return value

    pace = Pace(max_behind=300)
    task = asyncio.create_task(follow_lag(read, pace, 0.0, lambda p: said.append((p.paused, p.behind))))
    await asyncio.wait_for(done.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # paused at 900; a failed reading counts as unknown (go on); 100 stays going
    assert said == [(True, 900), (False, None)]
