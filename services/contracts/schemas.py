"""Locating and reading schemas/: the event schemas and topics.yaml are the single source."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from services.contracts import yaml_documents


def schemas_dir() -> Path:
    """schemas/ of the checkout (QM_SCHEMAS_DIR overrides, for installed copies)."""
    override = os.environ.get("QM_SCHEMAS_DIR")
    return Path(override) if override else Path(__file__).resolve().parents[2] / "schemas"


@cache
def envelope_schema() -> dict:
    return json.loads((schemas_dir() / "envelope.v1.json").read_text())


@cache
def event_schema(event_type: str) -> dict:
    return json.loads((schemas_dir() / "events" / f"{event_type}.json").read_text())


def event_types() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in (schemas_dir() / "events").glob("*.json"))


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    key: str
    partitions: int
    replication_factor: int
    cleanup_policy: str
    retention_ms: int | None
    events: tuple[str, ...]
    description: str

    @property
    def dlq(self) -> str:
        return f"{self.name}.dlq"


@cache
def topic_specs() -> dict[str, TopicSpec]:
    """topics.yaml as TopicSpecs, by name."""
    document = yaml_documents.load((schemas_dir() / "topics.yaml").read_text())
    defaults = document["defaults"]
    specs = {}
    for entry in document["topics"]:
        specs[entry["name"]] = TopicSpec(
            name=entry["name"],
            key=entry["key"],
            partitions=int(entry.get("partitions", defaults["partitions"])),
            replication_factor=int(entry.get("replication_factor", defaults["replication_factor"])),
            cleanup_policy=entry["cleanup_policy"],
            retention_ms=entry.get("retention_ms"),
            events=tuple(entry.get("events", ())),
            description=entry.get("description", ""),
        )
    return specs


def dlq_retention_ms() -> int:
    return int(yaml_documents.load((schemas_dir() / "topics.yaml").read_text())["defaults"]["dlq_retention_ms"])
