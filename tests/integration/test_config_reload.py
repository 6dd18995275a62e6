"""A new policy set published on qm.config takes effect in the running admission service; an
invalid one is refused by `qm config publish` and, if it arrives anyway, by the service,
which keeps its last good set."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from services.adapters.bus import Publisher, read_envelopes
from services.adapters.config_set import snapshot
from services.contracts.codec import make_envelope
from services.contracts.events import NamespaceLabels, UsageSnapshot
from services.policy.loader import Document
from tests.integration.processes import start_worker
from tests.integration.test_admission_service import AT, submitted
from tests.integration.test_worker_recovery import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "policies" / "library" / "namespace-gpu-max"


def policy_dir(tmp_path: Path, max_gpu: int) -> Path:
    directory = tmp_path / f"policies-{max_gpu}"
    directory.mkdir()
    shutil.copy(LIBRARY / "template.yaml", directory / "template.yaml")
    constraint = yaml.safe_load((LIBRARY / "samples" / "ml-team-max-32" / "constraint.yaml").read_text())
    constraint["spec"]["parameters"]["maxGpu"] = max_gpu
    (directory / "constraint.yaml").write_text(yaml.safe_dump(constraint))
    shutil.copy(REPO / "examples" / "seed" / "kueue.yaml", directory / "kueue.yaml")
    return directory


async def verdict(bootstrap, prefix, name):
    for _, e in [x async for x in read_envelopes(bootstrap, prefix + "qm.workloads")]:
        if not isinstance(e, Exception) and e.payload.name == name:
            return e
    return None


async def test_published_policy_set_applies_and_an_invalid_one_is_refused(kafka_bootstrap, topic_prefix, tmp_path):
    env = {"QM_TOPIC_PREFIX": topic_prefix, "QM_APP_ID_SUFFIX": f"-{uuid.uuid4().hex[:8]}", "QM_STORE": "memory://",
           "QM_DATA_DIR": str(tmp_path), "QM_CONFIG_DIR": str(REPO / "examples" / "seed"),
           "QM_POLICY_DIR": str(policy_dir(tmp_path, 32))}
    async with Publisher(kafka_bootstrap, topic_prefix) as bus:
        ns = NamespaceLabels(namespace="ml-team", labels={"quartermaster.dev/cost-center": "cc-ml"})
        await bus.publish("qm.cluster", "ml-team", make_envelope(ns, producer="test", occurred_at=AT))
        usage = UsageSnapshot(namespace="ml-team", reserved={}, running={"a100-flavor": {"nvidia.com/gpu": 12000}},
                              total={"nvidia.com/gpu": 12000}, as_of=AT)
        await bus.publish("qm.usage", "ml-team", make_envelope(usage, producer="test", occurred_at=AT))
        await bus.flush()
    worker = start_worker("services.admission", env, tmp_path / "admission.log", loglevel="info")
    try:
        worker.wait_ready()
        cli = [sys.executable, "-m", "services.cli.main", "config", "publish", "--bootstrap", kafka_bootstrap,
               "--prefix", topic_prefix]
        published = subprocess.run([*cli, str(policy_dir(tmp_path, 16))], cwd=REPO, capture_output=True, text=True,
                                   env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
        assert published.returncode == 0, published.stderr
        await _logged(tmp_path / "admission.log", "config applied")  # the service follows qm.config
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            await bus.publish("qm.cluster", "uid-eight", submitted("eight", 8))
            await bus.flush()

        async def judged(name):
            return await verdict(kafka_bootstrap, topic_prefix, name)

        first = await _wait(judged, "eight")
        assert first.event_type == "workload.rejected.v1"
        assert first.payload.violations[0]["message"] == "namespace ml-team used 12 GPU, requesting 8, max is 16"

        broken = tmp_path / "broken"
        broken.mkdir()
        constraint = yaml.safe_load((LIBRARY / "samples" / "ml-team-max-32" / "constraint.yaml").read_text())
        (broken / "constraint.yaml").write_text(yaml.safe_dump(constraint))  # no template for its kind
        refused = subprocess.run([*cli, str(broken)], cwd=REPO, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
        assert refused.returncode == 2
        assert "no ConstraintTemplate defines kind 'K8sBanExcessGpuQuota'" in refused.stderr
        # The same broken set sent around the CLI: the service refuses it and keeps max 16.
        raw = snapshot([Document(str(broken / "constraint.yaml"), 0, constraint)], 2, "test")
        async with Publisher(kafka_bootstrap, topic_prefix) as bus:
            await bus.publish("qm.config", "active", make_envelope(raw, producer="test", occurred_at=AT))
            await bus.flush()
            await _logged(tmp_path / "admission.log", "config refused; the previous set stays active")
            await bus.publish("qm.cluster", "uid-eight-again", submitted("eight-again", 8))
            await bus.flush()
        again = await _wait(judged, "eight-again")
        assert again.payload.violations[0]["message"].endswith("max is 16")
    finally:
        worker.stop()
    assert "config refused; the previous set stays active" in (tmp_path / "admission.log").read_text()


async def _logged(log: Path, line: str) -> None:
    """Wait for the service to say it has acted on a published set (no fixed sleep: CI is slow)."""

    async def said():
        return log.exists() and line in log.read_text()

    await wait_for(said, 60, f"the admission log to say {line!r}")


async def _wait(judged, name):
    box = {}

    async def found():
        box["v"] = await judged(name)
        return box["v"] is not None

    await wait_for(found, 60, f"the verdict on {name}")
    return box["v"]
