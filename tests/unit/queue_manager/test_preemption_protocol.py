"""The queue-manager's side of preemption: ask with the cohort snapshot, then hold the freed
quota for the preemptor when the preemption service answers."""

from __future__ import annotations

import yaml
from fold_steps import fold_all

from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import make_envelope
from services.contracts.events import DrainDue, PreemptionVictimsSelected, WorkloadFinished, WorkloadValidated
from services.queue_manager.state import Context

AT = "2026-11-29T10:00:00Z"


def config(tmp_path) -> Context:
    docs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "gpu-queue"},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                      {"name": "a100-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 32}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
         "metadata": {"name": "team-ml", "namespace": "ml-team"}, "spec": {"clusterQueue": "gpu-queue"}},
    ]
    (tmp_path / "kueue.yaml").write_text(yaml.safe_dump_all(docs))
    cfg = KueueConfig.load(tmp_path)
    return Context(objects=cfg.objects, node_labels=cfg.node_labels())


def validated(name, gpus, priority, cls, at=AT):
    return make_envelope(WorkloadValidated(
        uid=f"uid-{name}", namespace="ml-team", name=name, queue_name="team-ml", cluster_queue="gpu-queue",
        priority=priority, created_at=at, labels={"quartermaster.dev/class": cls},
        pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}]),
        producer="test", occurred_at=at)


def answer_of(preemptor, at, *victims, policy="p", grace_period_s=30, blocked_message=None):
    """The preemption service's answer for uid-<preemptor>: the named ml-team workloads of
    gpu-queue as victims (none: blocked, or nothing needed)."""
    return make_envelope(PreemptionVictimsSelected(
        preemptor_uid=f"uid-{preemptor}", cohort="gpu-queue",
        victims=[{"uid": f"uid-{v}", "namespace": "ml-team", "name": v, "cluster_queue": "gpu-queue",
                  "reason": "InClusterQueue", "policy": policy, "grace_period_s": grace_period_s} for v in victims],
        blocked_message=blocked_message), producer="preemption", occurred_at=at)


def run(ctx, events, state=None):
    return fold_all(events, ctx, state)


def test_asks_once_with_the_snapshot_then_admits_the_preemptor_in_the_same_step(tmp_path):
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated("train", 16, 0, "training"), validated("batch-a", 8, 0, "batch"),
                         validated("batch-b", 8, 0, "batch")])
    state, out = run(ctx, [validated("chat", 8, 1000, "inference", at="2026-11-29T10:01:00Z")], state)
    needed = [o for o in out if o.envelope.event_type == "preemption.needed.v1"]
    assert len(needed) == 1 and needed[0].topic == "qm.preemption" and needed[0].key == "gpu-queue"
    payload = needed[0].envelope.payload
    assert payload.preemptor["labels"] == {"quartermaster.dev/class": "inference"}
    assert {a["name"] for a in payload.snapshot["admitted"]} == {"train", "batch-a", "batch-b"}
    state, again = run(ctx, [validated("other", 1, 0, "batch", at="2026-11-29T10:01:30Z")], state)
    assert not [o for o in again if o.envelope.event_type == "preemption.needed.v1"]  # nothing changed

    answer = answer_of("chat", "2026-11-29T10:02:00Z", "batch-a", policy="inference-preempts-batch")
    state, out = run(ctx, [answer], state)
    kinds = [o.envelope.event_type for o in out if o.topic == "qm.workloads"]
    assert kinds[:3] == ["workload.evicted.v1", "workload.released.v1", "workload.requeued.v1"]
    reserved = [o.envelope.payload.name for o in out if o.envelope.event_type == "workload.quota_reserved.v1"]
    assert reserved == ["chat"]  # the freed 8 GPUs went to the preemptor, not to "other" (1 GPU)
    # the victim is back in its queue at once, as Kueue requeues a preempted workload (its
    # backoff is for pre-freeze expiries only, ADR 0063), and waits there for quota
    assert "uid-batch-a" in state["pending"] and state["pending"]["uid-batch-a"]["eligible_at"] == state["now"]
    (requeued,) = [o.envelope.payload for o in out if o.envelope.event_type == "workload.requeued.v1"]
    assert (requeued.reason, requeued.backoff_s, requeued.requeue_at) == ("Preempted", 0, "2026-11-29T10:02:00Z")


def test_the_request_lists_the_possible_victims_and_sums_the_rest(tmp_path):
    """A workload of higher priority than the preemptor, in its own ClusterQueue, can never be
    its victim: the request carries only its usage, in the ClusterQueue's sum."""
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated("train", 16, 2000, "training"), validated("eval", 4, 2000, "training"),
                         validated("batch-a", 8, 0, "batch"), validated("batch-b", 4, 1000, "batch")])
    state, out = run(ctx, [validated("chat", 8, 1000, "inference", at="2026-11-29T10:01:00Z")], state)
    (needed,) = [o.envelope.payload for o in out if o.envelope.event_type == "preemption.needed.v1"]
    assert [a["name"] for a in needed.snapshot["admitted"]] == ["batch-a", "batch-b"]  # lower or equal priority
    assert needed.snapshot["others_usage"] == {"gpu-queue": {"a100-flavor": {"nvidia.com/gpu": 20000}}}


def test_a_question_carries_the_admissions_of_its_own_drain_pass(tmp_path):
    """The drain judges a preemptor with the whole pass's admissions holding quota; a question
    sent before a later admission of the pass was added told the preemption service there was
    room that there was not (its answer: "it fits already")."""
    docs = [{"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"}}]
    for cq, ns in (("queue-a", "team-a"), ("queue-b", "team-b")):
        docs += [
            {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": cq},
             "spec": {"cohort": "shared", "namespaceSelector": {},
                      "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
                      "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                          {"name": "a100-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 16}]}]}]}},
            {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
             "metadata": {"name": "lq", "namespace": ns}, "spec": {"clusterQueue": cq}}]
    (tmp_path / "kueue.yaml").write_text(yaml.safe_dump_all(docs))
    cfg = KueueConfig.load(tmp_path)
    ctx = Context(objects=cfg.objects, node_labels=cfg.node_labels())

    def submit(name, ns, gpus, priority, at):
        return make_envelope(WorkloadValidated(
            uid=f"uid-{name}", namespace=ns, name=name, queue_name="lq", cluster_queue=f"queue-{ns[-1]}",
            priority=priority, created_at=at, labels={"quartermaster.dev/class": "batch"},
            pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}]),
            producer="test", occurred_at=at)

    state, _ = run(ctx, [submit("train-a", "team-a", 16, 0, AT), submit("fill-b", "team-b", 8, 0, AT),
                         submit("more-b", "team-b", 8, 0, AT),
                         submit("chat", "team-a", 16, 1000, AT), submit("job-b", "team-b", 8, 0, AT)])
    assert {"uid-chat", "uid-job-b"} <= set(state["pending"])
    later = "2026-11-29T10:02:00Z"  # past the answer timeout: chat asks again in the next pass
    finished = make_envelope(WorkloadFinished(uid="uid-fill-b", namespace="team-b", name="fill-b", succeeded=True,
                                              finished_at=later), producer="test", occurred_at=later)
    state, out = run(ctx, [finished], state)
    # chat could borrow only the 8 GPUs fill-b freed: it asks to preempt train-a; job-b, after it
    # in Kueue's order, is admitted into queue-b's own quota in the same pass
    assert "uid-job-b" in state["admitted"]
    (needed,) = [o.envelope.payload for o in out if o.envelope.event_type == "preemption.needed.v1"]
    assert [a["name"] for a in needed.snapshot["admitted"]] == ["train-a"]
    assert needed.snapshot["others_usage"] == {"queue-b": {"a100-flavor": {"nvidia.com/gpu": 16000}}}


def test_blocked_answer_leaves_the_preemptor_pending_with_the_policy_message(tmp_path):
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated("train", 32, 0, "training")])
    state, _ = run(ctx, [validated("chat", 8, 1000, "inference", at="2026-11-29T10:01:00Z")], state)
    message = "would need to preempt training job ml-team/train, which is not preemptible"
    answer = answer_of("chat", "2026-11-29T10:01:05Z", blocked_message=message)
    state, out = run(ctx, [answer, answer], state)
    pending = [o.envelope.payload for o in out if o.envelope.event_type == "workload.pending.v1"]
    assert [(p.reason, p.message) for p in pending] == [("PreemptionBlocked", message)]
    assert "uid-train" in state["admitted"] and "uid-chat" in state["pending"]


def test_one_question_per_cluster_queue_is_in_flight_at_a_time(tmp_path):
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated(f"batch-{i}", 8, 0, "batch") for i in range(4)])  # 32 of 32 GPUs held
    state, out = run(ctx, [validated("chat-1", 8, 1000, "inference", at="2026-11-29T10:01:00Z"),
                           validated("chat-2", 8, 1000, "inference", at="2026-11-29T10:01:01Z")], state)
    asked = [o.envelope.payload.preemptor["name"] for o in out if o.envelope.event_type == "preemption.needed.v1"]
    assert asked == ["chat-1"]  # chat-2 waits for chat-1's answer instead of asking too

    finished = make_envelope(WorkloadFinished(uid="uid-batch-3", namespace="ml-team", name="batch-3", succeeded=True,
                                              finished_at="2026-11-29T10:01:10Z"),
                             producer="test", occurred_at="2026-11-29T10:01:10Z")
    state, out = run(ctx, [finished], state)  # freed 8 GPUs: chat-1 is admitted, no new question yet
    assert [o.envelope.payload.name for o in out if o.envelope.event_type == "workload.quota_reserved.v1"] == ["chat-1"]

    state, out = run(ctx, [validated("tick-ish", 1, 0, "batch", at="2026-11-29T10:01:20Z")], state)
    assert not any(o.envelope.event_type == "preemption.needed.v1" for o in out)  # chat-2 waits its turn
    answer = answer_of("chat-1", "2026-11-29T10:01:30Z")
    state, out = run(ctx, [answer, finished], state)  # chat-1's (now moot) answer frees the queue's turn
    again = make_envelope(WorkloadFinished(uid="uid-batch-2", namespace="ml-team", name="batch-2", succeeded=False,
                                           finished_at="2026-11-29T10:01:40Z"),
                          producer="test", occurred_at="2026-11-29T10:01:40Z")
    state, out = run(ctx, [again], state)
    assert [o.envelope.payload.name for o in out if o.envelope.event_type == "workload.quota_reserved.v1"] == ["chat-2"]


def test_an_unanswered_question_is_asked_anew_after_the_timeout(tmp_path):
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated(f"batch-{i}", 8, 0, "batch") for i in range(4)])
    state, out = run(ctx, [validated("chat-1", 16, 1000, "inference", at="2026-11-29T10:01:00Z")], state)
    assert len([o for o in out if o.envelope.event_type == "preemption.needed.v1"]) == 1

    def finish(name, at):
        return make_envelope(WorkloadFinished(uid=f"uid-{name}", namespace="ml-team", name=name, succeeded=True,
                                              finished_at=at), producer="test", occurred_at=at)

    state, out = run(ctx, [finish("batch-3", "2026-11-29T10:01:30Z")], state)  # 8 free, 16 needed
    assert not [o for o in out if o.envelope.event_type == "preemption.needed.v1"]  # still waiting for the answer
    state, out = run(ctx, [finish("batch-2", "2026-11-29T10:02:30Z")], state)  # 90 s later: no answer came
    # 16 free now: chat-1 is simply admitted; the stale question is forgotten with it
    assert [o.envelope.payload.name for o in out if o.envelope.event_type == "workload.quota_reserved.v1"] == ["chat-1"]


def test_a_question_left_unanswered_past_the_timeout_does_not_block_the_queue(tmp_path):
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated(f"batch-{i}", 8, 0, "batch") for i in range(4)])
    state, _ = run(ctx, [validated("chat-1", 32, 1000, "inference", at="2026-11-29T10:01:00Z")], state)
    finished = make_envelope(WorkloadFinished(uid="uid-batch-3", namespace="ml-team", name="batch-3", succeeded=True,
                                              finished_at="2026-11-29T10:03:00Z"),
                             producer="test", occurred_at="2026-11-29T10:03:00Z")
    state, out = run(ctx, [finished], state)  # 2 minutes on, the admitted set changed: chat-1 asks again
    asked = [o.envelope.payload.preemptor["name"] for o in out if o.envelope.event_type == "preemption.needed.v1"]
    assert asked == ["chat-1"]


def test_a_victim_reserved_again_at_the_same_moment_gets_events_of_its_own(tmp_path):
    ctx = config(tmp_path)  # a requeued victim may return at once (ADR 0063)
    state, first = run(ctx, [validated("train", 16, 0, "training"), validated("batch-a", 8, 0, "batch"),
                             validated("batch-b", 8, 0, "batch"), validated("chat", 8, 1000, "inference")])
    answer = answer_of("chat", AT, "batch-a", grace_period_s=0)
    done = make_envelope(WorkloadFinished(uid="uid-batch-b", namespace="ml-team", name="batch-b", succeeded=True,
                                          finished_at=AT), producer="test", occurred_at=AT)
    state, later = run(ctx, [answer, done], state)
    reserved_a = [o.envelope.event_id for o in first + later
                  if o.envelope.event_type in ("workload.quota_reserved.v1", "action.admit.v1")
                  and getattr(o.envelope.payload, "name", None) in ("batch-a",)
                  or getattr(o.envelope.payload, "workload_uid", None) == "uid-batch-a"]
    assert "uid-batch-a" in state["admitted"]  # evicted and reserved again, all at 10:00:00
    assert len(reserved_a) == 4 and len(set(reserved_a)) == 4  # two reservations, two admits: four ids


def test_victims_of_an_answer_that_came_too_late_still_give_their_quota_back(tmp_path):
    """The preemption service told the cluster to evict them already: kept as admitted, they
    would hold quota the cluster no longer uses, and nothing would admit them again."""
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated(f"batch-{i}", 8, 0, "batch") for i in range(4)])
    state, _ = run(ctx, [validated("chat", 8, 1000, "inference", at="2026-11-29T10:01:00Z")], state)
    done = make_envelope(WorkloadFinished(uid="uid-batch-3", namespace="ml-team", name="batch-3", succeeded=True,
                                          finished_at="2026-11-29T10:01:05Z"),
                         producer="test", occurred_at="2026-11-29T10:01:05Z")
    state, _ = run(ctx, [done], state)
    assert "uid-chat" in state["admitted"]  # admitted before the answer came
    answer = answer_of("chat", "2026-11-29T10:01:10Z", "batch-0")
    state, out = run(ctx, [answer], state)
    kinds = [o.envelope.event_type for o in out if o.topic == "qm.workloads"]
    assert kinds[:3] == ["workload.evicted.v1", "workload.released.v1", "workload.requeued.v1"]
    assert [o.envelope.payload.preemptor for o in out if o.envelope.event_type == "workload.evicted.v1"] == [
        "ml-team/chat"]
    # requeued at once (ADR 0063), and the 8 GPUs it gave back are free: a new reservation, made
    # after the release, so the cluster evicts the old run and then admits the new one
    assert "workload.quota_reserved.v1" in kinds[3:]
    assert state["admitted"]["uid-batch-0"]["reserved_at"] == state["now"]
    assert state["admitted"]["uid-batch-0"]["workload"]["attempts"] == 1


def test_a_workload_behind_a_preempting_head_keeps_its_last_pending_message(tmp_path):
    """Kueue leaves the status of a workload it did not nominate alone: queued behind a head that
    is preempting, a workload that already said why it waits says nothing new (it used to say
    "Queued in ClusterQueue", then its shortfall again, pass after pass)."""
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated("low", 24, 0, "batch"), validated("other", 8, 0, "batch"),
                         validated("waiter", 16, 0, "batch")])
    assert set(state["admitted"]) == {"uid-low", "uid-other"}
    assert state["said"]["uid-waiter"].startswith("WaitingForQuota|")
    state, out = run(ctx, [validated("high", 16, 100, "inference", at="2026-11-29T10:01:00Z")], state)
    assert "preemption.needed.v1" in [o.envelope.event_type for o in out]  # the head now preempts
    other_done = make_envelope(WorkloadFinished(uid="uid-other", namespace="ml-team", name="other", succeeded=True,
                                                finished_at="2026-11-29T10:01:30Z"),
                               producer="test", occurred_at="2026-11-29T10:01:30Z")
    state, out = run(ctx, [other_done], state)  # frees quota: the whole queue is drained again
    assert "uid-waiter" in state["pending"] and "uid-high" in state["pending"]
    assert [o for o in out if o.envelope.event_type == "workload.pending.v1"
            and o.envelope.payload.name == "waiter"] == []
    assert state["said"]["uid-waiter"].startswith("WaitingForQuota|")


def test_a_question_is_identified_by_the_admitted_sets_revision_not_its_members(tmp_path):
    """ADR 0020 addendum: the same admitted members at a later revision (a set that came back
    to an earlier membership) ask anew under a new id; the preemption service would skip a
    repeated id as a duplicate and never answer. A replay (same revision) keeps the id."""
    ctx = config(tmp_path)
    state, outputs = run(ctx, [validated("train", 16, 0, "training"), validated("batch-a", 8, 0, "batch"),
                               validated("batch-b", 8, 0, "batch"), validated("chat", 8, 1000, "inference")])
    (first,) = [o.envelope for o in outputs if o.envelope.event_type == "preemption.needed.v1"]
    replayed, _ = run(ctx, [validated("train", 16, 0, "training"), validated("batch-a", 8, 0, "batch"),
                            validated("batch-b", 8, 0, "batch")])
    _, again = run(ctx, [validated("chat", 8, 1000, "inference")], replayed)
    assert [o.envelope.event_id for o in again if o.envelope.event_type == "preemption.needed.v1"] == [first.event_id]

    # the same members two changes later (one admitted and released meanwhile), and a drain
    later = {**state, "rev": state["rev"] + 2, "said": {}, "asking": {}, "draining": True, "due": state["now"]}
    drain_due = make_envelope(DrainDue(cohort="gpu-queue", since=AT), producer="queue-manager", occurred_at=AT)
    _, asked = run(ctx, [drain_due], later)
    (second,) = [o.envelope for o in asked if o.envelope.event_type == "preemption.needed.v1"]
    assert second.payload.preemptor["uid"] == "uid-chat"
    assert {a["uid"] for a in second.payload.snapshot["admitted"]} == {a["uid"] for a in first.payload.snapshot["admitted"]}
    assert second.event_id != first.event_id


def chat_waiting_for_its_victims(tmp_path):
    """gpu-queue full (train 16, batch-a 8, batch-b 8 GPUs); chat (16, priority 1000) asked for
    victims; then batch-a finished: 8 GPUs free, chat still needs 16. (ctx, state)"""
    ctx = config(tmp_path)
    state, _ = run(ctx, [validated("train", 16, 0, "training"), validated("batch-a", 8, 0, "batch"),
                         validated("batch-b", 8, 0, "batch")])
    state, out = run(ctx, [validated("chat", 16, 1000, "inference", at="2026-11-29T10:01:00Z")], state)
    assert [o for o in out if o.envelope.event_type == "preemption.needed.v1"]
    finished = make_envelope(WorkloadFinished(uid="uid-batch-a", namespace="ml-team", name="batch-a",
                                              finished_at="2026-11-29T10:01:10Z", succeeded=True),
                             producer="watcher", occurred_at="2026-11-29T10:01:10Z")
    state, out = run(ctx, [finished], state)
    assert not [o for o in out if o.envelope.event_type == "workload.quota_reserved.v1"]
    return ctx, state


def test_an_arrival_cannot_take_the_quota_a_waiting_preemptor_holds(tmp_path):
    """Kueue nominates the preemptor first in every cycle and holds its quota there, so a
    newcomer of lower priority cannot take what frees up while the victims go. Judged alone,
    every small arrival took it, and the preemptor asked again and again."""
    ctx, state = chat_waiting_for_its_victims(tmp_path)
    state, out = run(ctx, [validated("late", 4, 0, "batch", at="2026-11-29T10:01:20Z")], state)
    assert not [o for o in out if o.envelope.event_type == "workload.quota_reserved.v1"]
    assert "uid-late" in state["pending"] and state["preemptors"] == {"uid-chat": True}

    state, out = run(ctx, [answer_of("chat", "2026-11-29T10:01:30Z", "batch-b")], state)
    reserved = [o.envelope.payload.name for o in out if o.envelope.event_type == "workload.quota_reserved.v1"]
    assert reserved == ["chat"] and not state["preemptors"]


def test_a_waiting_preemptor_stays_its_queues_head_when_a_higher_priority_arrives(tmp_path):
    """Kueue's sticky workload (ADR 0078): while its victims go, the preemptor stays the head of
    its BestEffortFIFO queue, ahead of a newcomer of higher priority. Before, the newcomer became
    the head and took 4 of the 8 GPUs the finish had freed; the preemptor, left "Queued" behind
    it, lost its standing, and its 16 GPUs could no longer be found without another eviction."""
    ctx, state = chat_waiting_for_its_victims(tmp_path)
    state, out = run(ctx, [validated("urgent", 4, 2000, "inference", at="2026-11-29T10:01:20Z")], state)
    assert not [o for o in out if o.envelope.event_type == "workload.quota_reserved.v1"]
    assert "uid-urgent" in state["pending"] and state["preemptors"] == {"uid-chat": True}

    state, out = run(ctx, [answer_of("chat", "2026-11-29T10:01:30Z", "batch-b")], state)
    reserved = [o.envelope.payload.name for o in out if o.envelope.event_type == "workload.quota_reserved.v1"]
    assert reserved == ["chat"]
    # then the newcomer is its queue's head: 4 GPUs, none free, lower priorities to preempt
    assert state["preemptors"] == {"uid-urgent": True}
