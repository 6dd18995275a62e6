"""cohort.py's stored records: a ledger restarted from them continues with the rows of the
uninterrupted fold, including from records written before books were encoded by book_to_json."""

from __future__ import annotations

import json

from services.contracts.codec import make_envelope
from services.contracts.events import (
    ClockTick,
    PodFinished,
    PodRunning,
    WorkloadFinished,
    WorkloadQuotaReserved,
    WorkloadRunning,
)
from services.core.cost import book_from_dict, book_to_dict, book_to_json
from services.cost_accounting.cohort import (
    BookText,
    CohortLedger,
    book_text,
    cohort_record_key,
    fold_cohorts,
    stored_records,
)
from services.cost_accounting.config import CostConfig

CC_LABEL = "quartermaster.dev/cost-center"
LABELS = {"ml-team": {CC_LABEL: "cc-ml"}}
GIB = 2**30 * 1000  # milli-bytes


def at(clock: str) -> str:
    return f"2026-11-29T{clock}:00Z"


def env(payload, clock: str, *ident: str):
    return make_envelope(payload, producer="test", occurred_at=at(clock), identity=ident)


def reserved(uid: str, clock: str, gpus: int, memory_gib: int):
    usage = {"a100": {"nvidia.com/gpu": gpus * 1000, "cpu": 8000, "memory": memory_gib * GIB}}
    return env(WorkloadQuotaReserved(uid=uid, namespace="ml-team", name=uid, cluster_queue="cq", cohort="ml",
                                     flavors={"main": {"nvidia.com/gpu": "a100"}}, counts={"main": 1}, usage=usage,
                                     reserved_at=at(clock)), clock, uid, "reserved")


def pod_running(uid: str, clock: str, gpus: int, memory_gib: int):
    requests = {"nvidia.com/gpu": gpus * 1000, "cpu": 4000, "memory": memory_gib * GIB}
    return env(PodRunning(uid=f"{uid}-pod", workload_uid=uid, namespace="ml-team", name=f"{uid}-0",
                          started_at=at(clock), requests=requests), clock, uid, "pod")


def tick(clock: str):
    return env(ClockTick(at=at(clock), source="test"), clock, "tick", clock)


def stream() -> list:
    """Two workloads over five hours; a late pod.finished corrects a closed hour."""
    return [
        reserved("wl-a", "10:00", 16, 64),
        pod_running("wl-a", "10:20", 8, 32),
        tick("11:00"),
        reserved("wl-b", "11:10", 4, 16),
        env(WorkloadRunning(uid="wl-b", namespace="ml-team", name="wl-b", started_at=at("11:10")), "11:10", "wl-b", "run"),
        tick("12:00"),
        env(PodFinished(uid="wl-a-pod", workload_uid="wl-a", namespace="ml-team", name="wl-a-0", phase="Succeeded",
                        finished_at=at("11:30")), "11:30", "wl-a", "pod-finished"),  # late: hour 11 is closed
        tick("13:00"),
        env(WorkloadFinished(uid="wl-a", namespace="ml-team", name="wl-a", succeeded=True, finished_at=at("13:15")),
            "13:15", "wl-a", "finished"),
        tick("14:00"),
        tick("15:00"),
    ]


def rows(outputs) -> list[tuple]:
    return [(o.envelope.event_id, o.envelope.payload) for o in outputs if o.topic == "qm.billing"]


def run(ledger: CohortLedger, store: dict, envelopes, first_offset: int | None = 0, per_record: int = 1) -> list:
    """Step each envelope (source offsets from ``first_offset``, ``per_record`` envelopes to a
    record as in bundles, ADR 0034; None: no positions, as fold_cohorts)."""
    outputs = []
    for i, envelope in enumerate(envelopes):
        position = None if first_offset is None else (0, first_offset + i // per_record, i % per_record)
        result = ledger.step("ml", store, envelope, position)
        if result is not None:
            writes, produced = result
            store.update(stored_records(writes))
            outputs.extend(produced)
    return outputs


def test_the_stream_bills_a_sum_beyond_64_bits_and_a_correction():
    store, outputs = fold_cohorts(CostConfig(), [("ml", e) for e in stream()], LABELS)
    book = json.loads(store["wl-b"]["book"])
    assert max(max(values[:3]) for values in book["series"].values()) > 2**64  # memory milli-bytes x ms
    assert any(row.ChargeClass == "Correction" for _, row in rows(outputs))


def test_each_stored_book_is_the_json_text_of_book_to_dict():
    ledger, store = CohortLedger(CostConfig(), labels=LABELS.get), {}
    for offset, envelope in enumerate(stream()):
        writes, _ = ledger.step("ml", store, envelope, (0, offset))
        store.update(stored_records(writes))
        for uid, book in ledger._live["ml"].state.books.items():
            assert store[uid]["book"] == json.dumps(book_to_dict(book), separators=(",", ":"))


def test_a_book_handed_over_stays_the_text_of_its_event_whatever_later_events_do():
    """step's BookText is joined at the batch's end: it must not see the events after its own
    (a staged value is what a reload after a failed event reads)."""
    ledger, store = CohortLedger(CostConfig(), labels=LABELS.get), {}
    handed: list[tuple[BookText, str]] = []
    for offset, envelope in enumerate(stream()):
        writes, _ = ledger.step("ml", store, envelope, (0, offset))
        store.update(writes)  # staged as handed over, the way a batch holds them
        for uid, book in ledger._live["ml"].state.books.items():
            if isinstance(writes.get(uid, {}).get("book"), BookText):
                handed.append((writes[uid]["book"], json.dumps(book_to_dict(book), separators=(",", ":"))))
    assert len(handed) > 10
    assert len({text for _, text in handed}) > 5  # the books did change after being handed over
    for book_text_then, text_then in handed:
        assert str(book_text_then) == text_then


def test_a_ledger_restarted_at_any_point_continues_with_the_uninterrupted_rows_and_records():
    envelopes = stream()
    expected_store, expected = fold_cohorts(CostConfig(), [("ml", e) for e in envelopes], LABELS)
    for split in range(1, len(envelopes)):
        store: dict = {}
        first = run(CohortLedger(CostConfig(), labels=LABELS.get), store, envelopes[:split])
        # a new process: books restored from the stored records (book_from_dict of their text)
        second = run(CohortLedger(CostConfig(), labels=LABELS.get), store, envelopes[split:], split)
        assert rows(first + second) == rows(expected), split
        books = {uid: value for uid, value in store.items() if uid != cohort_record_key("ml")}
        assert books == {uid: value for uid, value in expected_store.items() if uid != cohort_record_key("ml")}


# Written by the code before book_to_json (json.dumps(book_to_dict(book), separators=(",", ":"))),
# captured from it: the records after the first three events of stream() folded by fold_cohorts
# (reserved wl-a 10:00 with 64 GiB, its pod 10:20 with 32 GiB, tick 11:00).
OLD_RECORDS = {
    "cohort|ml": {
        "v": 3, "watermarkMs": 1795950000000, "closedThroughMs": 1795950000000,
        "namespaceLabels": {"ml-team": {CC_LABEL: "cc-ml"}}, "configAt": {"namespace/ml-team": 0}, "pos": None,
        "seen": ["34260dc18ba27ccaef1ee6ef4bc0f6d1", "a1e77babff1c0b1f8757904eb04827c6", "06a39157d0d6f1d78ae72a85894a4861"],
    },
    "wl-a": {
        "c": "ml",
        "book": (
            '{"uid":"wl-a","namespace":"ml-team","workloadName":"wl-a","labels":[],"seq":2,'
            '"resStarts":[[1795946400000,1,"a100",16000,8000,68719476736000]],"resEnds":[],'
            '"podStarts":{"wl-a-pod":[[1795947600000,2,"a100",8000,4000,34359738368000]]},"podEnds":{},"allEnds":[],'
            '"finished":null,"billedThroughMs":1795950000000,'
            '"emitted":{"1795946400000":{"a100\\treserved-idle":[38400000000,19200000000,164926744166400000000,1],'
            '"a100\\trunning":[19200000000,9600000000,82463372083200000000,1]}},'
            '"series":{"a100\\treserved-idle":[38400000000,19200000000,164926744166400000000,10666666667,5333333333,42666666667],'
            '"a100\\trunning":[19200000000,9600000000,82463372083200000000,5333333333,2666666667,21333333333]},'
            '"seen":["34260dc18ba27ccaef1ee6ef4bc0f6d1","a1e77babff1c0b1f8757904eb04827c6"]}'
        ),
        "memo": {"flavor": "a100", "reserved": [16000, 8000, 68719476736000], "podLevel": True, "unnamedStartMs": None,
                 "deferred": []},
    },
}


def test_records_written_before_book_to_json_are_read_and_continued():
    envelopes = stream()
    old = json.loads(OLD_RECORDS["wl-a"]["book"])
    assert max(old["emitted"]["1795946400000"]["a100\treserved-idle"][:3]) > 2**64
    first_store, _ = fold_cohorts(CostConfig(), [("ml", e) for e in envelopes[:3]], LABELS)
    assert first_store == OLD_RECORDS  # the stored format did not change: the same records, byte for byte
    store = json.loads(json.dumps(OLD_RECORDS))
    restarted = run(CohortLedger(CostConfig(), labels=LABELS.get), store, envelopes[3:], None)
    expected_store, expected = fold_cohorts(CostConfig(), [("ml", e) for e in envelopes], LABELS)
    assert restarted and rows(restarted) == rows(expected)[-len(rows(restarted)):]
    assert store == expected_store


def test_book_text_is_the_standard_encoders_text_for_whatever_orjson_would_write_otherwise():
    """orjson makes the text where it gives json's; the rest goes to json (a sum beyond 64 bits,
    a key that is not a string, characters json escapes and orjson does not)."""
    values = [
        {"uid": "wl-a", "labels": [["team", "ml"]], "seen": ["e1", "e2"], "finished": None, "x": True},
        {"a100\trunning": [1, -2, 2**63 - 1, -(2**63)], "quote\"back\\slash/": "new\nline\ttab\x01"},
        {"series": [2**64 + 1]},
        {1: "an int key"},
        {"ns": "équipe"},
        {"ns": "del\x7f"},
    ]
    for value in values:
        assert book_text(value) == json.dumps(value, separators=(",", ":"))


def test_book_text_round_trips_exactly():
    store, _ = fold_cohorts(CostConfig(), [("ml", e) for e in stream()], LABELS)
    for uid in ("wl-a", "wl-b"):
        text = store[uid]["book"]
        assert book_to_json(book_from_dict(json.loads(text))) == text


def test_the_cohort_record_names_the_labels_of_its_time_and_earlier_records_keep_theirs():
    labels = {"ml-team": {CC_LABEL: "cc-ml"}}
    ledger, store = CohortLedger(CostConfig(), labels=lambda ns: labels.get(ns)), {}
    records = []
    for offset, envelope in enumerate(stream()[:4]):
        if offset == 2:
            labels["ml-team"] = {CC_LABEL: "cc-research"}  # relabelled between two events
        writes, _ = ledger.step("ml", store, envelope, (0, offset))
        store.update(writes)
        records.append(writes[cohort_record_key("ml")])
    assert [r["namespaceLabels"]["ml-team"][CC_LABEL] for r in records] == ["cc-ml", "cc-ml", "cc-ml", "cc-research"]


def test_every_envelope_of_a_bundle_is_applied_though_they_share_an_offset():
    """A position names the envelope within its record: the second envelope at an offset is new."""
    envelopes = stream()
    _, expected = fold_cohorts(CostConfig(), [("ml", e) for e in envelopes], LABELS)
    store: dict = {}
    outputs = run(CohortLedger(CostConfig(), labels=LABELS.get), store, envelopes, per_record=3)
    assert rows(outputs) == rows(expected)
    assert store[cohort_record_key("ml")]["pos"] == [0, (len(envelopes) - 1) // 3, (len(envelopes) - 1) % 3]


def test_a_position_stored_before_bundles_covers_its_whole_record():
    envelopes = stream()
    store: dict = {}
    run(CohortLedger(CostConfig(), labels=LABELS.get), store, envelopes[:3])
    store[cohort_record_key("ml")] = {**store[cohort_record_key("ml")], "pos": [0, 2], "seen": []}  # an older writer's
    restarted = CohortLedger(CostConfig(), labels=LABELS.get)
    assert restarted.step("ml", store, envelopes[3], (0, 2, 1)) is None  # at the stored offset: applied
    assert restarted.step("ml", store, envelopes[3], (0, 3, 0)) is not None  # past it: new
