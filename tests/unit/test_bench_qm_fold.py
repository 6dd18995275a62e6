"""bench_qm_fold folds a saved stream as the queue-manager does: per cohort key, each event id
once, every output encoded, and a digest of the outputs (their types and ids)."""

from __future__ import annotations

import base64
import hashlib
import sys
from pathlib import Path

import orjson

from services.contracts.codec import encode, encode_bundle, make_envelope
from services.contracts.events import WorkloadValidated
from services.queue_manager import state as fold

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_qm_fold  # noqa: E402

CONTEXT = bench_qm_fold.context_for("smalls-phase", 0.1)
QUEUE = "cq-0-0"  # smalls-phase's first ClusterQueue (its namespace and LocalQueue share the name)


def validated(name: str, cpu: int, at: str = "2026-12-06T01:00:00Z"):
    return make_envelope(WorkloadValidated(
        uid=f"uid-{name}", namespace=QUEUE, name=name, queue_name=QUEUE, cluster_queue=QUEUE, priority=50,
        created_at=at, pod_sets=[{"name": "main", "count": 1, "requests": {"cpu": cpu * 1000}}],
    ), producer="admission", occurred_at=at)


def saved(tmp_path: Path, records: list[tuple[int, int, str, bytes]]) -> Path:
    """A stream file as --record writes it, rows given out of order."""
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(b"\n".join(orjson.dumps({"partition": p, "offset": o, "key": k, "value": base64.b64encode(v).decode()})
                                  for p, o, k, v in records) + b"\n")
    return stream


def test_the_first_queue_is_configured():
    assert QUEUE in CONTEXT.objects.cluster_queues


def test_folds_each_event_once_per_key_and_encodes_its_outputs(tmp_path):
    key = CONTEXT.objects.cluster_queues[QUEUE].cohort
    small, other = validated("small-1", 1), validated("small-2", 1)
    bundle = encode_bundle([small, other])[0][0]
    stream = saved(tmp_path, [(0, 1, key, encode(small)), (0, 0, key, bundle)])  # the bundle is first
    records = bench_qm_fold.load_stream(stream, None)
    assert [value for _, value, _ in records] == [bundle, encode(small)]
    result = bench_qm_fold.run(records, CONTEXT, "fold")
    assert result["records"] == 2 and result["folded"] == 2  # the repeated small is skipped
    assert result["outputs"] > 0
    assert bench_qm_fold.run(records, CONTEXT, "none")["folded"] == 0


def test_the_digest_is_of_the_outputs_event_types_and_ids(tmp_path):
    key = CONTEXT.objects.cluster_queues[QUEUE].cohort
    events = [validated("fits", 1), validated("too-big", 500)]  # 500 cpu: over the cohort's quota
    records = bench_qm_fold.load_stream(saved(tmp_path, [(0, i, key, encode(e)) for i, e in enumerate(events)]), None)
    state, contexts, lines = None, fold.KeyedContexts(), []
    for envelope in events:
        state, outputs = fold.apply(state, envelope, contexts.of(CONTEXT, key))
        lines += [f"{o.envelope.event_type} {o.envelope.event_id}\n" for o in outputs]
    assert any(line.startswith("workload.quota_reserved.v1 ") for line in lines)
    assert any(line.startswith("workload.pending.v1 ") for line in lines)
    expected = hashlib.sha256("".join(lines).encode()).hexdigest()[:16]
    assert bench_qm_fold.run(records, CONTEXT, "fold")["digest"] == expected
