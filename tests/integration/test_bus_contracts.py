"""Every event type survives codec -> real Kafka -> codec unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.adapters.bus import Publisher, read_envelopes
from services.contracts.codec import decode

pytestmark = pytest.mark.kafka
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "schemas" / "examples" / "valid").glob("*.json"))


async def test_every_event_type_round_trips_through_kafka(kafka_bootstrap, topic_prefix):
    sent = [decode(p.read_bytes()) for p in EXAMPLES]
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        for envelope in sent:
            await bus.publish("qm.cluster", envelope.event_id, envelope)
        await bus.flush()
    received = [env async for _, env in read_envelopes(kafka_bootstrap, topic_prefix + "qm.cluster")]
    assert sorted(received, key=lambda e: e.event_id) == sorted(sent, key=lambda e: e.event_id)
