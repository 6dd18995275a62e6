"""A real faust worker built on ServiceRuntime, for the crash and dead-letter tests.

It folds quota reservations and releases (on qm.workloads, keyed by namespace in these
tests) into a changelog-backed table of reserved GPU per namespace, the way the
queue-manager keeps its usage tables, and publishes each namespace's new total on qm.usage.

    QM_TOPIC_PREFIX=t123. QM_APP_ID_SUFFIX=-t123 python -m tests.integration.workers.usage_worker worker
"""

from __future__ import annotations

import os

from services.adapters.runtime import Output, ServiceRuntime
from services.adapters.settings import Settings
from services.contracts.codec import Envelope, make_envelope
from services.contracts.events import UsageSnapshot, WorkloadQuotaReserved, WorkloadReleased

runtime = ServiceRuntime(Settings.from_env("usage-test-worker"))
usage = runtime.table("namespace_gpu_usage", partitions=4, help="reserved GPU milli per namespace")


def gpu_milli(by_flavor: dict) -> int:
    return sum(resources.get("nvidia.com/gpu", 0) for resources in by_flavor.values())


def fold(state: dict | None, envelope: Envelope) -> tuple[dict, list[Output]]:
    state = state or {"reserved_gpu_milli": 0, "applied": 0}
    payload = envelope.payload
    sign = 1 if isinstance(payload, WorkloadQuotaReserved) else -1 if isinstance(payload, WorkloadReleased) else 0
    new = {
        "reserved_gpu_milli": state["reserved_gpu_milli"] + sign * gpu_milli(payload.usage),
        "applied": state["applied"] + 1,
    }
    snapshot = UsageSnapshot(
        namespace=payload.namespace,
        reserved={"all": {"nvidia.com/gpu": max(new["reserved_gpu_milli"], 0)}},
        running={},
        total={"nvidia.com/gpu": max(new["reserved_gpu_milli"], 0)},
        as_of=envelope.occurred_at,
    )
    out = make_envelope(snapshot, producer="usage-test-worker", occurred_at=envelope.occurred_at, cause=envelope)
    return new, [Output("qm.usage", payload.namespace, out)]


async def on_workload_event(envelope: Envelope, event) -> None:
    await runtime.apply_once(usage, envelope.payload.namespace, envelope, fold)


# the table's only writer, as the services run; QM_TEST_TOPICS="qm.workloads,qm.preemption" makes
# it one agent over two co-partitioned topics (ServiceRuntime.consume's co_partitioned, ADR 0017)
topics = os.environ.get("QM_TEST_TOPICS", "qm.workloads").split(",")
runtime.consume(topics[0] if len(topics) == 1 else topics, on_workload_event, batched=True)

if __name__ == "__main__":
    runtime.main()
