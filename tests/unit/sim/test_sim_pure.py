"""The simulator's pure parts: trace → submissions, Kueue config generation, time compression."""

from __future__ import annotations

import yaml

from services.adapters.kueue_config import load_config_dir
from services.contracts.codec import encode
from services.core.quota import PodSet, Workload, WorkloadStatus, build_snapshot, drain, load_objects
from services.sim.config import (
    CPU_FLAVOR,
    build_kueue_objects,
    fleet_capacity,
    synthetic_nodes,
    team_quotas,
    write_kueue_config,
)
from services.sim.runner import load_trace
from services.sim.workloads import (
    Compression,
    at_iso,
    pod_uid,
    submitted_event,
    tick_event,
    workloads_from_trace,
)
from services.trace.alibaba import TEAM_NAMESPACES, TraceNode, TracePod

POD = TracePod("p-1", 6000, 12288, 1, 460, ("T4",), "LS", "Running", creation_s=100, scheduled_s=130,
               deletion_s=1130)
NEVER = TracePod("p-2", 1000, 1024, 2, 1000, (), "BE", "Pending", creation_s=50, scheduled_s=None, deletion_s=80)


def test_trace_pods_become_workloads_in_submission_order_with_milli_requests():
    ws = workloads_from_trace([POD, NEVER])
    assert [w.name for w in ws] == ["p-2", "p-1"]
    never, pod = ws
    assert pod.requests == {"cpu": 6000, "memory": 12288 * 2**20 * 1000, "nvidia.com/gpu": 460}
    assert pod.run_s == 1000.0 and pod.deadline_s is None and pod.submit_s == 100.0
    assert never.run_s is None and never.deadline_s == 80.0 and never.requests["nvidia.com/gpu"] == 2000
    assert pod.workload_class == "inference" and pod.priority == 1000 and never.workload_class == "batch"
    assert pod.queue_name == f"lq-{pod.namespace}" and pod.cluster_queue == f"cq-{pod.namespace}"


def test_window_shifts_and_cuts_the_trace():
    ws = workloads_from_trace([POD, NEVER], start_s=60, duration_s=100)
    assert [(w.name, w.submit_s) for w in ws] == [("p-1", 40.0)]


def test_submission_event_is_valid_deterministic_and_labelled():
    (w,) = workloads_from_trace([POD])
    first, again = submitted_event(w), submitted_event(w)
    assert first.event_id == again.event_id and first.occurred_at == "2026-11-29T09:01:40Z"
    encode(first)  # strict contract validation
    labels = first.payload.labels
    assert labels["kueue.x-k8s.io/queue-name"] == w.queue_name
    assert labels["quartermaster.dev/class"] == "inference"
    assert labels["quartermaster.dev/cost-center"] == f"cc-{w.namespace}"
    assert first.payload.annotations["quartermaster.dev/gpu-models"] == "T4"
    assert pod_uid(w.uid, 1) != pod_uid(w.uid, 2)


def test_synthetic_default_trace_has_the_alibaba_shape():
    ws = workloads_from_trace(load_trace(None))
    gpu = [w.gpu_milli for w in ws]
    assert len(ws) == 2000
    assert sum(1 for g in gpu if 0 < g < 1000) > 300  # fractional GPUs
    assert any(g >= 2000 for g in gpu)  # multi-GPU pods
    assert {w.workload_class for w in ws} == {"inference", "batch", "training"}
    assert len({w.namespace for w in ws}) == len(TEAM_NAMESPACES)


def test_time_compression_and_event_time():
    clock = Compression(speed=60.0, wall0=1000.0)
    assert clock.wall_for(120) == 1002.0 and clock.sim_at(1002.5) == 150.0
    assert at_iso(0) == "2026-11-29T09:00:00Z" and at_iso(3600.5) == "2026-11-29T10:00:00.500000Z"
    assert tick_event(60).payload.at == "2026-11-29T09:01:00Z"


def test_quotas_never_add_up_to_more_than_the_fleet():
    nodes = [TraceNode("n1", 64000, 262144, 2, "T4"), TraceNode("n2", 96000, 524288, 8, "G2")]
    capacity = fleet_capacity(nodes)
    assert capacity == {CPU_FLAVOR: {"cpu": 160000, "memory": 786432 * 2**20 * 1000},
                        "t4-flavor": {"nvidia.com/gpu": 2000}, "g2-flavor": {"nvidia.com/gpu": 8000}}
    quotas = team_quotas(capacity, 3)
    assert quotas["t4-flavor"]["nvidia.com/gpu"] == 666
    for flavor, by_res in capacity.items():
        for res, amount in by_res.items():
            assert quotas[flavor][res] * 3 <= amount


def test_generated_config_loads_and_admits_fractional_and_gang_gpus(tmp_path):
    write_kueue_config(tmp_path, synthetic_nodes())
    objects = load_config_dir(tmp_path)
    assert len(objects.cluster_queues) == len(TEAM_NAMESPACES)
    assert objects.local_queues[("ml-team", "lq-ml-team")].cluster_queue == "cq-ml-team"
    assert {cq.cohort for cq in objects.cluster_queues.values()} == {"research", "product"}
    snapshot = build_snapshot(objects, [])

    def wl(name: str, gpu: int) -> Workload:
        requests = (("cpu", 4000), ("memory", 8 * 2**30 * 1000), ("nvidia.com/gpu", gpu))
        return Workload(namespace="ml-team", name=name, queue_name="lq-ml-team",
                        pod_sets=(PodSet(name="main", count=1, requests=requests),), priority=0, created_at=1.0,
                        uid=name)

    result = drain(snapshot, [wl("frac", 460), wl("gang", 8000)], 10.0)
    decisions = {d.workload: d for d in result.decisions}
    assert decisions["ml-team/frac"].status == WorkloadStatus.ADMITTED
    assert decisions["ml-team/gang"].status == WorkloadStatus.ADMITTED  # borrows from its cohort


def test_objects_round_trip_through_yaml():
    objects, queues = build_kueue_objects(synthetic_nodes(), quota_scale=0.5, borrow_factor=None)
    docs = list(yaml.safe_load_all(yaml.safe_dump_all(objects)))
    loaded = load_objects([("gen", d) for d in docs])
    assert set(loaded.flavors) == set(queues.flavor_order)
    cq = loaded.cluster_queues["cq-vision"]
    assert all(r.borrowing_limit is None for rg in cq.resource_groups for f in rg.flavors for r in f.resources)


def test_at_iso_writes_what_utc_iso_writes_for_the_same_millisecond():
    import random
    from datetime import timedelta

    from services.contracts.codec import utc_iso
    from services.sim.workloads import SIM_EPOCH, at_iso

    rng = random.Random(3)
    moments = [0, 0.0004, 0.0005, 1.2345, 59.9999, -0.001, -3600.5, 86_400 * 400 + 0.25]
    moments += [rng.uniform(-1e6, 5e7) for _ in range(2000)] + [rng.randint(0, 10**6) / 1000 for _ in range(2000)]
    for s in moments:
        assert at_iso(s) == utc_iso(SIM_EPOCH + timedelta(milliseconds=round(s * 1000))), s
