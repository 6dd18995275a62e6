"""What a service pays per record just to be handed it: the runtime's faust agent against a
plain aiokafka consumer, on the same records (a diagnostic, not one of issue 10's five).

Both readers are handed every record (a workload.pending.v1 each) and decode it; the handler
then does nothing. That is the price of each record a service acts on. (Records a runtime
service does not read are dropped at the fetch since ADR 0030, before faust sees them: cheap,
and no longer measured here.)

* faust: a `ServiceRuntime` service in its own process (`--serve`), `batched=True` as the
  queue-manager's fold. Its CPU (from /proc) is taken while it works through a backlog,
  between 10% and 90% of the records committed, so start-up and the last commit do not count.
* aiokafka: one consumer in a consumer group in this process, `getmany` + `read_envelope` +
  a commit per round, the way admission's fact lane reads (ADR 0026).

Results: bench/results/delivery.json and a table. Needs the local broker (`make up`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from services.contracts.events import WorkloadPending  # noqa: E402

HANDED = frozenset({WorkloadPending.EVENT_TYPE})  # every record is one


def serve() -> None:
    """The faust side: a service that is handed every record of qm.workloads and acts on none."""
    from services.adapters.runtime import ServiceRuntime
    from services.adapters.settings import Settings

    runtime = ServiceRuntime(Settings.from_env("delivery-bench"))

    async def nothing(envelope, event) -> None:
        pass

    runtime.consume("qm.workloads", nothing, batched=True, reads=[WorkloadPending])
    runtime.main()


async def produce(bootstrap: str, topic: str, records: int) -> None:
    from aiokafka import AIOKafkaProducer

    from services.contracts.codec import encode, make_envelope

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=512 * 1024)
    await producer.start()
    try:
        for i in range(records):  # a typical record of qm.workloads that its readers pass over
            pending = WorkloadPending(uid=f"uid-{i}", namespace="team-a", name=f"job-{i}", cluster_queue="cq-a",
                                      reason="WaitingForQuota", message="couldn't assign flavors to pod set main: "
                                      "insufficient unused quota for cpu in flavor rf, 20 more needed")
            envelope = make_envelope(pending, producer="bench", occurred_at="2026-11-29T09:00:00Z", identity=(i,))
            await producer.send(topic, encode(envelope), key=f"cohort-{i % 10}".encode())
        await producer.flush()
    finally:
        await producer.stop()


async def faust_side(bootstrap: str, prefix: str, records: int, log: Path) -> dict:
    from bench.common import committed_total, cpu_seconds

    suffix = f"-{uuid.uuid4().hex[:8]}"
    port = 6190 + os.getpid() % 500
    env = {**os.environ, "QM_TOPIC_PREFIX": prefix, "QM_APP_ID_SUFFIX": suffix, "QM_STORE": "memory://",
           "QM_DATA_DIR": str(log.parent / f"quartermaster-delivery-data{suffix}"), "QM_WEB_PORT": str(port), "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, __file__, "--serve", "worker", "--loglevel", "warn"], env=env,
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)
    group = f"qm-delivery-bench{suffix}"
    try:
        start = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the faust side exited with {proc.returncode}; see {log}")
            try:
                done = await committed_total(bootstrap, [group])  # it reads only qm.workloads
            except Exception:  # noqa: BLE001 - its group is not there yet
                done = 0
            if start is None and done >= 0.1 * records:
                start = (cpu_seconds(proc.pid, digits=None), done, time.monotonic())
            if start is not None and done >= 0.9 * records and done > start[1]:
                cpu = cpu_seconds(proc.pid, digits=None) - start[0]
                n, wall = done - start[1], time.monotonic() - start[2]
                return {"records": n, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
                        "us_per_record": round(1e6 * cpu / n, 1)}
            await asyncio.sleep(0.05)
        raise SystemExit(f"the faust side did not get through the backlog in 300 s; see {log}")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(env["QM_DATA_DIR"], ignore_errors=True)


async def aiokafka_side(bootstrap: str, prefix: str, records: int) -> dict:
    from aiokafka import AIOKafkaConsumer

    from services.adapters.bus import read_envelope

    consumer = AIOKafkaConsumer(prefix + "qm.workloads", bootstrap_servers=bootstrap,
                                group_id=f"delivery-bench-raw-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        seen, start = 0, None
        while seen < 0.9 * records:
            batch = await consumer.getmany(timeout_ms=1000, max_records=1000)
            for rows in batch.values():
                for row in rows:
                    read_envelope(row.value, HANDED)
            if batch:
                await consumer.commit()
            seen += sum(len(rows) for rows in batch.values())
            if start is None and seen >= 0.1 * records:
                start = (time.process_time(), seen, time.monotonic())
        cpu, n, wall = time.process_time() - start[0], seen - start[1], time.monotonic() - start[2]
        return {"records": n, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "us_per_record": round(1e6 * cpu / n, 1)}
    finally:
        await consumer.stop()


async def run(args: argparse.Namespace) -> dict:
    from bench.common import BOOTSTRAP, delete_topics, machine
    from services.adapters.bus import create_topics

    prefix = f"delivery-{uuid.uuid4().hex[:8]}."
    await create_topics(BOOTSTRAP, prefix)
    taken = machine()
    try:
        print(f"writing {args.records:,} records to {prefix}qm.workloads ...", file=sys.stderr)
        await produce(BOOTSTRAP, prefix + "qm.workloads", args.records)
        print("faust side (a ServiceRuntime service) ...", file=sys.stderr)
        faust = await faust_side(BOOTSTRAP, prefix, args.records, Path(args.log))
        print("aiokafka side ...", file=sys.stderr)
        raw = await aiokafka_side(BOOTSTRAP, prefix, args.records)
    finally:
        await delete_topics(BOOTSTRAP, lambda t: t.startswith(prefix) or "delivery-bench" in t)
    return {"records_written": args.records, "faust_runtime": faust, "aiokafka_consumer": raw,
            "ratio": round(faust["us_per_record"] / raw["us_per_record"], 1), "machine": taken}


def main() -> None:
    if "--serve" in sys.argv:
        sys.argv.remove("--serve")
        serve()
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000, help="records written and read (default 100,000)")
    parser.add_argument("--out", default=None, help="result file (default bench/results/delivery.json)")
    parser.add_argument("--log", default="/tmp/quartermaster-bench-delivery.log", help="the faust side's log")
    args = parser.parse_args()
    from bench.common import write_result

    report = asyncio.run(run(args))
    path = write_result("delivery", report, args.out)
    print("| reader | CPU per record handed over | records measured |")
    print("|---|---|---|")
    for label, key in (("ServiceRuntime (faust agent, batched)", "faust_runtime"),
                       ("aiokafka consumer (getmany)", "aiokafka_consumer")):
        figures = report[key]
        print(f"| {label} | {figures['us_per_record']} µs | {figures['records']:,} |")
    print(f"\nfaust / aiokafka: {report['ratio']}x; written {path}")


if __name__ == "__main__":
    main()
