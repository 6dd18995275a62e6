"""A typed record and its JSON Schema must never drift apart."""

from __future__ import annotations

import dataclasses

import pytest

from services.contracts.events import RECORD_TYPES
from services.contracts.schemas import event_schema, event_types


def test_one_record_per_schema():
    assert sorted(RECORD_TYPES) == event_types()


@pytest.mark.parametrize("event_type", event_types())
def test_record_fields_are_the_schema_properties(event_type):
    record = RECORD_TYPES[event_type]
    schema = event_schema(event_type)
    fields = {f.name: f for f in dataclasses.fields(record)}
    assert set(fields) == set(schema["properties"])
    required = {name for name, f in fields.items() if f.default is dataclasses.MISSING}
    assert required == set(schema["required"])
    assert record.EVENT_TYPE == event_type
    assert record.__dataclass_params__.frozen
