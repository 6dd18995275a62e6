"""The active configuration as one versioned set on the compacted qm.config topic.

`qm config publish DIR` validates a directory of Kueue, Gatekeeper and quartermaster.dev
objects and publishes them as one `config.snapshot.v1` (key "active"); services follow the
topic without a consumer group, so every replica applies every version. A set that does not
validate is refused by the publisher and, should one arrive anyway, by each service, which
keeps its last good set."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson

from services.contracts.events import ConfigSnapshot
from services.core.quota import Objects, load_objects
from services.policy.loader import Document, PolicySet, read_documents
from services.policy.quota_rules import load_quota_rules

SOURCE_ANNOTATION = "quartermaster.dev/source"
CONFIG_GROUPS = ("kueue.x-k8s.io", "templates.gatekeeper.sh", "constraints.gatekeeper.sh", "quartermaster.dev")


def _group(body: dict) -> str:
    return str(body.get("apiVersion", "")).split("/")[0]


def collect(paths: list[str | Path]) -> list[Document]:
    """The configuration documents under `paths` (samples, suites and other objects are left out)."""
    docs, _ = read_documents(paths)
    return [d for d in docs if _group(d.body) in CONFIG_GROUPS]


def validate(docs: list[Document]) -> tuple[Objects, PolicySet]:
    """Raises ConfigError / PolicyError naming the file, the object and the field."""
    kueue = [(d.file, d.body) for d in docs if _group(d.body) == "kueue.x-k8s.io"]
    objects = load_objects(kueue)
    load_quota_rules(docs, objects)  # QuotaRules must name queues and flavors of this same set
    return objects, PolicySet.from_documents(docs, version=digest(docs))


def digest(docs: list[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(orjson.dumps(d.body, option=orjson.OPT_SORT_KEYS))
    return "sha256:" + h.hexdigest()[:16]


def snapshot(docs: list[Document], version: int, source: str) -> ConfigSnapshot:
    objects = []
    for d in docs:
        body = dict(d.body)
        metadata = dict(body.get("metadata") or {})
        metadata["annotations"] = {**(metadata.get("annotations") or {}), SOURCE_ANNOTATION: f"{d.file}#{d.index}"}
        body["metadata"] = metadata
        objects.append(body)
    return ConfigSnapshot(version=version, digest=digest(docs), objects=objects, source=source)


def documents(config: ConfigSnapshot) -> list[Document]:
    """Back to documents, each still naming the file it came from."""
    out = []
    for body in config.objects:
        source = ((body.get("metadata") or {}).get("annotations") or {}).get(SOURCE_ANNOTATION, "qm.config#0")
        file, _, index = source.rpartition("#")
        out.append(Document(file or source, int(index or 0), body))
    return out
