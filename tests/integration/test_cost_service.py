"""The cost-accounting service on the real broker: the field report's idle reservation, hourly
running rows, and SIGKILL in the middle of a trace replay (ledger deduplicated by row id equals
the uninterrupted fold)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from decimal import Decimal

import pytest
import yaml

from services.adapters.bus import Publisher, read_envelopes, read_topic
from services.contracts.codec import make_envelope
from services.contracts.events import (
    ClockTick,
    NamespaceLabels,
    PodFinished,
    PodRunning,
    WorkloadFinished,
    WorkloadPending,
    WorkloadPrefreezeExpired,
    WorkloadQuotaReserved,
    WorkloadReleased,
    WorkloadRunning,
)
from services.cost_accounting.config import config_from_documents
from services.cost_accounting.ledger import LedgerFold
from tests.integration.processes import start_worker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
CC_LABEL = "quartermaster.dev/cost-center"
CONFIG = """\
apiVersion: quartermaster.dev/v1alpha1
kind: PriceList
metadata: {name: default}
spec:
  currency: USD
  flavors:
    - name: a100-flavor
      resources:
        - {name: nvidia.com/gpu, listPrice: "3.00", contractedPrice: "2.00"}
  default:
    resources:
      - {name: nvidia.com/gpu, listPrice: "1.20"}
      - {name: cpu, listPrice: "0.04"}
---
apiVersion: quartermaster.dev/v1alpha1
kind: CostSettings
metadata: {name: default}
spec: {costCenterLabel: quartermaster.dev/cost-center, correctionHorizonHours: 48}
"""


def env_for(prefix: str, suffix: str, tmp_path) -> dict[str, str]:
    config_dir = tmp_path / "config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "cost.yaml").write_text(CONFIG)
    return {
        "QM_TOPIC_PREFIX": prefix,
        "QM_APP_ID_SUFFIX": suffix,
        "QM_STORE": "memory://",
        "QM_DATA_DIR": str(tmp_path / "data"),
        "QM_CONFIG_DIR": str(config_dir),
    }


def input_topic(prefix: str, suffix: str) -> str:
    return f"{prefix}qm-cost-accounting{suffix}-ledger-input"


def env(payload, at: str, *ident):
    return make_envelope(payload, producer="test", occurred_at=at, identity=ident or None)


async def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


async def count(bootstrap: str, topic: str) -> int:
    return len([r async for r in read_topic(bootstrap, topic, idle_timeout_s=0.3)])


async def ledger(bootstrap: str, prefix: str) -> list:
    return [e async for _, e in read_envelopes(bootstrap, prefix + "qm.billing")]


async def publish_in_order(bootstrap, prefix, suffix, batches):
    """Publish batch by batch, each once the service forwarded the previous one onto its
    single-partition input: the fold sees the batches in this order whatever the topics."""
    forwarded = await count(bootstrap, input_topic(prefix, suffix))
    async with Publisher(bootstrap, prefix) as bus:
        for batch in batches:
            for topic, key, envelope in batch:
                await bus.publish(topic, key, envelope)
            await bus.flush()
            forwarded += sum(1 for _, _, e in batch if not isinstance(e.payload, WorkloadPending))

            async def caught_up(target=forwarded):
                return await count(bootstrap, input_topic(prefix, suffix)) >= target

            await wait_for(caught_up, 60, "the service to forward a batch")


def labels_event():
    return ("qm.cluster", "ml-team", env(NamespaceLabels(namespace="ml-team", labels={CC_LABEL: "cc-ml"}), "2026-11-29T08:00:00Z", "ns"))


def reserved(uid: str, gpus: int, at: str):
    payload = WorkloadQuotaReserved(
        uid=uid, namespace="ml-team", name=uid, cluster_queue="gpu-queue", cohort="ml",
        flavors={"main": {"nvidia.com/gpu": "a100-flavor"}}, counts={"main": 2},
        usage={"a100-flavor": {"nvidia.com/gpu": gpus * 1000}}, reserved_at=at,
    )
    return ("qm.workloads", "ml", env(payload, at, uid, "reserved"))


def tick(at: str):
    return ("qm.clock", "test", env(ClockTick(at=at, source="test"), at, "tick", at))


async def test_field_report_idle_reservation_is_one_row_of_1_333333333_gpu_hours(kafka_bootstrap, topic_prefix, tmp_path):
    suffix = f"-{uuid.uuid4().hex[:8]}"
    worker = start_worker("services.cost_accounting", env_for(topic_prefix, suffix, tmp_path), tmp_path / "w.log")
    try:
        worker.wait_ready()
        uid, at_exp = "7f1c-llm-ft", "2026-11-29T10:05:00Z"
        expired = WorkloadPrefreezeExpired(
            uid=uid, namespace="ml-team", name=uid, cluster_queue="gpu-queue", reserved_at="2026-11-29T10:00:00Z",
            expired_at=at_exp, idle_s=300.0, usage={"a100-flavor": {"nvidia.com/gpu": 16000}},
        )
        released = WorkloadReleased(
            uid=uid, namespace="ml-team", name=uid, cluster_queue="gpu-queue", reason="PodsReadyTimeout",
            usage={"a100-flavor": {"nvidia.com/gpu": 16000}}, released_at=at_exp,
        )
        pending = WorkloadPending(uid=uid, namespace="ml-team", name=uid, reason="Requeued", message="backoff")
        await publish_in_order(kafka_bootstrap, topic_prefix, suffix, [
            [labels_event()],
            [reserved(uid, 16, "2026-11-29T10:00:00Z"),
             ("qm.workloads", "ml", env(expired, at_exp, "exp")),
             ("qm.workloads", "ml", env(released, at_exp, "rel")),
             ("qm.workloads", "ml", env(pending, at_exp, "pend"))],  # ignored by cost
            [tick("2026-11-29T11:00:00Z")],
        ])

        async def one_row():
            return len(await ledger(kafka_bootstrap, topic_prefix)) >= 1

        await wait_for(one_row, 30, "the idle row")
        await asyncio.sleep(1.0)
        rows = await ledger(kafka_bootstrap, topic_prefix)
    finally:
        worker.stop()
    assert len(rows) == 1, [r.payload for r in rows]
    row = rows[0]
    p = row.payload
    assert (p.x_UsageKind, p.x_GpuHours, p.PricingQuantity, p.PricingUnit) == ("reserved-idle", "1.333333333", "1.333333333", "GPU-Hours")
    assert (p.x_CostCenter, p.SubAccountId, p.ResourceId, p.SkuId) == ("cc-ml", "ml-team", uid, "a100-flavor")
    assert (p.ChargePeriodStart, p.ChargePeriodEnd) == ("2026-11-29T10:00:00Z", "2026-11-29T11:00:00Z")
    assert row.event_id == p.row_id == p.x_RowId
    assert p.BilledCost == "2.666666666"  # 1.333333333 GPU-h x 2.00 contracted


async def test_running_0940_to_1110_is_three_rows_summing_to_1_5_x_gpus(kafka_bootstrap, topic_prefix, tmp_path):
    suffix = f"-{uuid.uuid4().hex[:8]}"
    worker = start_worker("services.cost_accounting", env_for(topic_prefix, suffix, tmp_path), tmp_path / "w.log")
    uid, start, end = "wl-train", "2026-11-29T09:40:00Z", "2026-11-29T11:10:00Z"
    pods = [f"{uid}-pod-{i}" for i in range(2)]
    try:
        worker.wait_ready()
        await publish_in_order(kafka_bootstrap, topic_prefix, suffix, [
            [labels_event()],
            [reserved(uid, 8, start)],
            [("qm.workloads", "ml", env(WorkloadRunning(uid=uid, namespace="ml-team", name=uid, started_at=start), start, "run"))],
            [("qm.cluster", uid, env(PodRunning(uid=pod, workload_uid=uid, namespace="ml-team", name=pod, started_at=start,
                                                 requests={"nvidia.com/gpu": 4000}), start, pod)) for pod in pods],
            [("qm.cluster", uid, env(PodFinished(uid=pod, workload_uid=uid, namespace="ml-team", name=pod, phase="Succeeded",
                                                  finished_at=end), end, pod, "fin")) for pod in pods]
            + [("qm.workloads", "ml", env(WorkloadFinished(uid=uid, namespace="ml-team", name=uid, succeeded=True, finished_at=end), end, "done"))],
            [tick("2026-11-29T12:00:00Z")],
        ])

        async def three_rows():
            return len(await ledger(kafka_bootstrap, topic_prefix)) >= 3

        await wait_for(three_rows, 30, "three running rows")
        await asyncio.sleep(1.0)
        rows = [r.payload for r in await ledger(kafka_bootstrap, topic_prefix)]
        with urllib.request.urlopen(
            f"http://127.0.0.1:{worker.port}/allocation?window=2026-11-29T00:00:00Z,2026-11-30T00:00:00Z&aggregate=label:{CC_LABEL}",
            timeout=5,
        ) as response:
            view = json.loads(response.read())
    finally:
        worker.stop()
    assert sorted((r.ChargePeriodStart, r.x_UsageKind, r.x_GpuHours) for r in rows) == [
        ("2026-11-29T09:00:00Z", "running", "2.666666667"),
        ("2026-11-29T10:00:00Z", "running", "8.000000000"),
        ("2026-11-29T11:00:00Z", "running", "1.333333333"),
    ]
    assert sum(Decimal(r.x_GpuHours) for r in rows) == Decimal("1.5") * 8
    assert view["data"][0]["cc-ml"]["gpuHours"] == 12.0 and view["data"][0]["cc-ml"]["idle"] == 0.0


def expected_rows(envelopes) -> dict[str, dict]:
    """The uninterrupted ledger: the same fold, in-process, over the same input order."""
    fold = LedgerFold(_test_config())
    state, rows = None, {}
    for envelope in envelopes:
        state, outputs = fold(state, envelope)
        for out in outputs:
            if out.topic == "qm.billing":
                assert out.envelope.event_id not in rows or rows[out.envelope.event_id] == out.envelope.payload
                rows[out.envelope.event_id] = out.envelope.payload
    return rows


def _test_config():
    return config_from_documents(("test", d) for d in yaml.safe_load_all(CONFIG))


# The SIGKILL mid-replay test is not here yet: with one global fold state per event the
# service is too slow to replay a trace through a changelog (issue 7 note, ADR 0007).
