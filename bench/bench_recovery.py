"""Queue-manager recovery after 100,000 workloads, and peak memory per service (issue 10, benchmark 5).

What runs:

* Fresh prefixed topics; admission, queue-manager, preemption and cost-accounting as
  processes (services/demo/stack.py) with QM_STORE=memory:// (default; --store rocksdb for
  the local store): a restarted worker then rebuilds its tables from their changelog topics.
* The config has --cohorts cohorts of --queues ClusterQueues (one GPU flavor, quota for every
  workload: the table ends up holding all of them, the heaviest state), as bench_queue.py.
* --workloads validated workloads (1 GPU each, round-robin over the queues) are published on
  qm.workloads, as admission would (admission itself sees none of them: 100,000 submissions
  through it would measure admission, not recovery). The run waits until every service has
  committed everything it read.
* Peak memory (VmHWM from /proc/<pid>/status) of every service is read then.
* The queue-manager is stopped (SIGTERM) and a new one started in the same consumer group.
  Measured: start -> /readyz answers 200 (faust says its tables are recovered), and start ->
  its /queues view holds every admitted workload again (the table really is rebuilt); the
  changelog's record count; the new worker's peak memory after recovery.

--scale 0.1 runs 10,000 workloads. Results: bench/results/recovery.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_queue import submission, write_config  # noqa: E402
from common import (  # noqa: E402
    ROOT,
    BenchStack,
    Progress,
    add_run_options,
    load,
    machine,
    print_rows,
    row,
    run_cli,
    run_figures,
    scale_arg,
    stop_on_signals,
    topic_end_offsets,
    vm_hwm_mib,
    wait_drained,
    write_result,
)

from services.demo.stack import SERVICES  # noqa: E402

QM = "queue-manager"


def _get_json(url: str, timeout: float = 30.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, json.loads(response.read())


def _ready(port: int) -> bool:
    try:
        return _get_json(f"http://127.0.0.1:{port}/readyz", 2)[0] == 200
    except OSError:
        return False


def _admitted(port: int) -> int | None:
    try:
        _, view = _get_json(f"http://127.0.0.1:{port}/queues", 60)
    except (OSError, ValueError):
        return None
    return sum(len(v["admitted"]) for v in view.values())


async def publish(stack: BenchStack, n: int, cohorts: int, queues: int, progress: Progress) -> float:
    """n validated workloads on qm.workloads, encoded (strictly validated) before sending."""
    tag = uuid.uuid4().hex[:6]
    producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap, acks="all", linger_ms=20, max_batch_size=512 * 1024)
    await producer.start()
    started = time.monotonic()
    try:
        for i in range(n):
            key, value = submission(i, cohorts, queues, tag)
            await producer.send(stack.prefix + "qm.workloads", key=key, value=value)
            if i % 10_000 == 0:
                progress(f"published {i}/{n}")
        await producer.flush()
    finally:
        await producer.stop()
    return time.monotonic() - started


def start_queue_manager(stack: BenchStack, port: int) -> subprocess.Popen:
    """One more queue-manager worker, as services/demo/stack.py starts one, in the same group."""
    env = {**os.environ, **stack.service_env(), "QM_WEB_PORT": str(port), "PYTHONPATH": str(ROOT)}
    log = open(stack.run_dir / "queue-manager-restarted.log", "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen([sys.executable, "-m", "services.queue_manager", "worker", "--loglevel", "warn"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip


async def run(args: argparse.Namespace) -> dict:
    n = max(1, round(args.workloads * args.scale))
    progress = Progress("recovery")
    at_start = machine()  # commit and versions as the services load them
    load_before = load()
    started = time.monotonic()
    env = {"QM_STORE": f"{args.store}://"}
    async with BenchStack("recovery", env=env, keep_topics=args.keep_topics) as stack:
        per_cq = -(-n // (args.cohorts * args.queues))
        write_config(stack.config_dir, args.cohorts, args.queues, per_cq * 2)
        await stack.start()
        progress(f"services ready in {stack.ready_s} s; publishing {n} validated workloads", force=True)
        publish_s = await publish(stack, n, args.cohorts, args.queues, progress)
        progress(f"published in {publish_s:.1f} s; waiting until every service has committed all of it", force=True)
        fed = time.monotonic()
        readers = stack.groups(s for s in SERVICES if s != "admission")  # admission reads nothing here
        drain = await wait_drained(stack.bootstrap, readers, args.timeout, progress, stall_s=60, stack=stack,
                                   reads=stack.reads(s for s in SERVICES if s != "admission"))
        process_s = time.monotonic() - fed
        peak = dict(stack.read_peak_memory())
        cpu = dict(stack.cpu_s)
        port = stack.stack.port(QM)
        before = await asyncio.to_thread(_admitted, port)
        progress(f"processed in {process_s:.1f} s ({'drained' if drain['drained'] else 'NOT drained'}); "
                 f"queue-manager holds {before} admitted; restarting it", force=True)  # fmt: skip
        changelog = f"qm-{QM}{stack.suffix}-cohorts-changelog"
        changelog_records = (await topic_end_offsets(stack.bootstrap, [changelog]))[changelog]

        old = stack.stack.processes[QM]
        old.send_signal(signal.SIGTERM)
        await asyncio.to_thread(old.wait, 60)
        t0 = time.monotonic()
        new = start_queue_manager(stack, port)
        stack.stack.processes[QM] = new  # stopped with the others
        ready_s = complete_s = None
        deadline = t0 + args.timeout
        while time.monotonic() < deadline and new.poll() is None:
            if ready_s is None and await asyncio.to_thread(_ready, port):
                ready_s = time.monotonic() - t0
                progress(f"restarted queue-manager ready after {ready_s:.1f} s", force=True)
            if ready_s is not None:
                if before is None:
                    break  # the first worker did not answer: nothing to compare the rebuilt table with
                count = await asyncio.to_thread(_admitted, port)
                if count is not None and before is not None and count >= before:
                    complete_s = time.monotonic() - t0
                    break
                progress(f"restarted queue-manager holds {count}/{before}")
            await asyncio.sleep(0.25)
        after = await asyncio.to_thread(_admitted, port)
        peak_restarted = vm_hwm_mib(new.pid)
    result = {
        "workloads": n,
        "scale": args.scale,
        "store": args.store,
        "config": f"{args.cohorts} cohorts x {args.queues} ClusterQueues, 1 GPU flavor, quota for every workload",
        "publish_s": round(publish_s, 1),
        "processing_s": round(process_s, 1),
        "drain": {"drained": drain["drained"], "stalled": drain["stalled"], "uncommitted_at_end": drain["lags"],
                  "services_exited": drain.get("exited", {})},
        "admitted_before_restart": before,
        "admitted_after_restart": after,
        "changelog_records": changelog_records,
        "restart_ready_s": round(ready_s, 2) if ready_s is not None else None,
        "restart_table_complete_s": round(complete_s, 2) if complete_s is not None else None,
        "peak_memory_mib": peak,
        "cpu_seconds": cpu,
        "peak_memory_mib_restarted_queue_manager": peak_restarted,
        **run_figures(stack, started, at_start, load_before),
    }
    result["summary_rows"] = summary_rows(result)
    return result


def summary_rows(r: dict) -> list[dict]:
    note = f"{r['workloads']:,} workloads, {r['store']}, {r['changelog_records']:,} changelog records"
    if not r["drain"]["drained"]:
        note += "; the services had not committed everything before the restart"
    rebuilt = r["restart_table_complete_s"]
    rows = [row("recovery: restarted queue-manager rebuilds its tables",
                f"ready {r['restart_ready_s']} s, every workload back {rebuilt} s "
                f"({r['admitted_after_restart']}/{r['admitted_before_restart']})", "—", "—", None, note)]
    for service, mib in r["peak_memory_mib"].items():
        rows.append(row(f"recovery: peak memory, {service}", f"{mib} MiB", "—", "—", None,
                        "VmHWM after all workloads" if service != "admission" else "VmHWM (sees none of them)"))
    rows.append(row("recovery: peak memory, restarted queue-manager", f"{r['peak_memory_mib_restarted_queue_manager']} MiB",
                    "—", "—", None, "VmHWM after rebuilding"))  # fmt: skip
    return rows


async def main_async(args: argparse.Namespace) -> int:
    stop_on_signals()
    result = await run(args)
    path = write_result("recovery", result)
    print(f"\n### recovery ({result['workloads']:,} workloads, bench wall {result['bench_wall_s']} s, "
          f"load {result['load_before']} → {result['load_after']})\n")  # fmt: skip
    print_rows(result["summary_rows"])
    print(f"\nwritten {path}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--workloads", type=int, default=100_000)
    p.add_argument("--scale", type=scale_arg, default=1.0, help="fraction of --workloads, in (0, 1]")
    p.add_argument("--cohorts", type=int, default=100)
    p.add_argument("--queues", type=int, default=10, help="ClusterQueues per cohort")
    p.add_argument("--store", choices=["memory", "rocksdb"], default="memory")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the processing, and again for the restart")
    add_run_options(p, profile=False)
    return run_cli(main_async, p)


if __name__ == "__main__":
    raise SystemExit(main())
