"""The golden examples under schemas/examples/ pin the wire format."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from services.contracts.codec import ContractError, decode, encode, envelope_to_dict
from services.contracts.schemas import event_types

EXAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "examples"
VALID = sorted((EXAMPLES / "valid").glob("*.json"))
INVALID = sorted((EXAMPLES / "invalid").glob("*.json"))


def test_every_event_type_has_a_valid_example():
    assert sorted(p.name.removesuffix(".json") for p in VALID) == event_types()


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_example_round_trips_unchanged(path):
    document = json.loads(path.read_text())
    envelope = decode(path.read_bytes())
    assert envelope.event_type == path.stem
    assert envelope_to_dict(envelope) == document
    assert decode(encode(envelope)) == envelope


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_example_is_refused_naming_the_field(path):
    case = json.loads(path.read_text())
    with pytest.raises(ContractError) as refused:
        decode(orjson.dumps(case["message"]))
    assert case["expect_error_at"] in str(refused.value)


def test_consumer_tolerates_unknown_fields_from_a_newer_producer():
    document = json.loads((EXAMPLES / "valid" / "workload.pending.v1.json").read_text())
    document["payload"]["added_in_1_1"] = "something new"
    document["payload_extra"] = None  # unknown envelope field
    envelope = decode(orjson.dumps(document))
    assert envelope.payload.reason == "InsufficientQuota"


def test_producer_refuses_unknown_fields():
    from dataclasses import replace

    envelope = decode((EXAMPLES / "valid" / "clock.tick.v1.json").read_bytes())
    with pytest.raises(ContractError, match="clock.tick.v1: payload.at"):
        encode(replace(envelope, payload=replace(envelope.payload, at="not a time")))


def test_not_json_is_a_contract_error():
    with pytest.raises(ContractError, match="not valid JSON"):
        decode(b"\x00{garbage")
