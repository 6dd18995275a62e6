"""Shared fixtures. Kafka tests need the local broker (`make up`); with QM_REQUIRE_KAFKA=1
(as in .ci/run) a missing broker fails the run instead of skipping."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BOOTSTRAP = os.environ.get("QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092")


def _broker_answers() -> bool:
    from services.adapters.bus import BrokerUnavailable, wait_for_broker

    try:
        asyncio.run(wait_for_broker(BOOTSTRAP, timeout_s=5 if not os.environ.get("QM_REQUIRE_KAFKA") else 60))
        return True
    except BrokerUnavailable:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    if not _broker_answers():
        message = f"no Kafka broker at {BOOTSTRAP}: run `make up` first"
        if os.environ.get("QM_REQUIRE_KAFKA"):
            pytest.fail(message)
        pytest.skip(message)
    return BOOTSTRAP


@pytest.fixture
def topic_prefix(kafka_bootstrap) -> str:
    """A fresh set of qm.* topics for one test, so tests never see each other's messages."""
    from services.adapters.bus import create_topics

    prefix = f"t{uuid.uuid4().hex[:10]}."
    asyncio.run(create_topics(kafka_bootstrap, prefix))
    return prefix
