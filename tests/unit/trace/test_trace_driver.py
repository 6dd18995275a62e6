"""The trace driver: CSV reading, conventions, ordering, ticks, and the synthetic generator."""

from __future__ import annotations

import collections
import zlib
from pathlib import Path

import pytest

from services.trace import (
    TEAM_NAMESPACES,
    TraceEventKind,
    TracePod,
    WorkloadClass,
    flavor_for,
    lifecycle_events,
    namespace_for,
    read_nodes,
    read_pods,
    synthetic_pods,
    write_pod_csv,
)

TRACE_DIR = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces" / "alibaba-gpu-v2023"
needs_trace = pytest.mark.skipif(
    not (TRACE_DIR / "openb_pod_list_default.csv").is_file(),
    reason=f"Alibaba GPU trace not found at {TRACE_DIR} (../shared/traces/alibaba-gpu-v2023 from the repo root)",
)
BASE_S = 1_688_169_600  # 2023-07-01T00:00:00Z


def pod(
    name="p", *, creation=0, scheduled=None, deletion=None, num_gpu=1, gpu_milli=1000, qos="LS", models=()
):
    return TracePod(
        name, 1000, 1024, num_gpu, gpu_milli, tuple(models), qos, "", creation, deletion, scheduled
    )


def kinds(events, name):
    return [(e.kind, e.offset_s) for e in events if e.pod_name == name]


def test_lifecycle_of_a_pod_that_ran():
    events = lifecycle_events([pod("a", creation=10, scheduled=20, deletion=4000)], base_epoch_s=BASE_S)
    assert kinds(events, "a") == [
        (TraceEventKind.SUBMITTED, 10),
        (TraceEventKind.RUNNING, 20),
        (TraceEventKind.FINISHED, 4000),
    ]
    running = next(e for e in events if e.kind is TraceEventKind.RUNNING)
    assert running.at_ms == (BASE_S + 20) * 1000 and running.event_id == "trace:a:running"


@pytest.mark.parametrize(
    ("scheduled", "creation", "expected"),
    [
        (None, 5, [(TraceEventKind.SUBMITTED, 5), (TraceEventKind.DELETED, 100)]),  # Pending: never ran
        (0, 5, [(TraceEventKind.SUBMITTED, 5), (TraceEventKind.DELETED, 100)]),  # 0 means "not set"
        (0, 0, [(TraceEventKind.SUBMITTED, 0), (TraceEventKind.RUNNING, 0), (TraceEventKind.FINISHED, 100)]),
        (3, 5, [(TraceEventKind.SUBMITTED, 5), (TraceEventKind.RUNNING, 5), (TraceEventKind.FINISHED, 100)]),
    ],
)
def test_scheduled_time_conventions(scheduled, creation, expected):
    events = lifecycle_events(
        [pod("a", creation=creation, scheduled=scheduled, deletion=100)], tick_every_s=0
    )
    assert kinds(events, "a") == expected


def test_missing_deletion_is_censored_at_the_end_of_the_trace():
    pods = [pod("a", creation=0, scheduled=0), pod("b", creation=10, scheduled=10, deletion=500)]
    assert kinds(lifecycle_events(pods, tick_every_s=0), "a")[-1] == (TraceEventKind.FINISHED, 500)
    assert kinds(lifecycle_events(pods, tick_every_s=0, end_s=900), "a")[-1] == (TraceEventKind.FINISHED, 900)


def test_zero_length_lifecycles_stay_in_order():
    events = lifecycle_events([pod("a", creation=7, scheduled=7, deletion=7)], tick_every_s=0)
    assert [e.kind for e in events] == [
        TraceEventKind.SUBMITTED,
        TraceEventKind.RUNNING,
        TraceEventKind.FINISHED,
    ]


def test_size_only_pod_lists_have_no_lifecycle():
    with pytest.raises(ValueError, match="no creation_time"):
        lifecycle_events([pod("a", creation=None)])


def test_ticks_are_hourly_on_utc_hour_boundaries_and_close_the_last_hour():
    events = lifecycle_events([pod("a", creation=0, scheduled=0, deletion=7300)], base_epoch_s=BASE_S + 60)
    ticks = [e.at_ms for e in events if e.kind is TraceEventKind.TICK]
    assert all(t % 3_600_000 == 0 for t in ticks)
    assert ticks == [(BASE_S + 3600 * k) * 1000 for k in (1, 2, 3)]
    assert events[-1].kind is TraceEventKind.TICK and events[-1].at_ms >= events[-2].at_ms


def test_conventions_namespace_class_flavor():
    assert namespace_for("openb-pod-0000") == namespace_for("openb-pod-0000") in TEAM_NAMESPACES
    assert namespace_for("openb-pod-0000") == "ml-team"  # pinned: crc32 is stable everywhere
    assert namespace_for("openb-pod-0001") == TEAM_NAMESPACES[zlib.crc32(b"openb-pod-0001") % 8]
    assert pod(qos="LS").workload_class is WorkloadClass.INFERENCE
    assert pod(qos="BE").workload_class is WorkloadClass.BATCH
    assert pod(qos="Burstable").workload_class is WorkloadClass.TRAINING
    assert pod(qos="Guaranteed").workload_class is WorkloadClass.TRAINING
    assert flavor_for(0, ()) == "cpu-flavor" and flavor_for(1, ()) == "gpu-flavor"
    assert flavor_for(1, ("V100M16", "V100M32")) == "v100m16-flavor"
    assert pod(num_gpu=1, gpu_milli=460).gpu_milli_total == 460
    assert pod(num_gpu=8, gpu_milli=1000).gpu_milli_total == 8000


def test_synthetic_generator_is_deterministic_and_has_the_trace_shape(tmp_path):
    pods = synthetic_pods(3000, seed=11)
    assert pods == synthetic_pods(3000, seed=11)
    assert pods != synthetic_pods(3000, seed=12)
    gpus = collections.Counter(p.num_gpu for p in pods)
    assert 0.08 < gpus[0] / len(pods) < 0.18 and gpus[1] / len(pods) > 0.8
    assert sum(gpus[n] for n in (2, 4, 8)) > 5
    assert sum(1 for p in pods if p.num_gpu == 1 and p.gpu_milli < 1000) > 0.3 * gpus[1]
    assert {p.qos for p in pods} >= {"LS", "BE", "Burstable"}
    assert len({p.flavor for p in pods}) >= 5
    assert any(p.scheduled_s is None for p in pods)
    read_back = read_pods(write_pod_csv(pods, tmp_path / "pods.csv"))
    assert read_back == pods


def test_events_are_time_ordered_with_unique_ids_on_synthetic_data():
    events = lifecycle_events(synthetic_pods(500, seed=3))
    assert [e.at_ms for e in events] == sorted(e.at_ms for e in events)
    assert len({e.event_id for e in events}) == len(events)
    seen: dict[str, list[TraceEventKind]] = collections.defaultdict(list)
    for event in events:
        if event.pod_name:
            seen[event.pod_name].append(event.kind)
    assert all(k[0] is TraceEventKind.SUBMITTED and len(k) in (2, 3) for k in seen.values())


@needs_trace
def test_reads_the_real_trace_files():
    pods = read_pods(TRACE_DIR / "openb_pod_list_default.csv")
    assert len(pods) == 8152
    assert sum(1 for p in pods if p.scheduled_s is None) == 897
    nodes = read_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213 and {n.gpu_model for n in nodes} >= {"T4", "P100", "V100M32"}
    constrained = read_pods(TRACE_DIR / "openb_pod_list_gpuspec33.csv")
    assert any(len(p.gpu_models) > 1 for p in constrained)
    size_only = read_pods(TRACE_DIR / "openb_pod_list_multigpu50.csv")
    assert size_only and all(p.creation_s is None for p in size_only)
