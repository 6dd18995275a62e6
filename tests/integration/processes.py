"""Start and stop real service processes for integration tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from services.demo.stack import free_base_port

REPO = Path(__file__).resolve().parents[2]


async def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, *, every_s: float = 0.3) -> None:
    """Await `condition()` every `every_s` seconds until it is true; after `timeout_s`, fail
    the test naming `what` it waited for."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def free_port() -> int:
    return free_base_port(1)  # below the ephemeral range (see there)


@dataclass
class Worker:
    process: subprocess.Popen
    port: int
    log_path: Path

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def readiness(self) -> dict:
        """The worker's /readyz answer, ready or not ({} while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as response:
                return orjson.loads(response.read())
        except urllib.error.HTTPError as refused:
            return orjson.loads(refused.read())
        except OSError:
            return {}

    def json_log(self) -> list[dict]:
        """The worker's JSON log lines, parsed (anything else, such as a crash's traceback, left out)."""
        text = self.log_path.read_text() if self.log_path.exists() else ""
        return [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]

    def wait_ready(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}; log:\n{self.log()}")
            if self.ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready in {timeout_s}s; log:\n{self.log()}")

    def metrics(self) -> str:
        """The worker's Prometheus exposition ("" while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as response:
                return response.read().decode()
        except OSError:
            return ""

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text()[-4000:] if self.log_path.exists() else ""


def start_worker(module: str, env: dict[str, str], log_path: Path, loglevel: str | None = None) -> Worker:
    port = free_port()
    full_env = {**os.environ, **env, "QM_WEB_PORT": str(port), "PYTHONPATH": str(REPO)}
    log_file = open(log_path, "ab")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [sys.executable, "-m", module, "worker", "--loglevel",
         loglevel or os.environ.get("QM_TEST_WORKER_LOGLEVEL", "warn")],
        cwd=REPO,
        env=full_env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    return Worker(process, port, log_path)


async def kill_when_written(
    worker: Worker, bootstrap: str, topic: str, records: int, timeout_s: float = 240,
    counts: Callable[[Any], int | bool] = lambda _record: True,
) -> int:
    """SIGKILL the worker as soon as `records` records are on the topic (`counts`: how many a
    record is, e.g. the envelopes of a type in a bundle; by default one each),
    and return how many were seen. The topic is followed, not polled: a fast worker finishes a
    whole test stream between two polls."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    seen, deadline = 0, time.monotonic() + timeout_s
    try:
        while seen < records:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {seen} of {records} records on {topic} before the kill; log:\n{worker.log()}")
            batch = await consumer.getmany(timeout_ms=20)
            seen += sum(int(counts(record)) for batch_records in batch.values() for record in batch_records)
        worker.kill()
        return seen
    finally:
        await consumer.stop()
