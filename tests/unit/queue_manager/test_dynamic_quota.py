"""Dynamic quota in the fold: the field report's "borrow up to 32 GPUs while the cluster is
below 40% utilization" (examples/dynamic-quota), decided from cluster.signals.v1 events."""

from __future__ import annotations

from pathlib import Path

from fold_steps import fold_all

from services.adapters.kueue_config import KueueConfig
from services.contracts.codec import encode, make_envelope
from services.contracts.events import ClusterSignals, WorkloadValidated
from services.core.quota.dynamic import cluster_signals
from services.policy.loader import read_documents
from services.policy.quota_rules import load_quota_rules
from services.queue_manager.state import Context

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "dynamic-quota"
CONFIG = KueueConfig.load(EXAMPLE)
RULES = load_quota_rules(read_documents(EXAMPLE)[0], CONFIG.objects)
CTX = Context(objects=CONFIG.objects, quota_rules=RULES, cache_key="cohort:ai-platform")
NODES = {f"a100-{i}": {"flavor": "a100-flavor", "gpu": 8000} for i in range(8)}  # 64 GPUs


def validated(name: str, gpus: int, team: str = "team-a", at: str = "2026-11-29T10:00:00Z"):
    payload = WorkloadValidated(
        uid=f"uid-{name}", namespace=team, name=name, queue_name=team, cluster_queue=team, cohort="ai-platform",
        priority=0, created_at=at, pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": gpus * 1000}}],
    )
    return make_envelope(payload, producer="test", occurred_at=at)


def signals(in_use_gpus: int, at: str):
    usage = [{"reserved": {}, "running": {"a100-flavor": {"nvidia.com/gpu": in_use_gpus * 1000}}}]
    payload = ClusterSignals(at=at, signals=cluster_signals(NODES, usage, CONFIG.objects))
    return make_envelope(payload, producer="test", occurred_at=at)


def run(events, state=None, ctx=CTX):
    state, outputs = fold_all(events, ctx, state)
    for output in outputs:
        encode(output.envelope)  # what the service would send: every output meets its schema
    return state, outputs


def of_type(outputs, event_type):
    return [o.envelope.payload for o in outputs if o.envelope.event_type == event_type]


def test_a_quiet_cluster_lets_team_a_borrow_and_what_waited_is_admitted_in_the_same_event():
    state, outputs = run([validated("train-24", 24)])
    pending = of_type(outputs, "workload.pending.v1")
    assert len(pending) == 1 and "maximum capacity (16)" in pending[0].message  # 16 nominal, borrowingLimit 0

    state, outputs = run([signals(in_use_gpus=12, at="2026-11-29T10:01:00Z")], state)  # 12 of 64: 19%
    changed = of_type(outputs, "quota.limits_changed.v1")
    assert [(c.cluster_queue, c.previous_borrowing_limit, c.effective_borrowing_limit) for c in changed] == [
        ("team-a", 0, 16000)]
    assert changed[0].rule == "QuotaRule/team-a-burst-when-idle rules[0]: cluster.gpuUtilization < 0.4"
    assert "team-a may borrow up to 16 nvidia.com/gpu of a100-flavor (was 0)" in changed[0].message
    assert "utilization 19%" in changed[0].message
    reserved = of_type(outputs, "workload.quota_reserved.v1")
    assert [(r.name, r.borrowing) for r in reserved] == [("train-24", True)]
    usage = of_type(outputs, "usage.snapshot.v1")[-1]
    assert usage.effective_borrowing_limits == {"team-a": {"a100-flavor": {"nvidia.com/gpu": 16000}}}


def test_the_limit_never_passes_what_the_rule_allows():
    state, _ = run([signals(in_use_gpus=0, at="2026-11-29T10:00:00Z")])
    state, outputs = run([validated("train-33", 33)], state)  # 16 nominal + 16 borrowable < 33
    assert of_type(outputs, "workload.quota_reserved.v1") == []
    assert "maximum capacity (32)" in of_type(outputs, "workload.pending.v1")[0].message


def test_a_busy_cluster_gives_the_configured_limit_back_without_evicting_anyone():
    state, _ = run([signals(in_use_gpus=0, at="2026-11-29T10:00:00Z"), validated("train-24", 24)])
    assert "uid-train-24" in state["admitted"]

    state, outputs = run([signals(in_use_gpus=40, at="2026-11-29T10:05:00Z")], state)  # 40 of 64 GPUs held: 62%
    changed = of_type(outputs, "quota.limits_changed.v1")
    assert [(c.previous_borrowing_limit, c.effective_borrowing_limit, c.rule) for c in changed] == [(16000, 0, None)]
    assert "no rule is true, the configured borrowingLimit applies" in changed[0].message
    assert of_type(outputs, "workload.evicted.v1") == [] and "uid-train-24" in state["admitted"]
    assert "limits" not in state  # back to the configuration as written

    state, outputs = run([validated("small-1", 1, at="2026-11-29T10:06:00Z")], state)
    assert of_type(outputs, "workload.quota_reserved.v1") == []  # team-a already borrows 8: nothing more


def test_the_same_signals_again_say_nothing():
    state, first = run([signals(in_use_gpus=12, at="2026-11-29T10:01:00Z")])
    state, again = run([signals(in_use_gpus=13, at="2026-11-29T10:02:00Z")], state)
    assert len(of_type(first, "quota.limits_changed.v1")) == 1
    assert again == []


def test_a_rule_that_cannot_be_evaluated_counts_as_false_and_says_why():
    broken = read_documents(EXAMPLE)[0]
    for doc in broken:
        if doc.body.get("kind") == "QuotaRule":
            doc.body["spec"]["rules"] = [
                {"when": 'cluster.byFlavor["h100-flavor"].utilization < 0.5', "borrowingLimit": 32},
                {"when": "cluster.gpuUtilization < 0.4", "borrowingLimit": 8},
            ]
    ctx = Context(objects=CONFIG.objects, quota_rules=load_quota_rules(broken, CONFIG.objects),
                  cache_key="cohort:ai-platform")
    _, outputs = run([signals(in_use_gpus=0, at="2026-11-29T10:00:00Z")], ctx=ctx)
    changed = of_type(outputs, "quota.limits_changed.v1")[0]
    assert changed.effective_borrowing_limit == 8000 and changed.rule.endswith("rules[1]: cluster.gpuUtilization < 0.4")
    assert len(changed.errors) == 1 and "rules[0]" in changed.errors[0] and "h100-flavor" in changed.errors[0]


def test_rules_of_other_cohorts_are_not_evaluated_here():
    ctx = Context(objects=CONFIG.objects, quota_rules=RULES, cache_key="cohort:elsewhere")
    _, outputs = run([signals(in_use_gpus=0, at="2026-11-29T10:00:00Z")], ctx=ctx)
    assert outputs == []


def test_qm_explain_tells_on_call_that_a_rule_took_the_borrowing_limit_back():
    from services.explain import Verdict, explain

    inputs = [signals(in_use_gpus=0, at="2026-11-29T10:00:00Z"), validated("train-24", 24),
              signals(in_use_gpus=40, at="2026-11-29T10:05:00Z"),
              validated("train-20", 20, at="2026-11-29T10:06:00Z")]
    _, outputs = run(inputs)
    answer = explain("team-a/train-20", [*inputs, *(o.envelope for o in outputs)])
    assert answer.verdict == Verdict.WAITING_FOR_QUOTA
    assert "maximum capacity (16)" in answer.answer
    assert "Dynamic quota (since 2026-11-29T10:05:00Z): team-a may borrow up to 0 nvidia.com/gpu" in answer.answer
    assert "no rule is true, the configured borrowingLimit applies (cluster GPU utilization 62%)" in answer.answer
    changes = [step.detail for step in answer.timeline if step.what == "borrowing limit changed"]
    assert len(changes) == 2 and "(was 0)" in changes[0] and "(was 16)" in changes[1]
