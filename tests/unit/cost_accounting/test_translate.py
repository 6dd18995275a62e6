"""translate.py: contract envelopes → cost core events."""

from __future__ import annotations

from services.contracts.codec import make_envelope
from services.contracts.events import (
    ClockTick,
    PodRunning,
    WorkloadPending,
    WorkloadQuotaReserved,
    WorkloadRunning,
)
from services.core.cost import ClockTick as CoreTick
from services.core.cost import PodsRunning, PodsStopped, ReservationStarted
from services.cost_accounting.translate import translate

T = "2026-11-29T10:00:00Z"
MS = 1_795_946_400_000


def env(payload):
    return make_envelope(payload, producer="test", occurred_at=T)


def reserved(usage):
    return env(WorkloadQuotaReserved(uid="w", namespace="ns", name="w", cluster_queue="cq", flavors={}, counts={},
                                     usage=usage, reserved_at=T))


def pod(uid="p1", gpu=4000):
    return env(PodRunning(uid=uid, workload_uid="w", namespace="ns", name=uid, started_at=T,
                          requests={"nvidia.com/gpu": gpu}))


def test_reservation_takes_the_gpu_flavor():
    t = translate(reserved({"cpu-flavor": {"cpu": 4000}, "a100": {"nvidia.com/gpu": 16000, "cpu": 2000}}))
    (event,) = t.events
    assert isinstance(event, ReservationStarted)
    assert (event.flavor, event.resources.gpu_milli, event.resources.cpu_milli, event.at_ms) == ("a100", 16000, 2000, MS)
    assert t.memo.flavor == "a100"


def test_a_flavor_holding_only_the_pod_count_is_not_the_one_billed():
    # a ClusterQueue that covers Kueue's `pods` in a resource group of its own
    t = translate(reserved({"a-pods": {"pods": 1000}, "cpu-flavor": {"cpu": 4000}}))
    (event,) = t.events
    assert (event.flavor, event.resources.cpu_milli) == ("cpu-flavor", 4000)


def test_pod_before_reservation_is_deferred_then_replayed():
    first = translate(pod())
    assert first.events == () and len(first.memo.deferred) == 1
    then = translate(reserved({"a100": {"nvidia.com/gpu": 4000}}), first.memo)
    assert [type(e) for e in then.events] == [ReservationStarted, PodsRunning]
    assert then.events[1].flavor == "a100" and then.events[1].pod_name == "p1" and then.memo.deferred == ()


def test_pods_supersede_workload_running():
    memo = translate(reserved({"a100": {"nvidia.com/gpu": 8000}})).memo
    running = translate(env(WorkloadRunning(uid="w", namespace="ns", name="w", started_at=T)), memo)
    (unnamed,) = running.events
    assert unnamed.pod_name == "" and unnamed.resources.gpu_milli == 8000
    after = translate(pod(), running.memo)
    assert isinstance(after.events[0], PodsStopped) and after.events[0].pod_name == "" and after.events[0].at_ms == MS
    assert isinstance(after.events[1], PodsRunning) and after.memo.pod_level
    # workload.running after pods: ignored
    assert translate(env(WorkloadRunning(uid="w", namespace="ns", name="w", started_at=T)), after.memo).events == ()


def test_tick_and_ignored_types():
    (tick,) = translate(env(ClockTick(at=T, source="s"))).events
    assert isinstance(tick, CoreTick) and tick.at_ms == MS
    assert translate(env(WorkloadPending(uid="w", namespace="ns", name="w", reason="r", message="m"))).events == ()
