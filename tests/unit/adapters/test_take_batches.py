"""take_batches: a batched agent's batches, asleep while nothing comes (ADR 0058). Driven on a
faust channel stream of a real faust App; no broker is involved."""

from __future__ import annotations

import asyncio

import faust
import pytest

from services.adapters.take_batches import take_batches


@pytest.fixture
async def stream():
    app = faust.App("take-batches-test", broker="kafka://127.0.0.1:1", store="memory://")
    app.flow_control.resume()  # an app that is not started holds its channels' senders
    return app.stream(app.channel())


class Batches:
    """The values of every batch `take_batches` yields, read in a task of its own."""

    def __init__(self, stream, max_: int, within: float) -> None:
        self.stream = stream
        self.values: list[list[int]] = []
        self.came = asyncio.Event()
        self.generator = take_batches(stream, max_, within)
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for batch in self.generator:
            self.values.append([event.value for event in batch])
            self.came.set()

    async def send(self, *values: int) -> None:
        for _ in range(200):  # a channel drops what it is sent before the stream subscribes
            if (self.stream.channel._root or self.stream.channel).subscriber_count:
                break
            await asyncio.sleep(0.01)
        for value in values:
            await self.stream.channel.send(value=value)

    async def next_batch(self, timeout: float = 2.0) -> list[int]:
        await asyncio.wait_for(self.came.wait(), timeout)
        self.came.clear()
        return self.values[-1]

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_events_sent_together_come_in_batches_of_at_most_max_in_order(stream):
    batches = Batches(stream, max_=3, within=0.5)  # long: even a slow machine sends all 7 within it
    await batches.send(*range(7))
    for _ in range(500):
        if len(batches.values) == 3:
            break
        await asyncio.sleep(0.01)
    await batches.close()
    assert batches.values == [[0, 1, 2], [3, 4, 5], [6]]


async def test_an_idle_agent_sleeps_until_an_event_comes(stream):
    """faust's take_events woke every `within` with nothing to read: ~40 times in these 200 ms."""
    waits_with_a_timeout = 0
    wait_for_stopped = stream.wait_for_stopped

    async def counted(*coros, timeout=None):
        nonlocal waits_with_a_timeout
        waits_with_a_timeout += timeout is not None
        return await wait_for_stopped(*coros, timeout=timeout)

    stream.wait_for_stopped = counted
    batches = Batches(stream, max_=100, within=0.005)
    await batches.send(1)
    assert await batches.next_batch() == [1]
    waits_with_a_timeout = 0
    await asyncio.sleep(0.2)
    assert waits_with_a_timeout == 0
    await batches.send(2)
    assert await batches.next_batch() == [2]
    await batches.close()


async def test_events_after_a_quiet_spell_come_together_at_the_next_tick(stream):
    loop = asyncio.get_running_loop()
    batches = Batches(stream, max_=100, within=0.2)
    await batches.send(0)
    assert await batches.next_batch() == [0]
    await asyncio.sleep(0.5)  # ticks with nothing to take: slept through
    sent = loop.time()
    await batches.send(1, 2)
    assert await batches.next_batch() == [1, 2]
    assert loop.time() - sent < 0.2 + 0.3  # the next tick is at most `within` away (slack: a slow machine)
    await batches.close()


async def test_the_generator_is_registered_for_the_stream_to_close_it(stream):
    batches = Batches(stream, max_=10, within=0.01)
    assert batches.generator in stream._active_agens
    await batches.close()
