"""The per-cohort cost fold (ADR 0007): one ordered input, one record per workload, a small
record per cohort key.

The service reads only ``qm.workloads`` (keyed by cohort key). Per key it carries, in one
order, every fact cost needs: reservations, running / finished pods, workload finishes,
expiries, evictions, and the queue-manager's per-cohort clock ticks. Each cohort key is folded
by the core (``apply_tracked``) over its own :class:`CostState`; hours close on the cohort's
own ticks only (``close_on_ticks_only``), so the rows of a key are a function of that key's
event sequence: a replay, or a restart with redelivery, produces the same rows (same ids).

Namespace labels (cost centers) are not on ``qm.workloads``: a ``labels(namespace)`` lookup
(the service's LiveReplica of ``qm.cluster``) is consulted on each workload event, and a
change is folded into the cohort's state as a :class:`NamespaceLabeled` before the event, so
the labels a row was priced with are part of the stored state.

Stored records (faust writes each to the changelog partition of the event being processed,
which is the cohort key's partition, so keys can be anything)::

    "cohort|<key>"  {"v": n, "watermarkMs", "closedThroughMs", "namespaceLabels", "configAt",
                     "pos": [source partition, offset, envelope index of the last envelope
                             applied] | None (the index counts within a bundle, ADR 0034),
                     "seen": [last SEEN_WINDOW event ids applied to this key]}
    "<uid>"         {"c": key, "book": json text of book_to_dict | None, "memo": memo | None}
                    (``step`` writes the text as a BookText: ``stored()`` joins it)
                    or {"c": key, "gone": finished_at_ms}   (pruned past the correction horizon)

The cohort record decides whether an event was applied: an envelope at or before ``pos`` (same
source partition: a cohort key's records are in one partition, in offset order; the envelopes of
a bundle record in their order), or an id in
``seen``. Records stay small (~1-2 KB), so a batch writes little. :meth:`CohortLedger.step`
returns the records to write, workload records first and the cohort record last; the shell
stores them after the outputs are acknowledged (ADR 0001). A crash between two writes leaves
each book before or after the event, the cohort record before it: the redelivered event is
recomputed (books already past it skip it: per-book ``seen`` / ``billed_through``) with the
same outputs. Books are JSON *text*: exact usage sums exceed 64 bits, which orjson refuses
(and ``orjson.loads`` would turn into floats: read them with ``json``). The text is
``book_to_json``'s, equal to ``json.dumps(book_to_dict(book))`` but without encoding the book's
closed hours again on every event (a tick rewrites every active book; with a long correction
horizon a book holds thousands of hours). ``step`` hands it over as a :class:`BookText`, a
snapshot of the text's parts: the shell joins it once, for the value it stores at the end of a
batch, not once per event that touched the book.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson

from services.contracts.codec import Envelope
from services.core.cost import (
    BookJsonParts,
    CostOutput,
    CostSettings,
    CostState,
    EventIgnored,
    NamespaceLabeled,
    apply_tracked,
    book_from_dict,
    book_json_parts,
    initial_state,
    join_book_json,
    restore_books,
)
from services.cost_accounting.config import CostConfig
from services.cost_accounting.ledger import OutputMessage, outputs_for
from services.cost_accounting.translate import RELEVANT_EVENT_TYPES, WorkloadMemo, translate, workload_uid_of

__all__ = [
    "COHORT_PREFIX",
    "SEEN_WINDOW",
    "BookText",
    "CohortLedger",
    "Store",
    "cohort_record_key",
    "cohort_settings",
    "fold_cohorts",
    "stored",
    "stored_records",
]

COHORT_PREFIX = "cohort|"
#: Event ids a cohort record remembers besides its source position (``pos``): the position
#: catches every redelivery of the same record; the ids catch a record published twice
#: upstream (same id, new offset) shortly after itself. Books remember their own event ids.
SEEN_WINDOW = 64
#: What the fold reads from qm.workloads (labels come from the replica, not this topic).
FOLDED_TYPES = RELEVANT_EVENT_TYPES - {"namespace.labels.v1"}
log = logging.getLogger("qm.cost-accounting")

Labels = Callable[[str], Mapping[str, str] | None]


class Store(Protocol):
    def get(self, key: str) -> Any: ...

    def items(self) -> Iterable[tuple[str, Any]]: ...


def cohort_record_key(cohort: str) -> str:
    return f"{COHORT_PREFIX}{cohort}"


def cohort_settings(settings: CostSettings) -> CostSettings:
    """The core settings of a cohort fold: hours close on the cohort's ticks only."""
    return replace(settings, close_on_ticks_only=True)


_json_text = json.JSONEncoder(separators=(",", ":")).encode


def book_text(value: Any) -> str:
    """The core's book encoder's text (compact ``json``, ensure_ascii), made by orjson when
    that gives the same text. A book holds no floats, so it does unless an int needs more than
    64 bits (an exact usage sum), a key is not a string, or a string holds a character that
    json escapes and orjson does not (non-ASCII, DEL). The core is standard library only; in
    kueue-baseline encoding books was a tenth of the cost service's samples."""
    try:
        data = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: an int beyond 64 bits, a key that is not a string
        return _json_text(value)
    if not data.isascii() or b"\x7f" in data:
        return _json_text(value)
    return data.decode()


@dataclass(frozen=True, slots=True)
class BookText:
    """A book's stored text as ``step`` made it, not yet joined: its parts are strings, so it
    stays the text of the book as of that event, whatever later events do to the book. In the
    Alibaba replay a tick rewrote every active book, and joining every hour's text on each
    event was a tenth of the cost service's CPU; a batch stores each key once, so only the
    value it stores is joined (``stored``)."""

    parts: BookJsonParts

    def __str__(self) -> str:
        return join_book_json(self.parts)


def stored(value: Any) -> Any:
    """A record as the ledger table stores it: a BookText joined into its text."""
    if isinstance(value, dict) and isinstance(value.get("book"), BookText):
        return {**value, "book": str(value["book"])}
    return value


def stored_records(writes: Mapping[str, Any]) -> dict[str, Any]:
    """A step's writes as the ledger table stores them (each book joined)."""
    return {key: stored(value) for key, value in writes.items()}


def _no_labels(_namespace: str) -> None:
    return None


#: The envelope index of a position stored before ADR 0034 (partition and offset only): its
#: record was one envelope, so everything at that offset was applied.
WHOLE_RECORD = 1 << 30


def _stored_position(pos: list[int]) -> tuple[int, int, int]:
    return (pos[0], pos[1], pos[2] if len(pos) > 2 else WHOLE_RECORD)


@dataclass(slots=True)
class _Live:
    v: int
    state: CostState
    memos: dict[str, dict[str, Any]]
    seen: list[str] = field(default_factory=list)
    seen_set: set[str] = field(default_factory=set)
    pos: tuple[int, int, int] | None = None
    # The cohort record's copy of the namespace labels, shared by its records until a
    # NamespaceLabeled is applied (never mutated). Copying every namespace's labels for every
    # event was 6% of the service in kueue-large-scale (100 namespaces per cohort).
    labels_copy: dict[str, dict[str, str]] | None = None


def _log_ignored(item: EventIgnored) -> None:
    log.warning("cost event ignored: %s (%s) %s", item.event_id, item.reason, item.message)


class CohortLedger:
    """``step(cohort, store, envelope) -> (writes, outputs) | None`` (None: a duplicate).

    Keeps each cohort's live state between calls; reloads it from the store whenever the
    stored cohort record's version is not the one it produced last (restart, recovery, a
    failed event)."""

    def __init__(
        self,
        config: CostConfig,
        labels: Labels = _no_labels,
        make_output: Callable[[str, str, Envelope], Any] = OutputMessage,
        on_ignored: Callable[[EventIgnored], None] = _log_ignored,
    ) -> None:
        self.config = config
        self.settings = cohort_settings(config.settings)
        self.labels = labels
        self.make_output = make_output
        self.on_ignored = on_ignored
        self._live: dict[str, _Live] = {}

    # -- state ------------------------------------------------------------------------

    def _load(self, cohort: str, store: Store) -> _Live:
        meta = store.get(cohort_record_key(cohort))
        version = meta["v"] if meta else 0
        live = self._live.get(cohort)
        if live is not None and live.v == version:
            return live
        state = initial_state(self.settings, self.config.price_list, ())
        memos: dict[str, dict[str, Any]] = {}
        seen: list[str] = []
        pos = None
        if meta:
            state.watermark_ms = meta["watermarkMs"]
            state.closed_through_ms = meta["closedThroughMs"]
            state.namespace_labels = {ns: dict(labels) for ns, labels in meta["namespaceLabels"].items()}
            state.config_at = dict(meta["configAt"])
            seen = list(meta["seen"])
            pos = _stored_position(meta["pos"]) if meta.get("pos") else None
        books = []
        for uid, value in store.items():
            if not isinstance(value, dict) or value.get("c") != cohort or uid.startswith(COHORT_PREFIX):
                continue
            if "gone" in value:
                state.forgotten[uid] = value["gone"]
                continue
            if value.get("book") is not None:
                books.append(book_from_dict(json.loads(str(value["book"]))))
            if value.get("memo") is not None:
                memos[uid] = value["memo"]
        restore_books(state, sorted(books, key=lambda book: book.uid))
        live = _Live(version, state, memos, seen, set(seen), pos)  # type: ignore[arg-type]
        self._live[cohort] = live
        return live

    def forget(self, cohort: str) -> None:
        """Drop a cohort's live state (it may hold an event that was not stored)."""
        self._live.pop(cohort, None)

    # -- the fold ---------------------------------------------------------------------

    def step(
        self, cohort: str, store: Store, envelope: Envelope, position: tuple[int, ...] | None = None
    ) -> tuple[dict[str, Any], list[Any]] | None:
        """``position``: (partition, offset[, envelope index in a bundle]) of the envelope, when
        read from the bus."""
        if envelope.event_type not in FOLDED_TYPES:
            return {}, []
        live = self._load(cohort, store)
        eid = envelope.event_id
        if eid in live.seen_set:
            return None
        if position is not None:
            position = (position[0], position[1], position[2] if len(position) > 2 else 0)
            if live.pos is not None and position[0] == live.pos[0] and position[1:] <= live.pos[1:]:
                return None
        state, memos = live.state, live.memos
        uid = workload_uid_of(envelope)
        memo_dict = memos.get(uid) if uid else None
        produced: list[CostOutput] = []
        changed: dict[str, None] = {}
        if not (uid and _already_applied(state, memo_dict, uid, eid)):
            events = list(self._label_changes(state, envelope))
            translation = translate(envelope, WorkloadMemo.from_dict(memo_dict) if memo_dict else None)
            events.extend(translation.events)
            for event in events:
                if isinstance(event, NamespaceLabeled):
                    live.labels_copy = None
                state, outputs, touched = apply_tracked(state, event)
                produced.extend(outputs)
                changed.update(dict.fromkeys(touched))
            if uid and translation.memo is not None:
                new_memo = translation.memo.to_dict()
                if uid in state.forgotten:
                    memos.pop(uid, None)
                elif new_memo != memo_dict:
                    memos[uid] = new_memo
                    changed[uid] = None
        writes: dict[str, Any] = {}
        for key in changed:  # workload records first ...
            book = state.books.get(key)
            if book is not None:
                writes[key] = {"c": cohort, "book": BookText(book_json_parts(book, book_text)), "memo": memos.get(key)}
            elif key in state.forgotten:
                memos.pop(key, None)
                writes[key] = {"c": cohort, "gone": state.forgotten[key]}
            else:
                writes[key] = {"c": cohort, "book": None, "memo": memos.get(key)}
        live.seen.append(eid)
        live.seen_set.add(eid)
        if len(live.seen) > SEEN_WINDOW:
            for old in live.seen[: len(live.seen) - SEEN_WINDOW]:
                live.seen_set.discard(old)
            del live.seen[: len(live.seen) - SEEN_WINDOW]
        live.v += 1
        if position is not None:
            live.pos = position  # type: ignore[assignment]
        writes[cohort_record_key(cohort)] = {  # ... the cohort record (version, seen ids) last
            "v": live.v,
            "watermarkMs": state.watermark_ms,
            "closedThroughMs": state.closed_through_ms,
            "namespaceLabels": self._labels_copy(live, state),
            "configAt": dict(state.config_at),
            "pos": list(live.pos) if live.pos is not None else None,
            "seen": list(live.seen),
        }
        messages = outputs_for(produced, envelope, state.settings.billing_account_id, self.on_ignored)
        return writes, [self.make_output(m.topic, m.key, m.envelope) for m in messages]

    @staticmethod
    def _labels_copy(live: _Live, state: CostState) -> dict[str, dict[str, str]]:
        if live.labels_copy is None:
            live.labels_copy = {ns: dict(labels) for ns, labels in state.namespace_labels.items()}
        return live.labels_copy

    def _label_changes(self, state: CostState, envelope: Envelope) -> Iterator[NamespaceLabeled]:
        """The namespace's labels as the replica knows them, when they differ from the state's."""
        namespace = getattr(envelope.payload, "namespace", None)
        if not namespace:
            return
        labels = self.labels(namespace)
        if labels is None or dict(labels) == state.namespace_labels.get(namespace):
            return
        at = state.config_at.get(f"namespace/{namespace}", 0)  # applies whatever the event time
        yield NamespaceLabeled(f"{envelope.event_id}:labels", namespace, tuple(sorted(labels.items())), at)


def _already_applied(state: CostState, memo: Mapping[str, Any] | None, uid: str, event_id: str) -> bool:
    """A workload envelope already in its book (or waiting in the memo), e.g. republished
    upstream with the same id after the cohort record's window."""
    book = state.books.get(uid)
    if book is not None and event_id in book.seen:
        return True
    return memo is not None and any(item.get("event_id") == event_id for item in memo.get("deferred", ()))


def fold_cohorts(
    config: CostConfig,
    inputs: Iterable[tuple[str, Envelope]],
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[dict[str, Any], list[OutputMessage]]:
    """Fold ``(cohort key, envelope)`` pairs in order, in process: the expected result of the
    service over the same ``qm.workloads`` records (tests, replays). ``labels``: namespace →
    labels, as the service's replica of ``qm.cluster`` would hold them."""
    known = dict(labels or {})
    ledger = CohortLedger(config, labels=known.get)
    store: dict[str, Any] = {}
    outputs: list[OutputMessage] = []
    for cohort, envelope in inputs:
        result = ledger.step(cohort, store, envelope)
        if result is None:
            continue
        writes, produced = result
        store.update(stored_records(writes))
        outputs.extend(produced)
    return store, outputs
