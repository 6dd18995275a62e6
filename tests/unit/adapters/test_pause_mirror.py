"""faust's partition pauses reach aiokafka's consumer, on the consumer's own thread (ADR 0015).

A fake consumer thread (a real event loop in a real thread, a consumer that refuses
partitions it is not assigned, as aiokafka's does) stands in for faust's."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from aiokafka import TopicPartition
from faust.types import TP

from services.adapters.runtime import mirror_pause


class FakeAiokafkaConsumer:
    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.paused: set[TopicPartition] = set()
        self.threads: set[int] = set()

    def _check(self, tp: TopicPartition) -> None:
        self.threads.add(threading.get_ident())
        if not isinstance(tp, TopicPartition):
            raise TypeError("partitions must be TopicPartition namedtuples")
        if tp not in self.assigned:
            raise RuntimeError(f"No current assignment for partition {tp}")

    def pause(self, tp: TopicPartition) -> None:
        self._check(tp)
        self.paused.add(tp)

    def resume(self, tp: TopicPartition) -> None:
        self._check(tp)
        self.paused.discard(tp)


def _consumer_thread(consumer: FakeAiokafkaConsumer):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return SimpleNamespace(_consumer=consumer, thread_loop=loop), thread


def _settle(loop: asyncio.AbstractEventLoop) -> None:
    """Wait until the loop ran everything scheduled on it so far."""
    done = threading.Event()
    loop.call_soon_threadsafe(done.set)
    assert done.wait(5)


def test_pauses_and_resumes_reach_aiokafka_on_its_thread_and_skip_partitions_no_longer_assigned():
    changelog, stream = TopicPartition("app-table-changelog", 0), TopicPartition("qm.workloads", 1)
    consumer = FakeAiokafkaConsumer({changelog, stream})
    fake, thread = _consumer_thread(consumer)
    try:
        mirror_pause(fake, [TP("app-table-changelog", 0), TP("qm.workloads", 1), TP("revoked", 3)], pause=True)
        _settle(fake.thread_loop)
        assert consumer.paused == {changelog, stream}  # the revoked partition is skipped, the rest applied
        assert consumer.threads == {thread.ident}  # never on the caller's thread
        mirror_pause(fake, [TP("qm.workloads", 1)], pause=False)
        _settle(fake.thread_loop)
        assert consumer.paused == {changelog}  # a recovered table's changelog stays unfetched
    finally:
        fake.thread_loop.call_soon_threadsafe(fake.thread_loop.stop)
        thread.join(5)
        fake.thread_loop.close()


def test_nothing_happens_before_the_consumer_thread_runs_or_after_its_loop_closed():
    mirror_pause(SimpleNamespace(_consumer=None, thread_loop=None), [TP("t", 0)], pause=True)
    closed = asyncio.new_event_loop()
    closed.close()
    consumer = FakeAiokafkaConsumer({TopicPartition("t", 0)})
    mirror_pause(SimpleNamespace(_consumer=consumer, thread_loop=closed), [TP("t", 0)], pause=True)
    assert consumer.paused == set()
