"""Service settings, read once from the environment into a frozen object."""

from __future__ import annotations

import os
from dataclasses import dataclass

# One web port per service, so all five can run on one machine.
DEFAULT_WEB_PORTS = {
    "watcher": 6061,
    "admission": 6062,
    "queue-manager": 6063,
    "preemption": 6064,
    "cost-accounting": 6065,
}


# Tables live in memory and rebuild from their changelogs on start (ADR 0041): what every
# launcher, test and benchmark runs. rocksdb:// keeps them on local disk instead, so a restart
# on the same data directory skips the replay, at ~1.6x the queue-manager's CPU.
DEFAULT_STORE = "memory://"
STORES = ("memory://", "rocksdb://")


def _store(url: str) -> str:
    if url not in STORES:
        raise SystemExit(f"QM_STORE={url!r}: expected one of {', '.join(STORES)} (default {DEFAULT_STORE}; ADR 0041)")
    return url


def milliseconds_env(name: str, default: int, service: str, meaning_of_zero: str) -> int:
    """Whole milliseconds from environment variable `name`; a clear exit when it is not."""
    return whole_number_env(name, default, service, meaning_of_zero, unit="whole milliseconds")


def whole_number_env(name: str, default: int, service: str, meaning_of_zero: str, unit: str = "a whole number") -> int:
    """A whole number from environment variable `name`; a clear exit when it is not."""
    text = os.environ.get(name, str(default))
    if not text.strip().isdigit():
        raise SystemExit(f"{service}: {name}={text!r}: expected {unit}, 0 or more "
                         f"(0: {meaning_of_zero}; default {default})")
    return int(text)


@dataclass(frozen=True, slots=True)
class Settings:
    service: str
    kafka_bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = ""
    store: str = "memory://"
    data_dir: str = "/tmp/quartermaster"
    web_host: str = "127.0.0.1"
    web_port: int = 6060
    log_level: str = "info"
    app_id_suffix: str = ""

    @property
    def app_id(self) -> str:
        """The faust app id is the consumer group: one per service (per test run when suffixed)."""
        return f"qm-{self.service}{self.app_id_suffix}"

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    @classmethod
    def from_env(cls, service: str, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        key = service.upper().replace("-", "_")
        return cls(
            service=service,
            kafka_bootstrap=env.get("QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
            topic_prefix=env.get("QM_TOPIC_PREFIX", ""),
            store=_store(env.get("QM_STORE", DEFAULT_STORE)),
            data_dir=env.get("QM_DATA_DIR", "/tmp/quartermaster"),
            web_host=env.get("QM_WEB_HOST", "127.0.0.1"),
            web_port=int(env.get(f"QM_{key}_WEB_PORT", env.get("QM_WEB_PORT", DEFAULT_WEB_PORTS.get(service, 6060)))),
            log_level=env.get("QM_LOG_LEVEL", "info"),
            app_id_suffix=env.get("QM_APP_ID_SUFFIX", ""),
        )
