"""deploy/kafka/kafka.sh refuses a setting it cannot honour before it starts anything."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_an_unknown_garbage_collector_is_named_with_the_choices(tmp_path):
    env = {**os.environ, "QM_KAFKA_GC": "Z", "QM_KAFKA_HOME": str(tmp_path / "run"), "QM_CACHE": str(tmp_path)}
    done = subprocess.run(["bash", str(REPO / "deploy/kafka/kafka.sh"), "start"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "QM_KAFKA_GC=Z: expected G1 (the default), Parallel or Serial" in done.stderr
    assert not (tmp_path / "run").exists()  # nothing fetched, formatted or started
