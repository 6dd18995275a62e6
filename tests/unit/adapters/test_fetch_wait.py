"""The worker's aiokafka consumer is built with the runtime's short fetch wait (ADR 0018), not
faust's fixed 1,500 ms: a record on a partition left out of the fetch in flight waits for it."""

from __future__ import annotations

import os
import uuid

import pytest

from services.adapters.runtime import FETCH_MAX_WAIT_MS, FETCH_MIN_BYTES, ServiceRuntime
from services.adapters.settings import Settings


async def test_the_worker_consumer_asks_the_broker_to_hold_a_fetch_no_longer_than_fetch_max_wait():
    runtime = ServiceRuntime(Settings(service="fetch-wait-test", app_id_suffix=f"-{uuid.uuid4().hex[:6]}"))
    thread = runtime.app.consumer._new_consumer_thread()  # what faust's consumer starts with

    consumer = thread._create_worker_consumer(runtime.app.transport)  # built, not connected
    await consumer.stop()

    assert consumer._fetch_max_wait_ms == FETCH_MAX_WAIT_MS != 1500
    assert consumer._fetch_min_bytes == FETCH_MIN_BYTES


@pytest.mark.skipif("QM_FETCH_MAX_WAIT_MS" in os.environ, reason="the suite runs with QM_FETCH_MAX_WAIT_MS set")
def test_the_default_fetch_wait_is_100_ms():
    assert FETCH_MAX_WAIT_MS == 100  # ADR 0018: 25 ms cost CPU and gained nothing


@pytest.mark.skipif("QM_FETCH_MIN_BYTES" in os.environ, reason="the suite runs with QM_FETCH_MIN_BYTES set")
def test_by_default_the_broker_answers_a_fetch_as_soon_as_anything_is_there():
    assert FETCH_MIN_BYTES == 1  # lowest latency; raising it trades latency for CPU (ADR 0018 addendum)


async def test_a_service_may_let_the_broker_gather_more_for_its_agents_and_zero_means_the_default():
    # admission's submission agent passes over most of qm.cluster (ADR 0053)
    runtime = ServiceRuntime(Settings(service="fetch-gather-test", app_id_suffix=f"-{uuid.uuid4().hex[:6]}"))
    runtime.agent_fetch_min_bytes = 16384
    consumer = runtime.app.consumer._new_consumer_thread()._create_worker_consumer(runtime.app.transport)
    await consumer.stop()
    assert (consumer._fetch_min_bytes, consumer._fetch_max_wait_ms) == (16384, FETCH_MAX_WAIT_MS)

    runtime.agent_fetch_min_bytes = None
    consumer = runtime.app.consumer._new_consumer_thread()._create_worker_consumer(runtime.app.transport)
    await consumer.stop()
    assert consumer._fetch_min_bytes == FETCH_MIN_BYTES
