"""apply_once's duplicate check: a window of SEEN_WINDOW event ids per key, looked up in a set
kept beside the stored list."""

from __future__ import annotations

import uuid

import pytest

from services.adapters import runtime as runtime_module
from services.adapters.runtime import ServiceRuntime
from services.adapters.settings import Settings


class Envelope:
    def __init__(self, event_id: str) -> None:
        self.event_id = event_id


class Table(dict):
    name = "t"


@pytest.fixture
def runtime():
    return ServiceRuntime(Settings(service="seen-test", app_id_suffix=f"-{uuid.uuid4().hex[:6]}"))


def count(state, envelope):
    return (state or 0) + 1, []


async def test_duplicates_within_the_window_are_skipped_and_older_ones_forgotten(runtime, monkeypatch):
    monkeypatch.setattr(runtime_module, "SEEN_WINDOW", 3)
    table = Table()
    applied = [await runtime.apply_once(table, "k", Envelope(e), count) for e in "abcab"]
    assert applied == [True, True, True, False, False]
    assert table["k"]["seen"] == ["a", "b", "c"]
    assert await runtime.apply_once(table, "k", Envelope("d"), count)  # "a" leaves the window
    assert table["k"]["seen"] == ["b", "c", "d"]
    assert await runtime.apply_once(table, "k", Envelope("a"), count)
    assert not await runtime.apply_once(table, "k", Envelope("d"), count)
    assert table["k"]["state"] == 5


async def test_a_stored_list_other_than_the_indexed_one_is_read_as_it_is(runtime):
    table = Table()
    await runtime.apply_once(table, "k", Envelope("a"), count)
    table["k"] = {"state": 0, "seen": ["x"]}  # e.g. recovered from the changelog
    assert await runtime.apply_once(table, "k", Envelope("a"), count)
    assert not await runtime.apply_once(table, "k", Envelope("x"), count)
