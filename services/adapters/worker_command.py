"""The `worker` command every service runs (`python -m services.<name> worker`): faust's own,
with its start-up banner as one JSON log line instead of a text table (ADR 0056).

faust prints the banner (id, transport, store, web address, data directory, drivers) with the
command's `say()`, before logging is set up and whatever the log level, so 16 text lines led
every service's JSON log and broke a reader that parses each line (`jq`). faust registers a
command under its class's name when the class is defined, so defining `worker` here, as a
subclass of faust's, replaces faust's in the command line of any process that imports it.
"""

from __future__ import annotations

from typing import Any

import faust.cli.worker


class worker(faust.cli.worker.worker):  # noqa: N801 - faust names the command after the class
    """Start the service: join its consumer group, read its topics, serve /readyz and /metrics."""

    def on_worker_created(self, worker: Any) -> None:
        facts = []
        for name, value in self._banner_data(worker):
            key = name.strip()
            if key in ("", "+") or not value:  # the table's spacer rows
                continue
            facts.append(f"{key} driver {value}" if name.startswith("  ") else f"{key} {value}")
        worker.app.qm_runtime.log.info("worker starting", detail="; ".join(facts))
