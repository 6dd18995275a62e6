"""Shared fixtures. Kafka tests need the local broker (`make up`); with QM_REQUIRE_KAFKA=1
(as in .ci/run) a missing broker fails the run instead of skipping."""

from __future__ import annotations

import asyncio
import os
import re
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


# Names of the topics a test run makes: a test's prefix (t<10 hex>.), the demo's and the seed
# scenario's per-run prefixes, and faust's internal topics of apps named with a per-run suffix.
# Internal topics of a benchmark (qm-<service>-bench-<hex>-...) are a concurrent run's, never ours.
RUN_TOPIC = re.compile(r"^(t[0-9a-f]{10}\.|(demo|seed)-[0-9a-f]{8}\.|qm-(?![a-z-]*-bench-)[a-z-]+-(demo-|seed-)?[0-9a-f]{8}-)")


async def _topic_names(bootstrap: str) -> set[str]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def kafka_bootstrap():
    if not _broker_answers():
        message = f"no Kafka broker at {BOOTSTRAP}: run `make up` first"
        if os.environ.get("QM_REQUIRE_KAFKA"):
            pytest.fail(message)
        pytest.skip(message)
    before = asyncio.run(_topic_names(BOOTSTRAP))
    yield BOOTSTRAP
    # Every test makes its own topics (a few hundred partitions per run); left behind, they pile
    # up until the broker needs minutes to load them at start. Delete this run's, nothing older.
    from services.adapters.bus import delete_topics

    deleted = asyncio.run(delete_topics(BOOTSTRAP, lambda t: t not in before and RUN_TOPIC.match(t) is not None))
    print(f"\n(deleted the {len(deleted)} topics this test run made)")


@pytest.fixture
def topic_prefix(kafka_bootstrap) -> str:
    """A fresh set of qm.* topics for one test, so tests never see each other's messages."""
    from services.adapters.bus import create_topics

    prefix = f"t{uuid.uuid4().hex[:10]}."
    asyncio.run(create_topics(kafka_bootstrap, prefix))
    return prefix
