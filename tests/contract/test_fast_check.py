"""The compiled yes/no check (jsonschema-rs, ADR 0038) against the full validator that words
refusals: a record the fast check passes is never one the full validator refuses. The one-call
check of a whole envelope (its payload in place, dates checked in Python) gives the same verdict
as the envelope's and the payload's checks together.

If the fast check were more lenient, a bad record would be accepted without a word; if it is
stricter somewhere, the full validator has the last word and only the time is lost. So the
property is checked in the lenient direction, over mutations of every golden example."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.contracts.codec import _validator, _whole_check

EXAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "examples"
VALID = {p.stem: json.loads(p.read_text()) for p in sorted((EXAMPLES / "valid").glob("*.json"))}
INVALID = [json.loads(p.read_text())["message"] for p in sorted((EXAMPLES / "invalid").glob("*.json"))]

# What a mutation puts in a field's place: wrong types, near-miss dates and numbers, extremes.
ODD_VALUES = st.sampled_from([
    None, True, False, 0, -1, 1.5, 1.0, 2**70, "", "x", "1", "-1", "1.5", "1e3", " 1", "1\n",
    "2026-11-29T10:00:00", "2026-11-29t10:00:00z", "2026-11-29 10:00:00Z", "2026-11-29T10:00:00+01:00",
    "2026-13-29T10:00:00Z", "USD", "usd", [], {}, [1], {"a": 1},
])


def _verdicts(name: str, strict: bool, instance: object) -> tuple[bool, bool]:
    checker = _validator(name, strict)
    return checker.fast(instance), next(iter(checker.full.iter_errors(instance)), None) is None


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    """Every place in a document (dict keys and list indexes), parents before children."""
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += _paths(value, (*prefix, index))
    return out


def _mutated(document: dict, path: tuple, action: str, value: object) -> dict:
    document = copy.deepcopy(document)
    if not path:
        return document
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "drop" and isinstance(parent, dict):
        del parent[last]
    elif action == "add" and isinstance(parent, dict):
        parent[f"unknown_{last}"] = value
    else:
        parent[last] = value
    return document


@pytest.mark.parametrize("name", sorted(VALID))
@pytest.mark.parametrize("strict", [True, False])
def test_every_valid_example_passes_the_fast_check(name, strict):
    document = VALID[name]
    assert _validator("envelope", strict).fast(document)
    assert _validator(name, strict).fast(document["payload"])


@pytest.mark.parametrize("strict", [True, False])
def test_every_event_type_has_a_whole_check_and_every_valid_example_passes_it(strict):
    for name, document in VALID.items():
        checker = _whole_check(name, strict)
        assert checker is not None, f"{name}: a date below the top level (the two-step path only)"
        assert checker(document), name


def _two_step(name: str, strict: bool, document: dict) -> bool:
    payload = document.get("payload")
    return (_validator("envelope", strict).fast(document) and isinstance(payload, dict)
            and _validator(name, strict).fast(payload))


@pytest.mark.parametrize("message", INVALID, ids=lambda m: str(m.get("event_type")) if isinstance(m, dict) else "?")
def test_every_invalid_example_fails_a_fast_check(message):
    name = message.get("event_type")
    envelope_ok = _validator("envelope", False).fast(message)
    payload_ok = name in VALID and _validator(name, False).fast(message["payload"])
    assert not (envelope_ok and payload_ok)
    if name in VALID:
        assert not _whole_check(name, False)(message)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), strict=st.booleans(), action=st.sampled_from(["replace", "drop", "add"]), value=ODD_VALUES)
def test_the_fast_check_never_passes_what_the_full_validator_refuses(data, strict, action, value):
    name = data.draw(st.sampled_from(sorted(VALID)))
    document = VALID[name]
    path = data.draw(st.sampled_from(_paths(document)))
    mutated = _mutated(document, path, action, value)
    fast, full = _verdicts("envelope", strict, mutated)
    assert not (fast and not full), f"envelope of {name}: {path} {action} {value!r} passed the fast check only"
    payload = mutated.get("payload")
    if isinstance(payload, dict):
        fast, full = _verdicts(name, strict, payload)
        assert not (fast and not full), f"payload of {name}: {path} {action} {value!r} passed the fast check only"


@settings(max_examples=400, deadline=None)
@given(data=st.data(), strict=st.booleans(), action=st.sampled_from(["replace", "drop", "add"]), value=ODD_VALUES)
def test_the_whole_check_agrees_with_the_envelope_and_payload_checks(data, strict, action, value):
    name = data.draw(st.sampled_from(sorted(VALID)))
    path = data.draw(st.sampled_from([p for p in _paths(VALID[name]) if p != ("event_type",)]))
    mutated = _mutated(VALID[name], path, action, value)
    assert _whole_check(name, strict)(mutated) == _two_step(name, strict, mutated), (
        f"{name}: {path} {action} {value!r}: the whole check and the two-step check disagree")
