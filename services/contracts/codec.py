"""The wire format: an envelope around a typed payload, serialized with orjson.

Producers validate strictly (unknown fields are a bug on our side); consumers validate
leniently (unknown fields from a newer producer are ignored, so additive changes within a
major version never break a reader). Every refusal is a ContractError that names the event
type and the field.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache, lru_cache
from typing import Any

import jsonschema_rs
import orjson
from jsonschema import Draft202012Validator, FormatChecker

from services.contracts.events import RECORD_TYPES
from services.contracts.schemas import envelope_schema, event_schema
from services.core.frozen import quick_init

SCHEMA_VERSION = "1.0"


class ContractError(ValueError):
    """A message does not follow its contract. `where` names the event type and field."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


@quick_init
@dataclass(frozen=True, slots=True)
class Envelope:
    event_id: str
    event_type: str
    occurred_at: str
    producer: str
    payload: Any
    correlation_id: str | None = None
    causation_id: str | None = None
    schema_version: str = SCHEMA_VERSION


def event_id_for(*parts: object) -> str:
    """A deterministic event id: the same inputs always give the same id, so replays dedupe."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:32]


def utc_iso(moment: datetime) -> str:
    """ISO-8601 in UTC with a Z, the only time format on the bus."""
    if moment.tzinfo is None:
        raise ValueError("naive datetime: event times must be timezone-aware (UTC)")
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)  # (Python 3.11 reads the Z itself)


def epoch_of(text: str) -> float:
    """An event time as epoch seconds: an aware datetime's timestamp needs no conversion to UTC
    first (every event a fold reads passes here, ~0.6 us a call against parse_utc's ~1.1)."""
    return datetime.fromisoformat(text).timestamp()


def make_envelope(
    payload: Any,
    *,
    producer: str,
    occurred_at: datetime | str,
    identity: tuple | None = None,
    cause: Envelope | None = None,
) -> Envelope:
    """Wrap a payload record. The event id derives from the event type and `identity`
    (default: the causing event's id and the whole payload), and the causing envelope passes
    on its correlation id."""
    at = occurred_at if isinstance(occurred_at, str) else utc_iso(occurred_at)
    if identity is not None:
        basis = identity
    else:  # the payload itself, and what caused it: the same output of two inputs stays two events
        basis = (cause.event_id if cause else "", orjson.dumps(payload_to_dict(payload), option=orjson.OPT_SORT_KEYS))
    return Envelope(
        event_id=event_id_for(payload.EVENT_TYPE, *basis),
        event_type=payload.EVENT_TYPE,
        occurred_at=at,
        producer=producer,
        payload=payload,
        correlation_id=(cause.correlation_id or cause.event_id) if cause else None,
        causation_id=cause.event_id if cause else None,
    )


def payload_to_dict(payload: Any) -> dict:
    """Record -> JSON-able dict; optional fields left as None are omitted."""
    return {name: v for name in _field_names(type(payload)) if (v := getattr(payload, name)) is not None}


@cache
def _field_names(record_type: type) -> tuple[str, ...]:
    """A record type's field names: ``dataclasses.fields`` builds its tuple on every call, and
    every message a service publishes passes here (for a 45-field ledger row, 40% of the dict)."""
    return tuple(f.name for f in dataclasses.fields(record_type))


def envelope_to_dict(envelope: Envelope) -> dict:
    return {
        "event_id": envelope.event_id,
        "event_type": envelope.event_type,
        "schema_version": envelope.schema_version,
        "occurred_at": envelope.occurred_at,
        "producer": envelope.producer,
        "correlation_id": envelope.correlation_id,
        "causation_id": envelope.causation_id,
        "payload": payload_to_dict(envelope.payload),
    }


def encode(envelope: Envelope) -> bytes:
    """Validate strictly and serialize. Raises ContractError naming the field."""
    document = envelope_to_dict(envelope)
    validate_document(document, strict=True)
    return orjson.dumps(document)


def decode(data: bytes | str) -> Envelope:
    """Parse and validate leniently. Raises ContractError for anything unreadable."""
    return from_document(parse(data))


#: The most envelopes one bundle record carries (ADR 0034); a producer splits a longer run.
BUNDLE_MAX = 100


def encode_bundle(envelopes: list[Envelope]) -> list[tuple[bytes, int]]:
    """Envelopes bound for one topic and key, in their order, as few records as possible: runs
    of up to BUNDLE_MAX as one JSON array of envelopes each (ADR 0034), with how many each
    holds. A run of one stays a plain envelope. Each is validated strictly, as by encode."""
    encoded = [encode(envelope) for envelope in envelopes]
    return [
        (run[0] if len(run) == 1 else b"[" + b",".join(run) + b"]", len(run))
        for run in (encoded[i : i + BUNDLE_MAX] for i in range(0, len(encoded), BUNDLE_MAX))
    ]


def documents_of(data: bytes | str) -> list[Any]:
    """The envelope documents of a record, unvalidated: one for a plain envelope, each element
    of a bundle in order. Raises ContractError if it is not JSON or an empty bundle."""
    document = parse(data)
    if not isinstance(document, list):
        return [document]
    if not document:
        raise ContractError("message", "an empty bundle (a JSON array with no envelopes)")
    return document


def in_bundle(index: int, count: int) -> str:
    """Where an envelope sits, for error messages: '' for a record of one envelope."""
    return f"envelope {index + 1} of {count} in the record: " if count > 1 else ""


def envelope_of(document: Any, wanted: frozenset[str] | None = None) -> Envelope | None:
    """The envelope of one parsed document, or None for a well-formed one of a known event type
    that is not `wanted` (passed over unvalidated). Raises ContractError for anything unreadable,
    including an unknown event type."""
    if wanted is not None and isinstance(document, dict):
        event_type = document.get("event_type")
        if event_type not in wanted and event_type in RECORD_TYPES:
            return None
    return from_document(document)


def envelopes_in(
    documents: list[Any], wanted: frozenset[str] | None = None
) -> Iterator[tuple[int, Any, Envelope | None | ContractError]]:
    """(index, document, what envelope_of makes of it) for each document of a record, in order;
    a refusal comes back as its ContractError, naming the envelope's place in a bundle."""
    for index, document in enumerate(documents):
        try:
            yield index, document, envelope_of(document, wanted)
        except ContractError as error:
            yield index, document, ContractError(f"{in_bundle(index, len(documents))}{error.where}", error.problem)


def decode_all(data: bytes | str) -> list[Envelope]:
    """Every envelope of a record (one, or a bundle's, in order), validated leniently. Raises
    ContractError naming the envelope's place in a bundle."""
    envelopes = []
    for _, _, envelope in envelopes_in(documents_of(data)):
        if isinstance(envelope, ContractError):
            raise envelope
        envelopes.append(envelope)
    return envelopes


def parse(data: bytes | str) -> Any:
    """The JSON document of a message, unvalidated. Raises ContractError if it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ContractError("message", f"not valid JSON ({exc})") from None


def from_document(document: Any) -> Envelope:
    validate_document(document, strict=False)
    record_type = RECORD_TYPES[document["event_type"]]
    fields = document["payload"]
    try:
        payload = record_type(**fields)  # the common case: every field is one the record knows
    except TypeError:  # fields of a newer minor version (the schema let them through): dropped
        known = record_type.__dataclass_fields__
        payload = record_type(**{k: v for k, v in fields.items() if k in known})
    return Envelope(
        event_id=document["event_id"],
        event_type=document["event_type"],
        occurred_at=document["occurred_at"],
        producer=document["producer"],
        payload=payload,
        correlation_id=document.get("correlation_id"),
        causation_id=document.get("causation_id"),
        schema_version=document["schema_version"],
    )


def validate_document(document: Any, *, strict: bool) -> None:
    if not isinstance(document, dict):
        raise ContractError("message", f"expected a JSON object, got {type(document).__name__}")
    event_type = document.get("event_type")
    checker = _whole_check(event_type, strict) if event_type.__class__ is str and event_type in RECORD_TYPES else None
    if checker is not None and checker(document):
        return  # the common case: envelope and payload valid, in one check
    # the envelope, then the payload, each with its own checker: the refusal names the part
    _raise_first(_validator("envelope", strict), document, "envelope")
    event_type = document["event_type"]
    if event_type not in RECORD_TYPES:
        major = event_type.rsplit(".v", 1)[-1]
        raise ContractError(
            f"envelope.event_type {event_type!r}",
            f"unknown event type (major version {major}); known types: see schemas/events/",
        )
    _raise_first(_validator(event_type, strict), document["payload"], event_type, prefix="payload")


def _raise_first(validator: _Checker, instance: Any, where: str, prefix: str = "") -> None:
    if validator.fast(instance):
        return
    # find and word the error with jsonschema: slower, but only on the refusal path
    error = min(validator.full.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)), default=None)
    if error is not None:
        raise ContractError(f"{where}: {_field_path(prefix, error.absolute_path)}", error.message)


def _field_path(prefix: str, path: Any) -> str:
    """('payload', ['pod_sets', 0, 'count']) -> 'payload.pod_sets[0].count'."""
    text = prefix
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


_formats = FormatChecker()


@_formats.checks("date-time", raises=ValueError)
def _is_utc_timestamp(value: object) -> bool:
    """RFC 3339 with an explicit offset (we write Z); jsonschema does not check this by itself."""
    if not isinstance(value, str):
        return True
    if not ("T" in value and (value.endswith("Z") or value[-6] in "+-")):
        raise ValueError("needs a date, a time and a UTC offset, e.g. 2026-11-29T10:00:00Z")
    datetime.fromisoformat(value.replace("Z", "+00:00"))
    return True


@dataclass(frozen=True, slots=True)
class _Checker:
    """A compiled yes/no check for the common (valid) case, and jsonschema to word a refusal.

    The fast check is jsonschema-rs (compiled Rust; ADR 0038): at every hop of every service it
    took half the time of fastjsonschema's generated Python. It checks dates with our own rule,
    and a record it refuses is judged again by the full validator, which has the last word."""

    fast: Callable[[Any], bool]
    full: Draft202012Validator


@cache
def _validator(name: str, strict: bool) -> _Checker:
    schema = envelope_schema() if name == "envelope" else event_schema(name)
    if not strict:
        schema = _tolerate_unknown_fields(copy.deepcopy(schema))
    fast = jsonschema_rs.validator_for(schema, formats={"date-time": _fast_date_time}, validate_formats=True)
    return _Checker(fast.is_valid, Draft202012Validator(schema, format_checker=_formats))


@cache
def _whole_check(event_type: str, strict: bool) -> Callable[[Any], bool] | None:
    """A yes/no check of a whole envelope document of one event type, its payload included
    (None if that type's schema has a date below its top level).

    One jsonschema-rs call over the envelope schema with the event's schema in place of its
    `payload` object, where two calls (envelope, payload) took ~40% longer. The schemas' dates
    are checked here in Python with the same cached rule, not by jsonschema-rs calling back
    into Python for each one (~0.5 us a date). A `False` is worded by validate_document's
    two-step path, which has the last word."""
    envelope = envelope_schema()
    payload = copy.deepcopy(event_schema(event_type))
    envelope_dates, payload_dates = _top_level_dates(envelope), _top_level_dates(payload)
    if payload_dates is None or envelope_dates is None:
        return None
    for key in ("$schema", "$id"):
        payload.pop(key, None)
    whole = copy.deepcopy(envelope)
    whole["properties"]["payload"] = payload
    if not strict:
        whole = _tolerate_unknown_fields(whole)
    return _whole_checker(jsonschema_rs.validator_for(whole, validate_formats=False).is_valid,
                          envelope_dates, payload_dates)


def _whole_checker(is_valid: Callable[[Any], bool], envelope_dates: tuple[str, ...],
                   payload_dates: tuple[str, ...]) -> Callable[[Any], bool]:
    def check(document: Any) -> bool:
        if not is_valid(document):
            return False
        for name in envelope_dates:
            value = document.get(name)
            if value.__class__ is str and not _fast_date_time(value):
                return False
        payload = document["payload"]
        for name in payload_dates:
            value = payload.get(name)
            if value.__class__ is str and not _fast_date_time(value):
                return False
        return True

    return check


def _top_level_dates(schema: dict) -> tuple[str, ...] | None:
    """The names of a schema's top-level date-time properties; None if a date-time is nested
    anywhere deeper (then it needs jsonschema-rs's callback)."""
    top = tuple(name for name, spec in schema.get("properties", {}).items() if spec.get("format") == "date-time")
    return None if _count_dates(schema) != len(top) else top


def _count_dates(node: Any) -> int:
    if isinstance(node, dict):
        return (node.get("format") == "date-time") + sum(_count_dates(value) for value in node.values())
    if isinstance(node, list):
        return sum(_count_dates(value) for value in node)
    return 0


@lru_cache(maxsize=16384)
def _fast_date_time(value: str) -> bool:
    """The fast check's date rule. Cached: jsonschema-rs calls it for every date of every message
    validated, and messages near in time share their dates (a ledger row names four hours); the
    check was over half of validating a ledger row."""
    try:
        return _is_utc_timestamp(value)
    except ValueError:
        return False


def _tolerate_unknown_fields(node: Any) -> Any:
    if isinstance(node, dict):
        if node.get("additionalProperties") is False:
            del node["additionalProperties"]
        for value in node.values():
            _tolerate_unknown_fields(value)
    elif isinstance(node, list):
        for value in node:
            _tolerate_unknown_fields(value)
    return node
