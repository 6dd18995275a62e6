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


async def test_in_a_batch_the_list_grows_in_place_and_the_stored_one_waits_for_the_store(runtime, monkeypatch):
    monkeypatch.setattr(runtime_module, "SEEN_WINDOW", 3)
    table = Table()
    await runtime.apply_once(table, "k", Envelope("a"), count)
    stored = table["k"]["seen"]
    batch = runtime_module._Batch()
    token = runtime_module._current_batch.set(batch)
    try:
        applied = [await runtime.apply_once(table, "k", Envelope(e), count) for e in "bcddeb"]
        staged = batch.staged(table, "k")
        assert staged["seen"] is not stored  # copied once, at the key's first event of the batch
        assert not await runtime.apply_once(table, "k", Envelope("e"), count)
    finally:
        runtime_module._current_batch.reset(token)
    assert applied == [True, True, True, False, True, True]  # "b" had left the window of 3
    assert staged["seen"] == ["d", "e", "b"] and staged["state"] == 6
    assert stored == ["a"] and table["k"]["seen"] == ["a"]  # untouched until the batch is stored
