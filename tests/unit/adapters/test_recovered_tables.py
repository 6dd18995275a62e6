"""A table's recovery decodes each key's last changelog record only (services/adapters/recovered_tables.py).

A real faust App and Table (never started: no broker), fed changelog records as faust's
recovery hands them over."""

from __future__ import annotations

from types import SimpleNamespace

import faust
import orjson
import pytest
from faust.types import TP

from services.adapters.recovered_tables import RecoveredTable


def _app(store: str = "memory://") -> faust.App:
    return faust.App("qm-test-recovered", broker="kafka://127.0.0.1:1", store=store, Table=RecoveredTable)


def _record(key: str, value: dict | None, partition: int = 0):
    raw = None if value is None else orjson.dumps(value)
    # What faust's recovery passes: the event's value as the changelog topic decoded it.
    return SimpleNamespace(key=key, value=raw, message=SimpleNamespace(key=key.encode(), value=raw, partition=partition))


def test_the_changelog_is_read_as_bytes_and_still_written_as_json():
    table = _app().Table("cohorts", default=None, partitions=4)
    assert isinstance(table, RecoveredTable)
    changelog = table.changelog_topic
    assert changelog.get_topic_name() == "qm-test-recovered-cohorts-changelog"
    assert changelog.partitions == 4 and changelog.internal
    message = SimpleNamespace(key=b'"c"', value=b'{"state": 1}', headers={})
    assert changelog.schema.loads_value(table.app, message) == b'{"state": 1}'  # not decoded on arrival
    # Values are written through the table's own serializer: the changelog's format is unchanged.
    assert table.value_serializer == "json"


async def test_recovery_decodes_only_the_last_value_of_each_key():
    table = _app().Table("cohorts", default=None, partitions=4)
    older = {"state": {"workloads": list(range(1000))}, "seen": []}
    table.apply_changelog_batch([
        _record("cohort-a", {"state": "first", "seen": []}),
        _record("cohort-a", older),
        _record("cohort-b", {"state": "b", "seen": ["e1"]}, partition=1),
        _record("cohort-a", {"state": "last", "seen": ["e9"]}),
        _record("gone", {"state": "x", "seen": []}, partition=2),
        _record("gone", None, partition=2),  # a tombstone deletes the key
    ])
    raw = dict.items(table.data.data)
    assert {key: type(value) for key, value in raw} == {"cohort-a": bytes, "cohort-b": bytes}

    # Read before recovery completes: decoded on the spot.
    assert table.get("cohort-b") == {"state": "b", "seen": ["e1"]}
    await table.on_recovery_completed({TP("qm-test-recovered-cohorts-changelog", p) for p in range(4)}, set())
    assert all(type(value) is dict for value in dict.values(table.data.data))
    assert table.get("cohort-a") == {"state": "last", "seen": ["e9"]}
    assert table.data.get("gone") is None and "gone" not in table


def test_every_way_of_reading_the_store_sees_documents():
    table = _app().Table("ledger", default=None, partitions=1)
    table.apply_changelog_batch([_record("k1", {"state": 1}), _record("k2", {"state": 2})])
    assert dict(table.items()) == {"k1": {"state": 1}, "k2": {"state": 2}}
    assert list(table.values()) == [{"state": 1}, {"state": 2}]
    assert table.data.copy() == {"k1": {"state": 1}, "k2": {"state": 2}}
    assert table["k1"] == {"state": 1} and table.data.get("missing") is None


def test_rocksdb_keeps_faust_s_own_store():
    pytest.importorskip("rocksdict")
    from faust.stores.rocksdb import Store as RocksStore

    table = _app("rocksdb://").Table("cohorts", default=None, partitions=1)
    # Its recovery writes each record's own bytes (message.value) and decodes nothing.
    assert isinstance(table.data, RocksStore)
    assert table.changelog_topic.schema.value_serializer == "raw"


def test_changelog_segments_roll_every_64_mib_unless_told():
    from services.adapters.runtime import MAX_RECORD_BYTES, changelog_topic_configs

    assert changelog_topic_configs({}) == {"max.message.bytes": str(MAX_RECORD_BYTES), "segment.bytes": "67108864"}
    assert "segment.bytes" not in changelog_topic_configs({"QM_CHANGELOG_SEGMENT_BYTES": "0"})  # the broker's own
    with pytest.raises(SystemExit, match=r"QM_CHANGELOG_SEGMENT_BYTES='64M': expected bytes"):
        changelog_topic_configs({"QM_CHANGELOG_SEGMENT_BYTES": "64M"})
