"""Start and stop the services as processes on one machine, each with its own web port."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The watcher's place is taken by the simulator when no cluster is given.
SERVICES = ("admission", "queue-manager", "preemption", "cost-accounting")


# How many steps lower than the queue-manager each service runs on one machine by default, and
# the variable that changes it (ADR 0022, ADR 0029).
NICE_DEFAULTS = {"cost-accounting": ("QM_COST_NICE", 10), "admission": ("QM_ADMISSION_NICE", 0)}


def service_nice(service: str) -> int:
    """How much lower a service's CPU priority is than the queue-manager's on one machine.

    * cost-accounting: QM_COST_NICE, default 10. Its ledger may lag where quota decisions must
      not (ADR 0022).
    * admission: QM_ADMISSION_NICE, default 0. Raised (e.g. to 5), a burst of submissions is
      validated at the queue-manager's pace instead of flooding it: kueue-large-scale ran
      10-13% faster with no evictions, but kueue-baseline's large workloads waited 9 s for
      admission instead of 0.5 s (ADR 0029).
    * The queue-manager and preemption: always 0."""
    if service not in NICE_DEFAULTS:
        return 0
    variable, default = NICE_DEFAULTS[service]
    raw = os.environ.get(variable, str(default))
    value = int(raw) if raw.strip().isdigit() else -1
    if not 0 <= value <= 19:
        raise SystemExit(f"{variable}={raw!r}: expected a niceness from 0 to 19 (0: no lower priority)")
    return value


def lowered_priority(nice: int) -> Callable[[], None] | None:
    """A preexec_fn that starts the child process `nice` steps lower in CPU priority."""
    if not nice:
        return None

    def lower() -> None:
        os.nice(nice)

    return lower


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local port of outgoing connections (and of bind to port 0)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _all_free(base: int, count: int) -> bool:
    try:
        for port in range(base, base + count):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False


def free_base_port(count: int = len(SERVICES)) -> int:
    """A base port with `count` free consecutive ports after it: two stacks on one machine (a
    demo and a benchmark, say) must never answer each other's readiness checks.

    Chosen below the kernel's ephemeral range when there is room: a port in that range can be
    taken as the local port of any outgoing connection between this check and the service's
    start (CI saw it once: "address already in use" from a service's web server)."""
    low, _ = _ephemeral_ports()
    if low - count > 10_000:
        for _ in range(200):
            base = random.randrange(10_000, low - count)
            if _all_free(base, count):
                return base
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65535 and _all_free(base, count):
            return base
    raise RuntimeError("no free run of ports for the services")


def replicas_from_env(raw: str | None = None) -> dict[str, int]:
    """QM_REPLICAS, e.g. "admission=2": how many processes of a service to start (1 each by
    default). Replicas of a service share its consumer groups, so they split its partitions."""
    raw = os.environ.get("QM_REPLICAS", "") if raw is None else raw
    replicas = {}
    for item in raw.replace(",", " ").split():
        service, _, count = item.partition("=")
        if service not in SERVICES or not count.isdigit() or not 1 <= int(count) <= 8:
            raise SystemExit(f"QM_REPLICAS: {item!r} is not SERVICE=COUNT with COUNT from 1 to 8 "
                             f"(services: {', '.join(SERVICES)}; e.g. QM_REPLICAS=admission=2)")
        replicas[service] = int(count)
    return replicas


@dataclass
class Stack:
    run_dir: Path
    env: dict[str, str]
    base_port: int = field(default_factory=free_base_port)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=replicas_from_env)

    def instances(self) -> list[tuple[str, str]]:
        """(process name, service) of every process: the first of a service is named after it,
        the others "admission-2" and so on."""
        named = [(service, service) for service in SERVICES]
        for service in SERVICES:
            named += [(f"{service}-{n}", service) for n in range(2, self.replicas.get(service, 1) + 1)]
        return named

    def port(self, name: str) -> int:
        """The web port of a process (a service's name is its first process)."""
        return self.base_port + [n for n, _ in self.instances()].index(name)

    def start(self) -> None:
        if len(self.instances()) > len(SERVICES) and not _all_free(self.base_port, len(self.instances())):
            self.base_port = free_base_port(len(self.instances()))
        for name, service in self.instances():
            module = "services." + service.replace("-", "_")
            env = {**os.environ, **self.env, "QM_WEB_PORT": str(self.port(name)), "PYTHONPATH": str(REPO)}
            if name != service:
                if "QM_DATA_DIR" in env:
                    env["QM_DATA_DIR"] = f"{env['QM_DATA_DIR']}/{name}"  # a store of its own
                env.pop("QM_WEBHOOK_PORT", None)  # one port: the service's first process serves the webhook
            log = open(self.run_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", module, "worker", "--loglevel", "warn"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=lowered_priority(service_nice(service)),
            )

    def wait_ready(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = {name for name, _ in self.instances()}
        while waiting and time.monotonic() < deadline:
            for name in list(waiting):
                process = self.processes[name]
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited during start; see {self.run_dir / (name + '.log')}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port(name)}/readyz", timeout=1):
                        waiting.discard(name)
                except OSError:
                    pass
            time.sleep(0.3)
        if waiting:
            raise RuntimeError(f"not ready after {timeout_s:.0f}s: {', '.join(sorted(waiting))}; logs in {self.run_dir}")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
