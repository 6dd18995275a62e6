"""The preemption service's fold without Kafka: answers, evictions, history, dedupe, thrash."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.contracts.codec import encode, make_envelope, utc_iso
from services.contracts.events import PreemptionNeeded, WorkloadRunning
from services.core.quota import load_objects
from services.preemption.fold import Context, apply

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
COHORT = "cohort:ai-platform"


def at(minutes: float) -> str:
    return utc_iso(T0 + timedelta(minutes=minutes))


def kueue_docs() -> list[dict]:
    """One 32-GPU ClusterQueue in a cohort, preempting lower priority; three teams queue in it."""
    docs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Cohort", "metadata": {"name": "ai-platform"}, "spec": {}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "gpu-queue"},
         "spec": {"cohort": "ai-platform", "namespaceSelector": {},
                  "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                      {"name": "a100-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 32}]}]}]}},
    ]
    for ns, queue in [("ml-team", "team-ml"), ("batch-team", "batch"), ("serving-team", "serving")]:
        docs.append({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                     "metadata": {"name": queue, "namespace": ns}, "spec": {"clusterQueue": "gpu-queue"}})
    return docs


CTX = Context(objects=load_objects(("kueue.yaml", d) for d in kueue_docs()))
QUEUES = {"ml-team": "team-ml", "batch-team": "batch", "serving-team": "serving"}


def admitted(ns, name, cls, gpus, prio=0, reserved=-120.0, running=-119.0):
    return {"uid": f"uid-{name}", "namespace": ns, "name": name, "cluster_queue": "gpu-queue", "priority": prio,
            "created_at": at(reserved - 1), "labels": {"quartermaster.dev/class": cls},
            "usage": {"a100-flavor": {"nvidia.com/gpu": gpus * 1000}}, "reserved_at": at(reserved),
            "running_at": at(running) if running is not None else None}


def needed(ns, name, cls, gpus, prio, running, minute=0.0):
    preemptor = {"uid": f"uid-{name}", "namespace": ns, "name": name, "cluster_queue": "gpu-queue", "priority": prio,
                 "created_at": at(minute), "labels": {"quartermaster.dev/class": cls}, "queue_name": QUEUES[ns],
                 "pod_sets": [{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}]}
    payload = PreemptionNeeded(preemptor=preemptor, cohort=COHORT, snapshot={"admitted": running, "now": at(minute)},
                               message="insufficient unused quota for nvidia.com/gpu in flavor a100-flavor")
    return make_envelope(payload, producer="queue-manager", occurred_at=at(minute))


FULL = [admitted("ml-team", "llm-ft", "training", 16, reserved=-10, running=-9),  # the most recent
        admitted("batch-team", "b1", "batch", 8, reserved=-180),
        admitted("batch-team", "b2", "batch", 4, reserved=-60),
        admitted("batch-team", "b3", "batch", 4, reserved=-30)]


def answer(outputs):
    return next(o.envelope.payload for o in outputs if o.topic == "qm.preemption")


def test_inference_takes_batch_victims_with_their_grace_period_and_never_training():
    state, outputs = apply(None, needed("serving-team", "chat", "inference", 8, 1000, FULL), CTX)
    selected = answer(outputs)
    assert selected.blocked_message is None
    assert [(v["name"], v["reason"], v["grace_period_s"]) for v in selected.victims] == [
        ("b3", "InClusterQueue", 120), ("b2", "InClusterQueue", 120)]
    assert selected.victims[0]["policy"] == "default: inference mayPreempt batch of lower priority"
    evicts = [o for o in outputs if o.topic == "qm.actions"]
    assert [(o.key, o.envelope.payload.grace_period_s) for o in evicts] == [("uid-b3", 120), ("uid-b2", 120)]
    assert evicts[0].envelope.payload.reason == (
        "Preempted by serving-team/chat (InClusterQueue, policy default: inference mayPreempt batch of lower priority)")
    for o in outputs:
        encode(o.envelope)  # valid against the schemas
    assert [len(state["workloads"][u]["preempted"]) for u in ("uid-b2", "uid-b3")] == [1, 1]
    assert len(state["namespaces"]["batch-team"]) == 2


def test_blocked_when_only_a_training_victim_would_do():
    running = [FULL[0], FULL[1], admitted("serving-team", "chat", "inference", 8, prio=1000, reserved=0, running=1)]
    _, outputs = apply(None, needed("serving-team", "chat-2", "inference", 16, 1000, running, minute=2), CTX)
    selected = answer(outputs)
    assert selected.victims == []
    assert selected.blocked_message.startswith(
        "would need to preempt training job ml-team/llm-ft, which is not preemptible")
    assert [o.topic for o in outputs] == ["qm.preemption", "qm.workloads"]  # no eviction, the answer only


def test_the_answer_joins_the_cohorts_stream_with_the_same_id_as_on_the_request_topic():
    """The queue-manager folds the answer from qm.workloads, where the preemption service puts
    it itself (ADR 0025): one event, one id, keyed by cohort on both topics."""
    _, outputs = apply(None, needed("serving-team", "chat", "inference", 8, 1000, FULL), CTX)
    answers = [o for o in outputs if o.envelope.event_type == "preemption.victims_selected.v1"]
    assert [(o.topic, o.key) for o in answers] == [("qm.preemption", COHORT), ("qm.workloads", COHORT)]
    assert answers[0].envelope is answers[1].envelope


def test_same_request_twice_counts_once_and_answers_with_the_same_id():
    event = needed("serving-team", "chat", "inference", 8, 1000, FULL)
    state, first = apply(None, event, CTX)
    state, second = apply(state, event, CTX)  # the runtime dedupes by id; a re-sent request still counts once
    assert [o.envelope.event_id for o in first] == [o.envelope.event_id for o in second]
    assert len(state["workloads"]["uid-b3"]["preempted"]) == 1


def test_an_idle_reservation_counts_as_started_when_it_was_reserved():
    """The request carries each possible victim's reservation and start: one that holds quota
    but has not started yet is protected by the minimum runtime from its reservation on."""
    idle = admitted("batch-team", "b9", "batch", 32, reserved=-2, running=None)
    _, outputs = apply(None, needed("serving-team", "chat", "inference", 8, 1000, [idle]), CTX)
    assert "has run 2m of its minRuntimeBeforePreemption 5m" in answer(outputs).blocked_message
    started_long_ago = admitted("batch-team", "b9", "batch", 32, reserved=-60, running=-2)
    _, outputs = apply(None, needed("serving-team", "chat", "inference", 8, 1000, [started_long_ago]), CTX)
    assert "has run 2m of its minRuntimeBeforePreemption 5m" in answer(outputs).blocked_message  # running wins
    _, outputs = apply(None, needed("serving-team", "chat", "inference", 8, 1000,
                                    [admitted("batch-team", "b9", "batch", 32, reserved=-60, running=-10)]), CTX)
    assert [v["name"] for v in answer(outputs).victims] == ["b9"]


def test_the_lifecycle_on_other_topics_is_not_folded():
    """Only requests are read (qm.preemption): a lifecycle event changes nothing (ADR 0021)."""
    state, _ = apply(None, needed("serving-team", "hi-0", "inference", 32, 1000,
                                  [admitted("batch-team", "loop", "batch", 32, reserved=-7, running=-6)], 0), CTX)
    before = {k: v for k, v in state.items() if k != "now"}
    running = make_envelope(WorkloadRunning(uid="uid-x", namespace="batch-team", name="x", started_at=at(1)),
                            producer="queue-manager", occurred_at=at(1))
    state, outputs = apply(state, running, CTX)
    assert outputs == [] and {k: v for k, v in state.items() if k != "now"} == before


def test_fits_already_means_no_victims_and_no_block():
    _, outputs = apply(None, needed("serving-team", "chat", "inference", 8, 1000, FULL[1:]), CTX)
    assert answer(outputs).victims == [] and answer(outputs).blocked_message is None


def thrash(rounds: int, spacing_min: float):
    """High inference and low batch arrivals alternate for the same 32 GPUs held by one batch job
    that is re-admitted (and has run 6 minutes) each time it is preempted."""
    state, chosen, blocked = None, [], []
    for i in range(rounds):
        minute = i * spacing_min
        loop = admitted("batch-team", "loop", "batch", 32, reserved=minute - 7, running=minute - 6)
        state, out = apply(state, needed("serving-team", f"hi-{i}", "inference", 32, 1000, [loop], minute), CTX)
        selected = answer(out)
        if selected.victims:
            chosen.append(minute)
        else:
            blocked.append(selected.blocked_message)
        hi = admitted("serving-team", f"hi-{i}", "inference", 32, prio=1000, reserved=minute, running=minute)
        state, out = apply(state, needed("batch-team", f"lo-{i}", "batch", 32, 0, [hi], minute + 1), CTX)
        assert answer(out).victims == []  # low never preempts high
    return chosen, blocked


def test_thrash_never_preempts_one_workload_more_than_the_cap_per_window():
    chosen, blocked = thrash(rounds=13, spacing_min=10)
    for start in chosen:
        assert sum(1 for t in chosen if start <= t < start + 60) <= 3
    assert chosen == [0, 10, 20, 60, 70, 80, 120]
    assert "already preempted 3 times in the last 1h" in blocked[0]


def test_history_past_the_horizon_is_dropped_once_a_minute_of_event_time_not_per_event():
    def request(minute):  # a request that chooses nobody: it only moves the cohort's time on
        return needed("batch-team", f"lo-{minute}", "batch", 1, 0, [], minute)

    state, _ = apply(None, needed("serving-team", "hi-0", "inference", 32, 1000,
                                  [admitted("batch-team", "loop", "batch", 32, reserved=-7, running=-6)], 0), CTX)
    assert state["workloads"]["uid-loop"]["preempted"]  # recorded at minute 0
    state, _ = apply(state, request(30), CTX)
    assert state["workloads"]["uid-loop"]["preempted"]  # inside the hour's horizon: kept
    state, _ = apply(state, request(61), CTX)
    assert "uid-loop" not in state["workloads"]  # past the horizon, and the last walk was > 60 s ago
    walked = state["forgot_at"]
    assert walked == datetime.fromisoformat(at(61)).timestamp()
    state, _ = apply(state, request(61.5), CTX)
    assert state["forgot_at"] == walked  # 30 s later: no walk
