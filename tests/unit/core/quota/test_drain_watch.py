"""drain(..., watch=keys) reports the cycle that first decided each watched workload and the last
cycle that took quota: what the queue-manager reads to know whether a drain handed only the first
few of a deep run got past them while it still admitted (ADR 0077)."""

from __future__ import annotations

from quota_builders import T0, make_cq, make_flavor, make_lq, make_wl

from services.core.quota import build_snapshot, drain, load_objects
from services.core.quota.model import WorkloadStatus


def _objects(waiting: int, nominal: int):
    docs = [make_flavor("f1"), make_cq("cq").gpu("f1", nominal).obj(), make_lq("lq", "cq")]
    docs += [make_wl(f"w{i}").queue("lq").created(i).gpu(1).obj() for i in range(waiting)]
    return load_objects(("test", d) for d in docs)


def test_a_drain_reports_when_it_decided_each_watched_workload():
    objects = _objects(waiting=8, nominal=5)
    result = drain(build_snapshot(objects), objects.workloads, T0 + 100,
                   watch={"default/w2", "default/w5", "default/w7"})
    by_key = result.by_workload()
    assert [by_key[f"default/w{i}"].status for i in range(8)] == [WorkloadStatus.ADMITTED] * 5 + [WorkloadStatus.PENDING] * 3
    # one head a cycle: w2 is admitted in cycle 3, the last admission is w4's in cycle 5, w5 is set
    # aside in cycle 6 and w7, skipped alike after it, as of that cycle
    assert result.watched_at == {"default/w2": 3, "default/w5": 6, "default/w7": 6}
    assert result.last_taking_cycle == 5


def test_nothing_watched_nothing_reported():
    objects = _objects(waiting=3, nominal=1)
    result = drain(build_snapshot(objects), objects.workloads, T0 + 100)
    assert result.watched_at == {}
    assert result.last_taking_cycle == 1
