"""The watcher's composition root: settings, wiring, and the run loop.

The bus is injected: ``run(settings, sink, actions)`` takes an async ``sink(topic, key, event)``
(production: the Kafka producer; tests: an in-memory list) and an async iterator of qm.actions
envelopes (production: the Kafka consumer; tests: a queue). Nothing here imports Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.contracts import yaml_documents

from .actuate import Actuator
from .kube import Credentials, Kube, api_client
from .normalize import Flavor, flavors_from_objects
from .watch import FileStateStore, MemoryStateStore, Sink, Watcher, run_clock

log = logging.getLogger("quartermaster.watcher")

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class WatcherSettings:
    server: str
    token_file: str
    ca_file: str | None
    state_path: str | None = None  # None: in memory (a restart re-lists; ids keep it idempotent)
    config_dir: str | None = None  # Kueue YAML (ResourceFlavors) read at start, GitOps style
    clock_interval_s: float = 10.0
    watch_timeout_s: int = 300
    request_timeout_s: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> WatcherSettings:
        """QM_K8S_SERVER / QM_K8S_TOKEN_FILE / QM_K8S_CA, else the in-cluster ServiceAccount."""
        in_cluster = f"https://{env.get('KUBERNETES_SERVICE_HOST', '')}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
        return cls(
            server=env.get("QM_K8S_SERVER") or in_cluster,
            token_file=env.get("QM_K8S_TOKEN_FILE") or f"{SA_DIR}/token",
            ca_file=env.get("QM_K8S_CA") or f"{SA_DIR}/ca.crt",
            state_path=env.get("QM_WATCHER_STATE") or None,
            config_dir=env.get("QM_CONFIG_DIR") or None,
            clock_interval_s=float(env.get("QM_CLOCK_INTERVAL_S", "10")),
            watch_timeout_s=int(env.get("QM_WATCH_TIMEOUT_S", "300")),
        )


def load_flavors(config_dir: str | None) -> dict[str, Flavor]:
    if not config_dir:
        return {}
    objs: list[dict[str, Any]] = []
    for path in sorted(Path(config_dir).rglob("*.y*ml")):
        objs.extend(d for d in yaml_documents.load_all(path.read_text()) if isinstance(d, dict))
    return flavors_from_objects(objs)


def make_kube(settings: WatcherSettings) -> Kube:
    """A client that re-reads the token file before requests (projected tokens rotate)."""
    with open(settings.token_file) as f:
        token = f.read().strip()
    api = api_client(Credentials(settings.server, token, settings.ca_file))
    cfg = api.configuration
    state = {"mtime": os.stat(settings.token_file).st_mtime}

    def refresh(c: Any) -> None:
        try:
            m = os.stat(settings.token_file).st_mtime
        except OSError:
            return
        if m != state["mtime"]:
            with open(settings.token_file) as f:
                c.api_key["BearerToken"] = f.read().strip()
            state["mtime"] = m

    cfg.refresh_api_key_hook = refresh
    return Kube(api, request_timeout_s=settings.request_timeout_s)


class ActionRunner:
    """Applies actions concurrently across workloads and in order within one workload (an
    Evict waiting out its grace period does not hold up an Admit elsewhere)."""

    def __init__(self, actuator: Actuator) -> None:
        self.actuator = actuator
        self._tails: dict[str, asyncio.Task[Any]] = {}

    def submit(self, action: Mapping[str, Any]) -> asyncio.Task[Any]:
        key = (action.get("payload") or {}).get("workload_uid") or action.get("event_id", "")
        prev = self._tails.get(key)

        async def run() -> Any:
            if prev is not None:
                with contextlib.suppress(Exception):
                    await prev
            return await self.actuator.apply(action)

        task = asyncio.create_task(run(), name=f"action {action.get('event_type')} {key}")
        self._tails[key] = task
        task.add_done_callback(lambda t, k=key: self._tails.pop(k, None) if self._tails.get(k) is t else None)
        return task

    async def drain(self) -> None:
        while self._tails:
            await asyncio.gather(*list(self._tails.values()), return_exceptions=True)


async def run(settings: WatcherSettings, sink: Sink,
              actions: AsyncIterator[Mapping[str, Any]] | None = None,
              action_source: Any = None) -> None:
    """Watch and actuate until cancelled. `actions` yields action envelopes to apply; or
    `action_source(runner)` feeds the ActionRunner itself (the Kafka shell, which tracks
    each action's task to commit offsets only after the action was applied)."""
    kube = make_kube(settings)
    flavors = load_flavors(settings.config_dir)
    store = FileStateStore(settings.state_path) if settings.state_path else MemoryStateStore()
    actuator = Actuator(kube, sink, flavors=flavors)
    watcher = Watcher(kube, sink, store, flavors=flavors, watch_timeout_s=settings.watch_timeout_s,
                      on_held_pod=actuator.release_if_admitted)
    runner = ActionRunner(actuator)
    tasks = [asyncio.create_task(watcher.run_forever(), name="watcher"),
             asyncio.create_task(run_clock(sink, interval_s=settings.clock_interval_s), name="clock")]
    if action_source is not None:
        async def feed() -> None:
            async for _ in action_source(runner):
                pass
        tasks.append(asyncio.create_task(feed(), name="actions"))
    elif actions is not None:
        async def consume() -> None:
            async for action in actions:
                runner.submit(action)
        tasks.append(asyncio.create_task(consume(), name="actions"))
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await runner.drain()
        await kube.close()
