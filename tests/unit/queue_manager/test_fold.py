"""The queue-manager fold on the field report's seed config, without Kafka."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fold_steps import fold_all

from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import make_envelope
from services.contracts.events import (
    ClockTick,
    WorkloadFinished,
    WorkloadRejected,
    WorkloadRunning,
    WorkloadValidated,
)
from services.queue_manager.state import Context, KeyedContexts, by_creation_timestamp

SEED = Path(__file__).resolve().parents[3] / "examples" / "seed"
CONFIG = KueueConfig.load(SEED)
CTX = Context(objects=CONFIG.objects, pods_ready_timeout_s=300, node_labels=CONFIG.node_labels())


def validated(name: str, gpus: int, at: str = "2026-11-29T10:00:00Z", priority: int = 0):
    payload = WorkloadValidated(
        uid=f"uid-{name}", namespace="ml-team", name=name, queue_name="team-ml", cluster_queue="gpu-queue",
        priority=priority, created_at=at,
        pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}],
    )
    return make_envelope(payload, producer="test", occurred_at=at)


def tick(at: str):
    return make_envelope(ClockTick(at=at, source="test"), producer="test", occurred_at=at)


def run(events, state=None):
    return fold_all(events, CTX, state)


def types(outputs):
    return [o.envelope.event_type for o in outputs]


def test_admits_on_the_flavor_and_pins_its_nodes_while_12_gpus_are_in_use():
    state, outputs = run([validated("used", 12), validated("train-4", 4)])
    assert set(state["admitted"]) == {"uid-used", "uid-train-4"}
    reserved = [o for o in outputs if o.envelope.event_type == "workload.quota_reserved.v1"][-1]
    assert reserved.envelope.payload.flavors == {"main": {"nvidia.com/gpu": "a100-flavor"}}
    admit = [o for o in outputs if o.envelope.event_type == "action.admit.v1"][-1]
    assert admit.envelope.payload.node_selector == {"gpu.nvidia.com/class": "a100"}
    usage = [o for o in outputs if o.topic == "qm.usage"][-1].envelope.payload
    assert usage.reserved == {"a100-flavor": {"nvidia.com/gpu": 16000}}


def test_pending_with_kueues_message_and_only_once_while_nothing_changes():
    state, outputs = run([validated("used", 24), validated("train-16", 16)])
    pending = [o.envelope.payload for o in outputs if o.envelope.event_type == "workload.pending.v1"]
    assert len(pending) == 1
    assert "insufficient unused quota for nvidia.com/gpu in flavor a100-flavor, 8 more needed" in pending[0].message
    state, outputs = run([tick("2026-11-29T10:00:30Z"), tick("2026-11-29T10:01:00Z")], state)
    assert outputs == []  # nothing changed, nothing said
    state, outputs = run([validated("small", 1)], state)
    assert "uid-small" in state["admitted"]
    # An arrival is judged alone (it frees nothing), so the waiting job is not re-said...
    assert [o.envelope.payload.name for o in outputs if o.envelope.event_type == "workload.pending.v1"] == []
    # ...until something that frees quota re-evaluates the whole queue.
    small_done = make_envelope(WorkloadFinished(uid="uid-small", namespace="ml-team", name="small", succeeded=True,
                                                finished_at="2026-11-29T10:02:00Z"),
                               producer="test", occurred_at="2026-11-29T10:02:00Z")
    state, outputs = run([small_done], state)
    assert [o.envelope.event_type for o in outputs if o.envelope.event_type == "workload.pending.v1"] == []


def test_finish_releases_quota_and_admits_what_now_fits_in_the_same_event():
    state, _ = run([validated("used", 24), validated("train-16", 16)])
    finished = make_envelope(
        WorkloadFinished(uid="uid-used", namespace="ml-team", name="used", succeeded=True,
                         finished_at="2026-11-29T11:00:00Z"),
        producer="test", occurred_at="2026-11-29T11:00:00Z")
    state, outputs = run([finished], state)
    # one usage record for the namespace, after both changes: the release and the reservation
    assert types(outputs) == ["workload.released.v1", "workload.quota_reserved.v1", "action.admit.v1",
                              "usage.snapshot.v1"]
    assert outputs[-1].envelope.payload.reserved == {"a100-flavor": {"nvidia.com/gpu": 16000}}
    assert set(state["admitted"]) == {"uid-train-16"}


def test_reservation_that_never_runs_expires_is_requeued_with_backoff_and_priced_idle():
    state, _ = run([validated("stuck", 16)])
    state, outputs = run([tick("2026-11-29T10:04:59Z")], state)
    assert "workload.prefreeze_expired.v1" not in types(outputs)
    state, outputs = run([tick("2026-11-29T10:05:00Z")], state)
    expired = next(o.envelope.payload for o in outputs if o.envelope.event_type == "workload.prefreeze_expired.v1")
    assert expired.idle_s == 300 and expired.usage == {"a100-flavor": {"nvidia.com/gpu": 16000}}
    requeued = next(o.envelope.payload for o in outputs if o.envelope.event_type == "workload.requeued.v1")
    assert requeued.backoff_s == 60 and requeued.requeue_at == "2026-11-29T10:06:00Z"
    assert "uid-stuck" in state["pending"]
    state, outputs = run([tick("2026-11-29T10:06:00Z")], state)
    assert "uid-stuck" in state["admitted"]  # eligible again after the backoff


def test_an_expired_reservation_stops_its_job_so_late_pods_do_not_run_on_released_quota():
    # The admit unsuspended the Job; its pods never ran (no node for them yet, say). Kueue
    # evicts on waitForPodsReady's timeout, and so does the queue-manager: an Evict without
    # grace, keyed by the workload, with an id fixed by the reservation it ends.
    state, _ = run([validated("stuck", 16)])
    state, outputs = run([tick("2026-11-29T10:05:00Z")], state)
    (stop,) = [o for o in outputs if o.envelope.event_type == "action.evict.v1"]
    assert stop.topic == "qm.actions" and stop.key == "uid-stuck"
    p = stop.envelope.payload
    assert (p.workload_uid, p.name, p.namespace, p.kind) == ("uid-stuck", "stuck", "ml-team", "Job")
    assert (p.reason, p.grace_period_s) == ("PodsReadyTimeout", 0)
    assert types(outputs).index("workload.released.v1") < types(outputs).index("action.evict.v1")
    _, again = run([validated("stuck", 16), tick("2026-11-29T10:05:00Z")])
    assert [o.envelope.event_id for o in again if o.envelope.event_type == "action.evict.v1"] == [stop.envelope.event_id]
    # readmitted after the backoff: the next expiry is another reservation, another stop
    state, _ = run([tick("2026-11-29T10:06:00Z")], state)
    state, outputs = run([tick("2026-11-29T10:11:00Z")], state)
    (second,) = [o for o in outputs if o.envelope.event_type == "action.evict.v1"]
    assert second.envelope.event_id != stop.envelope.event_id


def _running(name: str, at: str):
    return make_envelope(WorkloadRunning(uid=f"uid-{name}", namespace="ml-team", name=name, started_at=at),
                         producer="test", occurred_at=at)


def _finished(name: str, at: str):
    return make_envelope(WorkloadFinished(uid=f"uid-{name}", namespace="ml-team", name=name, succeeded=True,
                                          finished_at=at), producer="test", occurred_at=at)


def _after_an_expiry(ctx):
    """A (10:00) is reserved and never starts; B (10:01) and C (10:02) wait. A's reservation
    expires at 10:05, and B takes the quota while A backs off. When B finishes, A (waiting again
    since 10:05) and C (since 10:02) both want the queue's 32 GPUs: who gets them?"""
    events = [validated("a", 32, "2026-11-29T10:00:00Z"), validated("b", 32, "2026-11-29T10:01:00Z"),
              validated("c", 32, "2026-11-29T10:02:00Z"), tick("2026-11-29T10:05:00Z"),
              _running("b", "2026-11-29T10:05:30Z"), tick("2026-11-29T10:07:00Z"), _finished("b", "2026-11-29T10:30:00Z")]
    state, _ = fold_all(events, ctx)
    return set(state["admitted"])


def test_a_workload_requeued_after_its_prefreeze_expired_waits_behind_those_queued_before_the_expiry():
    """ADR 0074, Kueue's default waitForPodsReady.requeuingStrategy.timestamp (Eviction): the
    Job whose pods never became ready goes to the back of its queue, not ahead of C again."""
    assert _after_an_expiry(CTX) == {"uid-c"}


def test_the_creation_timestamp_strategy_keeps_its_place():
    assert _after_an_expiry(dataclasses.replace(CTX, requeue_after_expiry_by_creation=True)) == {"uid-a"}


def test_the_requeuing_timestamp_reads_kueues_names_and_refuses_others():
    assert by_creation_timestamp("Eviction") is False and by_creation_timestamp("creation") is True
    with pytest.raises(ValueError, match="QM_REQUEUE_TIMESTAMP='Oldest': expected Eviction .* or Creation"):
        by_creation_timestamp("Oldest")


def test_running_reservation_does_not_expire_and_counts_as_running():
    state, _ = run([validated("ok", 8)])
    running = make_envelope(WorkloadRunning(uid="uid-ok", namespace="ml-team", name="ok",
                                            started_at="2026-11-29T10:01:00Z"),
                            producer="test", occurred_at="2026-11-29T10:01:00Z")
    state, outputs = run([running, tick("2026-11-29T11:00:00Z")], state)
    assert "workload.prefreeze_expired.v1" not in types(outputs)
    usage = [o for o in outputs if o.topic == "qm.usage"][0].envelope.payload
    assert usage.running == {"a100-flavor": {"nvidia.com/gpu": 8000}} and usage.reserved == {}


def test_deactivated_after_too_many_expiries():
    state, _ = run([validated("never", 4)])
    minutes = ["10:05:00", "10:11:00", "10:18:00", "10:30:00", "10:40:00"]
    all_out = []
    for m in minutes:
        state, outputs = run([tick(f"2026-11-29T{m}Z")], state)
        all_out += outputs
    assert "workload.deactivated.v1" in types(all_out)
    # every expiry stopped the Job, the last (deactivating) one too
    assert types(all_out).count("action.evict.v1") == types(all_out).count("workload.prefreeze_expired.v1") == CTX.max_expiries
    assert "uid-never" not in state["pending"] and "uid-never" not in state["admitted"]


def test_same_events_give_the_same_outputs():
    events = [validated("a", 12), validated("b", 16), validated("c", 8), tick("2026-11-29T10:05:00Z")]
    _, first = run(events)
    _, second = run(events)
    assert [o.envelope.event_id for o in first] == [o.envelope.event_id for o in second]


def test_zombie_is_released_and_cleaned_up_after_its_ttl():
    from services.contracts.events import PodFinished, PodRunning

    state, _ = run([validated("ghost", 8)])
    pod_up = make_envelope(PodRunning(uid="pod-ghost", workload_uid="uid-ghost", namespace="ml-team", name="ghost-0",
                                      node="n1", started_at="2026-11-29T10:01:00Z"),
                           producer="test", occurred_at="2026-11-29T10:01:00Z")
    running = make_envelope(WorkloadRunning(uid="uid-ghost", namespace="ml-team", name="ghost",
                                            started_at="2026-11-29T10:01:00Z"),
                            producer="test", occurred_at="2026-11-29T10:01:00Z")
    pod_gone = make_envelope(PodFinished(uid="pod-ghost", workload_uid="uid-ghost", namespace="ml-team",
                                         name="ghost-0", phase="Deleted", finished_at="2026-11-29T10:30:00Z"),
                             producer="test", occurred_at="2026-11-29T10:30:00Z")
    state, _ = run([pod_up, running, pod_gone, tick("2026-11-29T10:39:59Z")], state)
    assert "uid-ghost" in state["admitted"]  # within the TTL: maybe the pods come back
    state, outputs = run([tick("2026-11-29T10:40:00Z")], state)
    assert "uid-ghost" not in state["admitted"]
    released = next(o.envelope.payload for o in outputs if o.envelope.event_type == "workload.released.v1")
    assert (released.reason, released.released_at) == ("ZombieTTLExpired", "2026-11-29T10:40:00Z")
    cleanup = next(o for o in outputs if o.envelope.event_type == "action.cleanup.v1")
    assert cleanup.topic == "qm.actions" and cleanup.envelope.payload.name == "ghost"


def test_quota_available_but_no_node_fits_is_a_distinct_reason():
    from services.contracts.events import NodeCapacity

    nodes = [make_envelope(NodeCapacity(node=f"a100-{i}", flavor="a100-flavor", allocatable={"nvidia.com/gpu": 8000}),
                           producer="test", occurred_at="2026-11-29T09:59:00Z", identity=(i,)) for i in range(4)]
    # 32 GPUs of quota on four 8-GPU nodes: one 6-GPU pod on each node leaves 2 free per node.
    state, _ = run([*nodes, *[validated(f"six-{i}", 6) for i in range(4)]])
    assert len(state["admitted"]) == 4
    state, outputs = run([validated("four", 4)], state)  # 8 GPUs of quota left, but no node has 4 free
    pending = [o.envelope.payload for o in outputs if o.envelope.event_type == "workload.pending.v1"]
    assert [(p.reason, p.message) for p in pending] == [
        ("NoFit", "quota available, but no a100-flavor node has 4 free nvidia.com/gpu")]
    state, outputs = run([validated("two", 2)], state)  # a 2-GPU pod still fits on a node
    assert "uid-two" in state["admitted"]


def test_placement_follows_nodes_that_join_and_leave_after_it_first_looked():
    """The nodes of each flavor are kept between placements; a node.capacity event that adds or
    removes a node must show in the very next placement."""
    from services.contracts.events import NodeCapacity

    def node(name, gpus, at, deleted=False):
        return make_envelope(NodeCapacity(node=name, flavor="a100-flavor", allocatable={"nvidia.com/gpu": gpus * 1000},
                                          deleted=deleted), producer="test", occurred_at=at, identity=(name, at))

    state, _ = run([node("a100-0", 8, "2026-11-29T09:59:00Z"), validated("six", 6)])
    assert [n for n, _ in state["admitted"]["uid-six"]["placement"]] == ["a100-0"]
    state, _ = run([node("a100-1", 8, "2026-11-29T10:01:00Z"), validated("four", 4)], state)
    assert [n for n, _ in state["admitted"]["uid-four"]["placement"]] == ["a100-1"]  # the node that joined
    state, outputs = run([node("a100-1", 8, "2026-11-29T10:02:00Z", deleted=True), validated("three", 3)], state)
    pending = [o.envelope.payload for o in outputs if o.envelope.event_type == "workload.pending.v1"]
    assert [(p.reason, p.message) for p in pending] == [
        ("NoFit", "quota available, but no a100-flavor node has 3 free nvidia.com/gpu")]  # a100-1 is gone


def test_a_release_judges_what_can_fit_and_one_more_not_the_whole_deep_queue():
    state, _ = run([validated("big", 32)] + [validated(f"w{i:02d}", 8, at=f"2026-11-29T10:{i:02d}:00Z")
                                             for i in range(1, 41)])
    assert len(state["pending"]) == 40
    finished = make_envelope(WorkloadFinished(uid="uid-big", namespace="ml-team", name="big", succeeded=True,
                                              finished_at="2026-11-29T11:00:00Z"),
                             producer="test", occurred_at="2026-11-29T11:00:00Z")
    state, outputs = run([finished], state)
    reserved = [o.envelope.payload.name for o in outputs if o.envelope.event_type == "workload.quota_reserved.v1"]
    assert reserved == ["w01", "w02", "w03", "w04"]  # 32 GPUs free: the four oldest 8-GPU workloads
    pending = [o.envelope.payload.name for o in outputs if o.envelope.event_type == "workload.pending.v1"]
    assert pending == []  # w05 was judged (the one more) and its message did not change; w06.. not judged
    assert len(state["pending"]) == 36


def test_a_keyed_context_is_made_once_per_key_and_again_for_a_new_config():
    contexts = KeyedContexts()
    first = contexts.of(CTX, "cohort-a")
    assert first.cache_key == "cohort-a" and first.objects is CTX.objects
    assert contexts.of(CTX, "cohort-a") is first
    assert contexts.of(CTX, "cohort-b").cache_key == "cohort-b"
    reconfigured = dataclasses.replace(CTX, max_expiries=5)
    again = contexts.of(reconfigured, "cohort-a")
    assert again is not first and again.max_expiries == 5 and again.cache_key == "cohort-a"


def test_a_workload_deleted_before_its_verdict_arrives_is_never_queued():
    # The owner deletes a Job a moment after creating it. Admission forwards the deletion on its
    # fact lane and judges the submission on its own lane, with no order between the two: the
    # verdict can reach the cohort's stream after the finish. Queued then, it would hold quota
    # for a workload that no longer exists.
    deleted = make_envelope(WorkloadFinished(uid="uid-gone", namespace="ml-team", name="gone", succeeded=False,
                                             finished_at="2026-11-29T10:00:00Z"),
                            producer="test", occurred_at="2026-11-29T10:00:00Z")
    state, outputs = run([deleted, validated("gone", 4)])
    assert "uid-gone" not in state["admitted"] and "uid-gone" not in state["pending"]
    assert [o for o in outputs if o.envelope.event_type in ("workload.quota_reserved.v1", "action.admit.v1")] == []
    # others are judged as before
    state, outputs = run([validated("next", 4)], state)
    assert "uid-next" in state["admitted"]


def running(name: str, at: str):
    return make_envelope(WorkloadRunning(uid=f"uid-{name}", namespace="ml-team", name=name, started_at=at),
                         producer="test", occurred_at=at)


def test_a_queued_job_that_runs_before_admission_is_stopped_once():
    # train-16 waits for quota; someone unsuspends its Job by hand (or the webhook was away when
    # it was created) and its pods run on quota nobody reserved. Kueue's reconciler stops a Job
    # it has not admitted; so does the queue-manager, once, without grace.
    state, _ = run([validated("used", 24), validated("train-16", 16)])
    assert "uid-train-16" in state["pending"]
    state, outputs = run([running("train-16", "2026-11-29T10:01:00Z")], state)
    (stop,) = [o for o in outputs if o.envelope.event_type == "action.evict.v1"]
    assert stop.topic == "qm.actions" and stop.key == "uid-train-16"
    assert (stop.envelope.payload.reason, stop.envelope.payload.grace_period_s) == ("NotAdmitted", 0)
    assert "uid-train-16" in state["pending"] and "uid-train-16" not in state["admitted"]
    # its other pods' running facts ask nothing more; the workload still waits its turn
    state, outputs = run([running("train-16", "2026-11-29T10:01:02Z")], state)
    assert "action.evict.v1" not in types(outputs)
    done = make_envelope(WorkloadFinished(uid="uid-used", namespace="ml-team", name="used", succeeded=True,
                                          finished_at="2026-11-29T10:30:00Z"),
                         producer="test", occurred_at="2026-11-29T10:30:00Z")
    state, outputs = run([done], state)
    assert "uid-train-16" in state["admitted"] and "action.admit.v1" in types(outputs)
    _, again = run([validated("used", 24), validated("train-16", 16), running("train-16", "2026-11-29T10:01:00Z")])
    assert [o.envelope.event_id for o in again if o.envelope.event_type == "action.evict.v1"] == [stop.envelope.event_id]


def test_running_facts_of_admitted_or_requeued_workloads_stop_nothing():
    # admitted: its pods are meant to run
    state, outputs = run([validated("ok", 8), running("ok", "2026-11-29T10:01:00Z")])
    assert "action.evict.v1" not in types(outputs)
    # requeued after its reservation expired: that expiry stopped its Job already, and a pod
    # that was starting as it expired says nothing new
    state, _ = run([validated("stuck", 16), tick("2026-11-29T10:05:00Z")])
    assert "uid-stuck" in state["pending"]
    state, outputs = run([running("stuck", "2026-11-29T10:05:01Z")], state)
    assert "action.evict.v1" not in types(outputs)


def test_a_job_running_before_its_verdict_is_stopped_when_the_verdict_comes():
    # Created where no webhook suspends it, the Job runs at once; admission's fact lane and its
    # verdicts are separate consumers, so the running fact can come first. The verdict then
    # queues it and stops it before anything else is said about it.
    state, outputs = run([running("early", "2026-11-29T10:00:01Z")])
    assert outputs == [] and "uid-early" not in state["pending"]
    state, outputs = run([validated("early", 8)], state)
    assert types(outputs)[0] == "action.evict.v1" and outputs[0].envelope.payload.reason == "NotAdmitted"
    # 8 GPUs fit: admitted in the same step, after the stop, so the watcher suspends, then pins
    # and unsuspends it, in that order (both keyed by the workload)
    assert "action.admit.v1" in types(outputs)
    assert types(outputs).index("action.evict.v1") < types(outputs).index("action.admit.v1")
    assert "running_unjudged" in state and "uid-early" not in state["running_unjudged"]


def rejected(name: str, at: str = "2026-11-29T10:00:00Z"):
    return make_envelope(WorkloadRejected(uid=f"uid-{name}", namespace="ml-team", name=name, message="no",
                                          violations=[{"policy": "p", "enforcement_action": "deny", "message": "no"}]),
                         producer="admission", occurred_at=at)


def test_a_rejected_workload_is_stopped_whenever_its_job_runs():
    # Admission said no; the Job was unsuspended by hand (or created where the mutating webhook
    # is not installed). Kueue stops every queue-labelled Job it has not admitted (ADR 0065).
    state, outputs = run([rejected("denied")])
    assert outputs == [] and "uid-denied" not in state["pending"] and "uid-denied" in state["rejected"]
    state, outputs = run([running("denied", "2026-11-29T10:01:00Z")], state)
    (stop,) = outputs
    p = stop.envelope.payload
    assert (stop.topic, stop.key, p.reason, p.grace_period_s) == ("qm.actions", "uid-denied", "NotAdmitted", 0)
    assert (p.workload_uid, p.namespace, p.name, p.kind) == ("uid-denied", "ml-team", "denied", "Job")
    # the same fact again (redelivered): the same stop, which readers drop as a copy
    _, again = run([rejected("denied"), running("denied", "2026-11-29T10:01:00Z")])
    assert [o.envelope.event_id for o in again] == [stop.envelope.event_id]
    # unsuspended again later: stopped again
    state, later = run([running("denied", "2026-11-29T10:20:00Z")], state)
    assert types(later) == ["action.evict.v1"] and later[0].envelope.event_id != stop.envelope.event_id
    # its Job is gone: forgotten
    done = make_envelope(WorkloadFinished(uid="uid-denied", namespace="ml-team", name="denied", succeeded=False,
                                          finished_at="2026-11-29T10:30:00Z"),
                         producer="watcher", occurred_at="2026-11-29T10:30:00Z")
    state, _ = run([done], state)
    assert "uid-denied" not in state["rejected"]


def test_a_rejected_job_that_ran_before_its_verdict_is_stopped_when_the_verdict_comes():
    state, outputs = run([running("denied-early", "2026-11-29T10:00:01Z")])
    assert outputs == []
    state, outputs = run([rejected("denied-early")], state)
    assert types(outputs) == ["action.evict.v1"] and outputs[0].envelope.payload.reason == "NotAdmitted"
    assert "uid-denied-early" not in state["running_unjudged"]


def test_a_rejection_after_a_validation_changes_nothing():
    # judged twice (a resubmission): the first verdict stands, and a queued workload that runs
    # is stopped once, as ADR 0062 says, not once more for the rejection
    state, _ = run([validated("twice", 64)])
    assert "uid-twice" in state["pending"]
    state, outputs = run([rejected("twice")], state)
    assert outputs == [] and "uid-twice" in state["pending"] and "uid-twice" not in state.get("rejected", {})
