"""Admission waits while the queue-manager is behind its stream (ADR 0049).

Admission is the pipeline's entry and can judge a burst faster than the queue-manager can
decide it. What it validates then waits in the queue-manager's pending sets, ahead of the
finishes that would free quota on the same cohort stream: its view of the cohort stays full of
workloads that have already finished, every drain searches for victims among them, and it
falls further behind (kueue-large-scale: 29 s behind, nothing running for 28 s). Waiting
upstream is cheaper: a submission not yet judged costs nobody anything.

* `Pace` is the pure rule: pause while more than `max_behind` records of the stream are past
  what the consumer group has committed; go on when it is back at or under it, or when the lag
  cannot be read (no group yet, the broker not answering): admission never stops on its own.
* `GroupLag` reads the lag from the broker, as any Kafka lag monitor does: the group's
  committed offsets against the topic's end offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient


class Pace:
    """Whether to go on, from the latest lag reading; `wait()` returns at once unless paused."""

    def __init__(self, max_behind: int) -> None:
        self.max_behind = max_behind
        self.behind: int | None = None  # the latest reading (None: not known)
        self.pauses = 0  # how many times it paused
        self._going = asyncio.Event()
        self._going.set()

    @property
    def paused(self) -> bool:
        return not self._going.is_set()

    def saw(self, behind: int | None) -> bool:
        """Take a reading; True when this reading paused or resumed."""
        self.behind = behind
        pause = behind is not None and behind > self.max_behind
        if pause == self.paused:
            return False
        if pause:
            self.pauses += 1
            self._going.clear()
        else:
            self._going.set()
        return True

    async def wait(self) -> None:
        await self._going.wait()


class GroupLag:
    """How many records of `topic` consumer group `group` has not committed yet (summed over
    the partitions it has committed on); None while the group has committed nothing there."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        self._admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await self._admin.start()
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)  # end offsets only: no group
        await self._consumer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()

    async def records_behind(self) -> int | None:
        assert self._admin is not None and self._consumer is not None, "start() first"
        committed = await self._admin.list_consumer_group_offsets(self.group)
        at = {tp: meta.offset for tp, meta in committed.items() if tp.topic == self.topic and meta.offset >= 0}
        if not at:
            return None
        ends = await self._consumer.end_offsets(list(at))
        return sum(max(0, ends[tp] - offset) for tp, offset in at.items())


async def follow_lag(read: Callable[[], Awaitable[int | None]], pace: Pace, every_s: float,
                     on_change: Callable[[Pace], None]) -> None:
    """Read the lag every `every_s` into `pace` for ever; a failed reading counts as unknown."""
    while True:
        try:
            behind = await read()
        except Exception:  # noqa: BLE001 - the broker away for a moment: do not hold admission
            behind = None
        if pace.saw(behind):
            on_change(pace)
        await asyncio.sleep(every_s)

