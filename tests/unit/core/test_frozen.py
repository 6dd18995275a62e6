"""quick_init builds the same instances as the dataclass's own __init__, faster."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import InitVar, dataclass, field

import pytest

from services.contracts.codec import Envelope
from services.contracts.events import RECORD_TYPES, WorkloadRunning
from services.core.frozen import quick_init

CALLS: list[str] = []


def _record_class(quick: bool):
    """Two twins of one class, with and without quick_init, to compare what they build."""

    def post_init(self) -> None:
        CALLS.append(self.name)
        object.__setattr__(self, "size", len(self.name))

    cls = dataclass(frozen=True, slots=True)(type("Twin", (), {
        "__annotations__": {"name": "str", "tags": "list", "note": "str", "size": "int", "labels": "dict"},
        "tags": field(default_factory=list),
        "note": "",
        "size": field(default=0, init=False),
        "labels": field(default_factory=dict, kw_only=True),
        "__post_init__": post_init,
    }))
    return quick_init(cls) if quick else cls


def test_builds_what_the_dataclass_builds():
    slow, quick = _record_class(False), _record_class(True)
    kinds = [[(p.name, p.kind) for p in inspect.signature(c.__init__).parameters.values()] for c in (slow, quick)]
    assert kinds[0] == kinds[1]
    for args, kwargs in [(("a",), {}), (("bb", ["x"]), {"note": "n"}), (("ccc",), {"labels": {"k": "v"}})]:
        CALLS.clear()
        made_slow, made_quick = slow(*args, **kwargs), quick(*args, **kwargs)
        assert CALLS == [args[0], args[0]]  # __post_init__ ran for both
        assert dataclasses.astuple(made_slow) == dataclasses.astuple(made_quick)
        assert made_quick.size == len(args[0])  # set by __post_init__ over the init=False default
    first, second = quick("a"), quick("a")
    assert first.tags is not second.tags  # a fresh list from the factory for each instance
    assert first.labels == {} and first.labels is not second.labels


def test_the_same_signature_and_refusals_as_the_dataclass():
    slow, quick = _record_class(False), _record_class(True)
    for call in (lambda c: c(), lambda c: c("a", note="n", size=3), lambda c: c("a", [], "n", {})):
        with pytest.raises(TypeError) as slow_error:
            call(slow)
        with pytest.raises(TypeError) as quick_error:
            call(quick)
        assert type(slow_error.value) is type(quick_error.value)


def test_instances_stay_frozen_hashable_and_picklable():
    record = WorkloadRunning(uid="u-1", namespace="team-a", name="job", started_at="2026-12-06T01:00:00Z")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.uid = "u-2"  # type: ignore[misc]
    again = WorkloadRunning(uid="u-1", namespace="team-a", name="job", started_at="2026-12-06T01:00:00Z")
    assert record == again and hash(record) == hash(again)
    assert pickle.loads(pickle.dumps(record)) == record
    assert dataclasses.replace(record, uid="u-2").uid == "u-2"
    envelope = Envelope("id", WorkloadRunning.EVENT_TYPE, "2026-12-06T01:00:00Z", "admission", record)
    assert envelope.schema_version == "1.0" and envelope.correlation_id is None


def test_every_record_keeps_its_keyword_only_signature():
    for record_type in RECORD_TYPES.values():
        parameters = list(inspect.signature(record_type.__init__).parameters.values())[1:]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters), record_type.__name__


def test_refuses_what_it_cannot_build_faithfully():
    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        name: str
        secret: InitVar[str] = ""

    @dataclass(slots=True)
    class NotFrozen:
        name: str

    @dataclass(frozen=True)
    class NoSlots:
        name: str

    for cls in (WithInitVar, NotFrozen, NoSlots):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)
