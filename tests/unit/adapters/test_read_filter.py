"""What a service passes over unread on a shared topic, and what it still dead-letters."""

from __future__ import annotations

import orjson
import pytest

from services.adapters.bus import TypeSieve, read_envelope
from services.contracts.codec import ContractError, encode, make_envelope
from services.contracts.events import ClockTick, WorkloadFinished

FINISHED = encode(make_envelope(
    WorkloadFinished(uid="u1", namespace="ns", name="w", succeeded=True, finished_at="2026-11-29T10:00:00Z"),
    producer="test", occurred_at="2026-11-29T10:00:00Z",
))
READS_FINISHES = frozenset({WorkloadFinished.EVENT_TYPE})


def test_a_wanted_event_is_read_and_validated():
    envelope = read_envelope(FINISHED, READS_FINISHES)
    assert envelope is not None and envelope.payload.uid == "u1"


def test_a_known_event_the_handler_does_not_read_is_passed_over():
    tick = encode(make_envelope(ClockTick(at="2026-11-29T10:00:00Z", source="test"), producer="test",
                                occurred_at="2026-11-29T10:00:00Z"))
    assert read_envelope(tick, READS_FINISHES) is None
    assert read_envelope(tick, None).payload.source == "test"  # without a filter, everything is read


def test_unreadable_messages_are_still_refused_whatever_the_filter():
    with pytest.raises(ContractError, match="not valid JSON"):
        read_envelope(b"{not json", READS_FINISHES)
    unknown = orjson.loads(FINISHED)
    unknown["event_type"] = "workload.teleported.v1"
    with pytest.raises(ContractError, match="unknown event type"):
        read_envelope(orjson.dumps(unknown), READS_FINISHES)
    broken = orjson.loads(FINISHED)
    del broken["payload"]["uid"]
    with pytest.raises(ContractError, match="uid"):
        read_envelope(orjson.dumps(broken), READS_FINISHES)


TICK = encode(make_envelope(ClockTick(at="2026-11-29T10:00:00Z", source="test"), producer="test",
                            occurred_at="2026-11-29T10:00:00Z"))


def test_the_sieve_drops_only_what_the_reader_would_pass_over_anyway():
    """ADR 0030: dropped on arrival exactly when read_envelope would answer None."""
    sieve = TypeSieve(READS_FINISHES)
    assert sieve.unread(TICK)  # a known type the reader does not read
    assert read_envelope(TICK, READS_FINISHES) is None  # ...which it would pass over once parsed
    assert not sieve.unread(FINISHED)  # a type it reads


def test_the_sieve_delivers_whatever_might_concern_the_reader_or_be_unreadable():
    sieve = TypeSieve(READS_FINISHES)
    mentions = orjson.loads(TICK)
    mentions["payload"]["source"] = WorkloadFinished.EVENT_TYPE  # a wanted type's name, anywhere
    unknown = orjson.loads(TICK)
    unknown["event_type"] = "workload.teleported.v1"
    truncated = TICK[:-2]  # names an unread type, but is not JSON: dead-lettered by the reader
    for value in (orjson.dumps(mentions), orjson.dumps(unknown), truncated, b"{not json", b"", None,
                  b'{"event_id":"x","payload":{}}', b'["clock.tick.v1"]'):
        assert not sieve.unread(value), value
    with pytest.raises(ContractError, match="not valid JSON"):
        read_envelope(truncated, READS_FINISHES)
    assert read_envelope(orjson.dumps(mentions), READS_FINISHES) is None  # delivered, then passed over
    assert not TypeSieve(frozenset({ClockTick.EVENT_TYPE, WorkloadFinished.EVENT_TYPE})).unread(TICK)
