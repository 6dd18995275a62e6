"""A batched agent's batches, asleep while nothing comes (ADR 0058).

faust's ``Stream.take_events(max_, within)`` waits for a full buffer with a timeout of
``within`` and loops, so an agent with nothing to read still wakes every ``within``: at our
5 ms, 200 times a second, each time building and cancelling the futures of mode's
``wait_first``. An idle service's main thread used 3–5% of a core on it, and the stack's four
services about a quarter of a core together, much of it while they had little to do in the
busiest phase of kueue-baseline too (preemption reads a few hundred events in a whole run).

``take_batches`` is the same generator with one more wait: while its buffer is empty it
sleeps until the first event comes. The batch is then yielded when faust's would have been: at
the first tick (every ``within`` since the last batch) that finds it non-empty, or at once when
full. Only the empty ticks are gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from mode.utils.aiter import aiter
from mode.utils.futures import notify


def take_batches(stream: Any, max_: int, within: float) -> AsyncGenerator[list[Any], None]:
    """Events of `stream` in lists of at most `max_`, each yielded at the first tick (every
    `within` seconds since the last) after its first event came, or at once when full, and
    acknowledged once the consumer asks for the next.
    Registered on the stream as faust's own buffering generators are, so stopping the stream
    closes it."""
    batches = _take_batches(stream, max_, within)
    stream._active_agens.add(batches)
    return batches


async def _take_batches(stream: Any, max_: int, within: float) -> AsyncGenerator[list[Any], None]:
    # The body of faust 0.15's Stream.take_events, with the wait for a first event added.
    events: list[Any] = []
    started = asyncio.Event()  # the buffer holds an event
    full = asyncio.Event()
    consumed = asyncio.Event()
    consuming: asyncio.Future | None = None  # set while a batch is with the consumer

    async def add_to_buffer(value: Any) -> Any:
        nonlocal consuming
        try:
            if consuming is not None:  # the last batch is still being handled: wait for it
                try:
                    await consuming
                finally:
                    consuming = None
            event = stream.current_event
            if event is None:
                raise RuntimeError("take_batches found no current event")
            events.append(event)
            if len(events) == 1:
                started.set()
            if len(events) >= max_:
                full.set()
                consumed.clear()  # never more than max_ in one batch
                await stream.wait(consumed)
        except asyncio.CancelledError:  # pragma: no cover
            raise
        except Exception as exc:  # as faust does: the stream crashes, the agent restarts
            stream.log.exception("Error adding to take buffer: %r", exc)
            await stream.crash(exc)
        return value

    acks_were_enabled = stream.enable_acks
    stream.enable_acks = False  # acknowledged here, once handled
    stream.add_processor(add_to_buffer)
    stream._enable_passive(aiter(stream.channel))
    loop = asyncio.get_running_loop()
    ticks_from = loop.time()
    try:
        while not stream.should_stop:
            if not started.is_set():
                await stream.wait_for_stopped(started)  # asleep while nothing comes
            if not full.is_set():
                # faust's loop ticks every `within` from the last batch and yields at the first
                # tick with events: the same tick here, without the empty ones before it
                waited = loop.time() - ticks_from
                await stream.wait_for_stopped(full, timeout=within - waited % within)
            if not events:
                continue
            consuming = loop.create_future()
            try:
                yield list(events)
            finally:
                for event in events:  # the drain waits on `consuming`: nothing is added meanwhile
                    await stream.ack(event)
                events.clear()
                notify(consuming)
                full.clear()
                started.clear()
                consumed.set()
                ticks_from = loop.time()
    finally:
        stream.enable_acks = acks_were_enabled
        stream._processors.remove(add_to_buffer)
