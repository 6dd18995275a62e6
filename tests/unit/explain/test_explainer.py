"""The explainer over hand-built trails, one case per row of the field report's troubleshooting
table (plus the lifecycle states around them). Pending reasons and messages are the quota
core's own (services/core/quota/scheduler.py resolve_cluster_queue, snapshot.py, flavors.py)."""

from __future__ import annotations

import pytest

from services.contracts.codec import make_envelope
from services.contracts.events import (
    ActionAdmit,
    ActionEvict,
    LedgerRow,
    PodRunning,
    PreemptionVictimsSelected,
    WorkloadEvicted,
    WorkloadFinished,
    WorkloadPending,
    WorkloadPrefreezeExpired,
    WorkloadQuotaReserved,
    WorkloadRejected,
    WorkloadReleased,
    WorkloadRequeued,
    WorkloadRunning,
    WorkloadSubmitted,
    WorkloadValidated,
)
from services.core.quota import Reason
from services.explain import Verdict, explain, quota_holders

NS, NAME, UID = "ml-team", "llm-ft", "uid-llm-ft"
KEY = f"{NS}/{NAME}"
GPU = "nvidia.com/gpu"
_n = iter(range(10_000))


def at(second: int) -> str:
    return f"2026-11-29T10:{second // 60:02d}:{second % 60:02d}Z"


def env(payload, second: int, producer: str = "test"):
    return make_envelope(payload, producer=producer, occurred_at=at(second), identity=(next(_n),))


def submitted(queue: str | None = "team-ml", *, uid=UID, name=NAME, ns=NS, gpus=16):
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return env(WorkloadSubmitted(uid=uid, namespace=ns, name=name, kind="Job", queue_name=queue, labels=labels,
                                 pod_sets=[{"name": "main", "count": 1, "requests": {GPU: gpus * 1000}}],
                                 created_at=at(0)), 0, "watcher")


def validated(*, uid=UID, name=NAME, ns=NS, cq="gpu-queue", second=1):
    return env(WorkloadValidated(uid=uid, namespace=ns, name=name, queue_name="team-ml", cluster_queue=cq,
                                 cohort="ai", priority=0, created_at=at(0),
                                 pod_sets=[{"name": "main", "count": 1, "requests": {GPU: 16000}}]), second,
               "admission")


def pending(reason: str, message: str, cq: str | None = "gpu-queue", second=2):
    return env(WorkloadPending(uid=UID, namespace=NS, name=NAME, reason=reason, message=message, cluster_queue=cq),
               second, "queue-manager")


def reserved(*, uid=UID, name=NAME, ns=NS, gpus=16, second=3, cq="gpu-queue", borrowing=False):
    usage = {"a100-flavor": {GPU: gpus * 1000}}
    return env(WorkloadQuotaReserved(uid=uid, namespace=ns, name=name, cluster_queue=cq, cohort="ai",
                                     flavors={"main": {GPU: "a100-flavor"}}, counts={"main": 1}, usage=usage,
                                     reserved_at=at(second), borrowing=borrowing), second, "queue-manager")


def expired():
    """The 16-GPU reservation made at 3 s expires at 303 s, its pods never ready."""
    return env(WorkloadPrefreezeExpired(uid=UID, namespace=NS, name=NAME, cluster_queue="gpu-queue", reserved_at=at(3),
                                        expired_at=at(303), idle_s=300.0, usage={"a100-flavor": {GPU: 16000}},
                                        expiries=1), 303, "queue-manager")


def requeued(**fields):
    """The expired workload requeued at 303 s, to try again at 363 s."""
    return env(WorkloadRequeued(uid=UID, namespace=NS, name=NAME, reason="PodsReadyTimeout", requeue_at=at(363),
                                attempt=1, backoff_s=60, cluster_queue="gpu-queue", **fields), 303, "queue-manager")


def running(*, uid=UID, name=NAME, ns=NS, second=5):
    return env(PodRunning(uid=f"pod-{uid}", workload_uid=uid, namespace=ns, name=f"{name}-0", started_at=at(second),
                          node="node-1", workload_name=name, queue_name="team-ml"), second, "watcher")


def other_holders():
    """Two workloads hold 24 GPUs of gpu-queue: one running, one reserved and never running."""
    return [
        submitted(uid="u-a", name="big-train", gpus=16), validated(uid="u-a", name="big-train", second=0),
        reserved(uid="u-a", name="big-train", second=0), running(uid="u-a", name="big-train", second=1),
        submitted(uid="u-z", name="zombie", gpus=8), validated(uid="u-z", name="zombie", second=0),
        reserved(uid="u-z", name="zombie", gpus=8, second=0),
        submitted(uid="u-d", name="done", gpus=4), reserved(uid="u-d", name="done", gpus=4, second=0),
        env(WorkloadReleased(uid="u-d", namespace=NS, name="done", cluster_queue="gpu-queue", reason="Finished",
                             usage={"a100-flavor": {GPU: 4000}}, released_at=at(1)), 1),
    ]


CASES = [
    ("nothing", [], Verdict.NOT_FOUND, "No event"),
    ("no queue-name label", [submitted(queue=None)], Verdict.NOT_IN_LOCAL_QUEUE, "not in any LocalQueue"),
    ("LocalQueue missing (core wording)",
     [submitted(queue="team-x"), pending(str(Reason.INADMISSIBLE), "LocalQueue team-x doesn't exist", cq=None)],
     Verdict.NOT_IN_LOCAL_QUEUE, "LocalQueue team-x doesn't exist"),
    ("LocalQueue missing (admission wording)",
     [submitted(queue="team-x"), pending("Inadmissible", "LocalQueue team-x doesn't exist in namespace ml-team: "
                                          "create it or fix the kueue.x-k8s.io/queue-name label", cq=None)],
     Verdict.NOT_IN_LOCAL_QUEUE, "create it or fix"),
    ("ClusterQueue stopped",
     [submitted(), validated(), pending(str(Reason.INADMISSIBLE), "ClusterQueue gpu-queue is inactive")],
     Verdict.CLUSTER_QUEUE_STOPPED, "stopPolicy"),
    ("rejected by policy",
     [submitted(), env(WorkloadRejected(uid=UID, namespace=NS, name=NAME, message="namespace ml-team used 28 GPU, "
                                        "requesting 8, max is 32",
                                        violations=[{"policy": "namespace-gpu-max", "enforcement_action": "deny",
                                                     "message": "namespace ml-team used 28 GPU, requesting 8, max is 32"}]),
                       1, "admission")],
     Verdict.REJECTED, "policy namespace-gpu-max: namespace ml-team used 28 GPU, requesting 8, max is 32"),
    ("awaiting admission", [submitted()], Verdict.AWAITING_ADMISSION, "admission has not judged"),
    ("queued", [submitted(), validated()], Verdict.QUEUED, "not published a decision"),
    ("waiting for quota",
     [*other_holders(), submitted(), validated(),
      pending(str(Reason.WAITING_FOR_QUOTA), "couldn't assign flavors to pod set main: insufficient unused quota for "
              "nvidia.com/gpu in flavor a100-flavor, 8 more needed")],
     Verdict.WAITING_FOR_QUOTA, "ml-team/big-train 16 GPU"),
    ("no flavor matches node affinity",
     [submitted(), validated(), pending(str(Reason.NO_MATCHING_FLAVOR), "couldn't assign flavors to pod set main: "
                                        "flavor a100-flavor doesn't match node affinity")],
     Verdict.NO_MATCHING_FLAVOR, "doesn't match node affinity"),
    # the field report's gpu-queue covers nvidia.com/gpu alone: a Job asking for cpu too finds no flavor
    ("a resource the ClusterQueue does not cover",
     [submitted(), validated(), pending(str(Reason.NO_MATCHING_FLAVOR), "couldn't assign flavors to pod set main: "
                                        "resource cpu unavailable in ClusterQueue")],
     Verdict.NO_MATCHING_FLAVOR, "It requests cpu, which no resourceGroup of ClusterQueue gpu-queue covers"),
    ("quota reserved but no node fits",
     [submitted(), validated(), reserved(),
      env(ActionAdmit(workload_uid=UID, namespace=NS, name=NAME, kind="Job",
                      node_selector={"gpu.nvidia.com/class": "a100"}), 3, "queue-manager")],
     Verdict.RESERVED_NOT_RUNNING, "gpu.nvidia.com/class=a100"),
    ("pre-freeze expired",
     [submitted(), validated(), reserved(), expired(), requeued()],
     Verdict.PREFREEZE_EXPIRED, "16 GPU sat idle 300 s"),
    ("pre-freeze expired, requeued by its eviction time",
     [submitted(), validated(), reserved(), expired(), requeued(queue_order_at=at(303))],
     Verdict.PREFREEZE_EXPIRED, "requeued behind the workloads queued before 2026-11-29T10:05:03Z (Kueue's "
                                "requeuing by eviction time); next try at 2026-11-29T10:06:03Z"),
    # the queue-manager stops the Job of an expired reservation: that Evict is no preemption
    ("pre-freeze expired, its Job stopped",
     [submitted(), validated(), reserved(), expired(),
      env(ActionEvict(workload_uid=UID, namespace=NS, name=NAME, kind="Job", reason=ActionEvict.PODS_READY_TIMEOUT,
                      grace_period_s=0), 303, "queue-manager"),
      requeued()],
     Verdict.PREFREEZE_EXPIRED, "Its Job was stopped, so pods that start late do not run on released quota"),
    # a Job unsuspended by hand while it waited: the queue-manager stopped it; it still waits
    ("stopped for running unadmitted",
     [*other_holders(), submitted(), validated(),
      pending(str(Reason.WAITING_FOR_QUOTA), "couldn't assign flavors to pod set main: insufficient unused quota for "
              "nvidia.com/gpu in flavor a100-flavor, 8 more needed"),
      env(ActionEvict(workload_uid=UID, namespace=NS, name=NAME, kind="Job", reason=ActionEvict.NOT_ADMITTED,
                      grace_period_s=0), 5, "queue-manager")],
     Verdict.WAITING_FOR_QUOTA, "was stopped (NotAdmitted): it runs once admitted"),
    # a Job that runs although nothing will admit it is stopped, and stays stopped (ADR 0065)
    ("rejected, its Job stopped for running",
     [submitted(), env(WorkloadRejected(uid=UID, namespace=NS, name=NAME, message="missing label",
                                        violations=[{"policy": "require-cost-center-and-queue",
                                                     "enforcement_action": "deny", "message": "missing label"}]),
                       1, "admission"),
      env(ActionEvict(workload_uid=UID, namespace=NS, name=NAME, kind="Job", reason=ActionEvict.NOT_ADMITTED,
                      grace_period_s=0), 5, "queue-manager")],
     Verdict.REJECTED, "was stopped (NotAdmitted): it stays stopped"),
    ("in no LocalQueue, its Job stopped for running",
     [submitted(queue="team-x"), pending("Inadmissible", "LocalQueue team-x doesn't exist in namespace ml-team: "
                                          "create it or fix the kueue.x-k8s.io/queue-name label", cq=None),
      env(ActionEvict(workload_uid=UID, namespace=NS, name=NAME, kind="Job", reason=ActionEvict.NOT_ADMITTED,
                      grace_period_s=0), 5, "admission")],
     Verdict.NOT_IN_LOCAL_QUEUE, "it stays stopped, since nothing admits it as it is"),
    ("preempted",
     [submitted(), validated(), reserved(), running(),
      submitted(uid="u-inf", name="chat-inference", gpus=8),
      env(PreemptionVictimsSelected(preemptor_uid="u-inf", cohort="ai", victims=[
          {"uid": UID, "namespace": NS, "name": NAME, "cluster_queue": "gpu-queue", "reason": "InClusterQueue",
           "policy": "inference-preempts-batch", "grace_period_s": 120}]), 10, "preemption"),
      env(WorkloadEvicted(uid=UID, namespace=NS, name=NAME, reason="InClusterQueue", evicted_at=at(10),
                          cluster_queue="gpu-queue", preemptor="u-inf", grace_period_s=120), 10, "preemption")],
     Verdict.PREEMPTED, "preempted by ml-team/chat-inference (InClusterQueue) with 120 s to checkpoint"),
    ("running", [submitted(), validated(), reserved(), running()], Verdict.RUNNING, "is running on a100-flavor"),
    ("finished and billed",
     [submitted(), validated(), reserved(), running(),
      env(WorkloadFinished(uid=UID, namespace=NS, name=NAME, succeeded=True, finished_at=at(900)), 900, "watcher")],
     Verdict.FINISHED, "succeeded"),
    # deleted the second it was created: the deletion reached the queue-manager before the
    # verdict (which carries the submission's time), so nothing was ever queued
    ("deleted before its verdict",
     [submitted(), env(WorkloadFinished(uid=UID, namespace=NS, name=NAME, succeeded=False, finished_at=at(0)), 0,
                       "watcher"), validated(second=0)],
     Verdict.FINISHED, "failed or was deleted"),
]


@pytest.mark.parametrize(("trail", "verdict", "phrase"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_troubleshooting_table(trail, verdict, phrase):
    result = explain(KEY, list(reversed(trail)))  # input order does not matter: event time does
    assert result.verdict == verdict, result.answer
    assert phrase in result.answer
    assert result.next_steps or verdict in (Verdict.RUNNING, Verdict.FINISHED)
    assert [s.at for s in result.timeline] == sorted(s.at for s in result.timeline)
    result.to_dict()


def test_the_running_step_says_what_it_means():
    """workload.running.v1 is derived from each running pod (the first counts), so its line must
    not claim that all pods run."""
    started = env(WorkloadRunning(uid=UID, namespace=NS, name=NAME, started_at=at(5)), 5, "admission")
    result = explain(KEY, [submitted(), validated(), reserved(), running(), started])
    assert [(s.what, s.detail) for s in result.timeline if s.event_type == "workload.running.v1"] == [
        ("running", "its first pod runs")]


def test_waiting_for_quota_names_holders_and_flags_idle_reservations():
    trail = [*other_holders(), submitted(), validated(),
             pending(str(Reason.WAITING_FOR_QUOTA), "insufficient unused quota for nvidia.com/gpu in flavor "
                     "a100-flavor, 8 more needed")]
    result = explain(KEY, trail)
    assert [(h.workload, h.gpu_milli, h.running) for h in result.holders] == [
        ("ml-team/big-train", 16000, True), ("ml-team/zombie", 8000, False)]
    assert "ml-team/zombie" in result.next_steps[0] and "TTL" in result.next_steps[0]
    assert "reserved, NOT running" in result.answer


def test_holders_include_cohort_borrowers_after_own_queue():
    trail = [reserved(uid="u-1", name="mine", gpus=4), reserved(uid="u-2", name="theirs", gpus=12, cq="other-queue")]
    holders = quota_holders(trail, cluster_queue="gpu-queue")
    assert [(h.workload, h.same_cluster_queue) for h in holders] == [("ml-team/mine", True), ("ml-team/theirs", False)]


def test_a_holder_in_another_queue_is_called_a_borrower_only_when_it_borrowed():
    trail = [*other_holders(), submitted(), validated(),
             pending("Pending", "insufficient unused quota for nvidia.com/gpu in flavor a100-flavor, 8 more needed"),
             reserved(uid="u-2", name="own-quota", gpus=8, cq="other-queue", second=4),
             reserved(uid="u-3", name="borrower", gpus=8, cq="other-queue", second=5, borrowing=True)]
    answer = explain(f"{NS}/{NAME}", trail).answer
    assert "ml-team/own-quota 8 GPU on a100-flavor since 2026-11-29T10:00:04Z, reserved, NOT running (in other-queue)" \
        in answer
    assert "(in other-queue, borrowing from the cohort)" in answer


def test_billing_rows_are_summed_once_per_row():
    row = LedgerRow(row_id="r1", BilledCost="2.5", EffectiveCost="2.5", ListCost="3", ContractedCost="2.5",
                    BillingCurrency="USD", ChargePeriodStart=at(0), ChargePeriodEnd=at(3599),
                    ChargeCategory="Usage", ChargeDescription="x", PricingQuantity="1.25", PricingUnit="GPU-Hours",
                    ConsumedQuantity="1.25", ConsumedUnit="GPU-Hours", ResourceId=UID, SubAccountId=NS, SkuId="a100",
                    ServiceCategory="AI and Machine Learning", Tags={}, x_CostCenter="cc-ml", x_UsageKind="running",
                    x_GpuHours="1.25")
    billed = env(row, 900, "cost-accounting")
    trail = [submitted(), validated(), reserved(), running(), billed, billed,
             env(WorkloadFinished(uid=UID, namespace=NS, name=NAME, succeeded=True, finished_at=at(900)), 900)]
    result = explain(KEY, trail)
    assert result.billed["gpu_hours"] == 1.25 and result.billed["cost"] == 2.5
    assert "1.25 GPU-hours" in result.answer
    assert sum(s.what == "billed" for s in result.timeline) == 1


def test_key_must_name_namespace_and_workload():
    with pytest.raises(ValueError):
        explain("llm-ft", [])


def test_a_workload_kept_off_a_flavor_by_its_policies_is_told_so():
    """ADR 0070: the validated step names the refused flavors, and the wait says what to do."""
    kept_off = env(WorkloadValidated(
        uid=UID, namespace=NS, name=NAME, queue_name="team-ml", cluster_queue="gpu-queue", cohort="ai", priority=0,
        created_at=at(0), pod_sets=[{"name": "main", "count": 1, "requests": {GPU: 16000},
                                     "refused_flavors": {"a100-flavor": "[a100-approved-projects] not approved"}}]),
        1, "admission")
    waiting = pending(str(Reason.WAITING_FOR_QUOTA), "couldn't assign flavors to pod set main: flavor a100-flavor refused by policy: "
                      "[a100-approved-projects] not approved, insufficient unused quota for nvidia.com/gpu in "
                      "flavor h100-flavor, 8 more needed")
    result = explain(KEY, [submitted(), kept_off, waiting])
    assert [s.detail for s in result.timeline if s.event_type == "workload.validated.v1"] == [
        "admission allowed it into ClusterQueue gpu-queue (LocalQueue team-ml); kept off flavor(s) a100-flavor "
        "by its policies (ADR 0070)"]
    assert any(step.startswith("its policies keep it off flavor(s) a100-flavor") for step in result.next_steps)


def test_a_workload_no_flavor_tolerates_is_told_which_taint_to_tolerate():
    """ADR 0072: the flavor's taint is named, and what to do about it."""
    waiting = pending(str(Reason.NO_MATCHING_FLAVOR), "couldn't assign flavors to pod set main: untolerated taint "
                      "reserved=research:NoSchedule in flavor reserved-flavor")
    result = explain(KEY, [submitted(), validated(), waiting])
    assert result.verdict == Verdict.NO_MATCHING_FLAVOR, result.answer
    assert ("or tolerate flavor reserved-flavor's taint reserved=research:NoSchedule in the Job's pod template "
            "(its nodes are kept for workloads that do)") in result.next_steps
