"""Tables whose recovery decodes each key's last changelog record only.

faust decodes every changelog record it reads back while recovering a table, as the record
arrives, before it knows whether a later record of the same key supersedes it. A queue-manager
value is a whole cohort (up to megabytes of JSON) and a cohort is written many times before
the changelog is compacted: the restart in `make bench-recovery` (100,000 workloads, 2,330
changelog records) spent 60% of its 21.6 s in `orjson.loads` of values it then overwrote.

Here the changelog topic is read as raw bytes:
* the memory store keeps each key's latest bytes and decodes them once, when recovery
  completes (or earlier, if something reads the key first);
* the rocksdb store writes the record's bytes as they are (faust's own RocksDB store never
  used the decoded value), so it decodes nothing at all during recovery.
Values are still written through the table's JSON serializer, so the changelog's format is
unchanged and either side of an upgrade reads the other's records.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import faust
import orjson
from faust.stores import memory


class _DecodedOnRead(dict):
    """A memory store's values, where a value recovered from the changelog may still be its
    JSON bytes until first read. Table values are JSON-able documents, never bytes, so bytes
    can only mean "not decoded yet"."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if value.__class__ is bytes:
            value = orjson.loads(value)
            dict.__setitem__(self, key, value)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def items(self) -> Iterator[tuple[Any, Any]]:  # type: ignore[override]
        return ((key, self[key]) for key in list(self.keys()))

    def values(self) -> Iterator[Any]:  # type: ignore[override]
        return (self[key] for key in list(self.keys()))

    def copy(self) -> dict:
        return {key: self[key] for key in list(self.keys())}

    def decode_pending(self) -> None:
        """Decode every value still in bytes."""
        for key in [key for key, value in dict.items(self) if value.__class__ is bytes]:
            self[key]


class _MemoryStore(memory.Store):
    """faust's memory store, holding recovered values as bytes until recovery completes."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.data = _DecodedOnRead()

    async def on_recovery_completed(self, active_tps: Any, standby_tps: Any) -> None:
        await super().on_recovery_completed(active_tps, standby_tps)
        self.data.decode_pending()  # the agents read these next; one decode per key, now


class RecoveredTable(faust.Table):
    """faust.Table with its changelog read back as raw bytes (see the module docstring)."""

    def _new_changelog_topic(self, *, retention: Any = None, compacting: Any = None, deleting: Any = None) -> Any:
        # faust 0.15's Collection._new_changelog_topic with one change, the value serializer:
        # only the reading side changes, as send_changelog passes the table's own serializer.
        return self.app.topic(
            self._changelog_topic_name(),
            schema=self.schema,
            key_type=self.key_type,
            value_type=self.value_type,
            key_serializer=self.key_serializer,
            value_serializer="raw",
            partitions=self.partitions,
            retention=retention,
            compacting=self._changelog_compacting if compacting is None else compacting,
            deleting=self._changelog_deleting if deleting is None else deleting,
            acks=False,
            internal=True,
            config=self.extra_topic_configs,
            maxsize=131_072,
            allow_empty=True,
        )

    def _new_store_by_url(self, url: Any) -> Any:
        if str(url).startswith("memory:"):
            return _MemoryStore(url, self.app, self, table_name=self.name, key_type=self.key_type,
                                key_serializer=self.key_serializer, value_serializer=self.value_serializer,
                                value_type=self.value_type, loop=self.loop, options=self.options)
        return super()._new_store_by_url(url)
