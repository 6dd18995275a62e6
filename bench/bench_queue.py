"""`make bench-queue`: queue-manager decisions/s (Validated -> QuotaReserved|Pending) on the
local broker, and p50/p99 decision latency under an open-loop submission rate.

Targets (issue 4): >= 2,000 decisions/s sustained; p99 < 50 ms at 500 submissions/s.

* Each scenario gets fresh prefixed topics, a generated Kueue config (10 cohorts x 10
  ClusterQueues, one GPU flavor) and ONE queue-manager worker process
  (`python -m services.queue_manager worker`, QM_STORE=memory://), started and stopped here.
* Throughput: N validated submissions (1 GPU each, spread round-robin over the 100
  ClusterQueues) are published *before* the worker starts; the worker drains the backlog.
  Decisions/s is computed from the Kafka record timestamps (CreateTime, set by the worker's
  producer when it sends each QuotaReserved/Pending) of the decision records on qm.workloads:
  the first `--warmup` fraction of decisions is excluded (partition assignment, table
  recovery, JIT-less first calls), the rate is over the rest.
  Two quota variants: `ample` (every submission is admitted) and `half-wait` (each
  ClusterQueue's nominal quota holds half of its submissions, no borrowing: the second half
  are decided Pending).
* Latency: an open-loop publisher (sends are *scheduled* at a fixed rate; the record's
  timestamp is the scheduled time, so client lag counts against us) at each `--rates` for
  `--duration` seconds against a fresh worker with ample quota. Latency per workload =
  timestamp of its QuotaReserved record - timestamp of its Validated record (both CreateTime
  from the same clock on this machine).
* With `--lifetime S` every admitted workload also finishes S seconds after submission
  (a workload.finished.v1 is published), so the cohort state stays bounded at rate x S
  admitted workloads instead of growing for the whole run: the steady state of a real cluster.
* `--profile` runs the worker under cProfile and prints where its time went.

Both processes share the machine's cores with the broker; the load average before and after
is recorded. Writes bench/results/bench-queue.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import pstats
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

import orjson
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import envelope_values, machine  # noqa: E402

from services.adapters.bus import create_topics, wait_for_broker  # noqa: E402
from services.contracts.codec import encode, make_envelope  # noqa: E402
from services.contracts.events import WorkloadFinished, WorkloadValidated  # noqa: E402

V1 = "kueue.x-k8s.io/v1beta1"
DECISIONS = (b"workload.quota_reserved.v1", b"workload.pending.v1")
RESERVED = b"workload.quota_reserved.v1"
VALIDATED = b"workload.validated.v1"


# -- config and events --------------------------------------------------------------------


def write_config(directory: Path, cohorts: int, queues: int, nominal_gpus: int) -> None:
    docs = [{"apiVersion": V1, "kind": "ResourceFlavor", "metadata": {"name": "a100-flavor"},
             "spec": {"nodeLabels": {"gpu.nvidia.com/class": "a100"}}}]  # fmt: skip
    for c in range(cohorts):
        for q in range(queues):
            docs.append({"apiVersion": V1, "kind": "ClusterQueue", "metadata": {"name": f"cq-{c}-{q}"},
                         "spec": {"cohort": f"cohort-{c}", "namespaceSelector": {}, "resourceGroups": [{
                             "coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "a100-flavor", "resources": [
                                 {"name": "nvidia.com/gpu", "nominalQuota": nominal_gpus, "borrowingLimit": 0}]}]}]}})  # fmt: skip
            docs.append({"apiVersion": V1, "kind": "LocalQueue",
                         "metadata": {"name": "lq", "namespace": f"ns-{c}-{q}"}, "spec": {"clusterQueue": f"cq-{c}-{q}"}})  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kueue.yaml").write_text(yaml.safe_dump_all(docs))


def _now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def submission(i: int, cohorts: int, queues: int, tag: str) -> tuple[bytes, bytes]:
    """(key, value) of the i-th validated submission: 1 GPU, round-robin over every ClusterQueue."""
    c = i % cohorts
    q = (i // cohorts) % queues
    at = _now_iso()
    env = make_envelope(
        WorkloadValidated(uid=f"{tag}-{i}", namespace=f"ns-{c}-{q}", name=f"w{i}", queue_name="lq",
                          cluster_queue=f"cq-{c}-{q}", cohort=f"cohort-{c}", priority=0, created_at=at,
                          pod_sets=[{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": 1000}}]),
        producer="bench", occurred_at=at)  # fmt: skip
    return f"cohort:cohort-{c}".encode(), encode(env)


def finish(i: int, cohorts: int, queues: int, tag: str) -> tuple[bytes, bytes]:
    c = i % cohorts
    q = (i // cohorts) % queues
    at = _now_iso()
    env = make_envelope(WorkloadFinished(uid=f"{tag}-{i}", namespace=f"ns-{c}-{q}", name=f"w{i}", succeeded=True,
                                         finished_at=at), producer="bench", occurred_at=at)  # fmt: skip
    return f"cohort:cohort-{c}".encode(), encode(env)


# -- the worker ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    def __init__(self, prefix: str, config_dir: Path, data_dir: Path, log_path: Path, profile: Path | None) -> None:
        self.port = _free_port()
        self.log_path = log_path
        self.profile = profile
        env = {**os.environ, "QM_TOPIC_PREFIX": prefix, "QM_APP_ID_SUFFIX": f"-bench-{uuid.uuid4().hex[:8]}",
               "QM_STORE": "memory://", "QM_DATA_DIR": str(data_dir), "QM_CONFIG_DIR": str(config_dir),
               "QM_WEB_PORT": str(self.port), "QM_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT)}  # fmt: skip
        cmd = [sys.executable]
        if profile is not None:
            cmd += ["-m", "cProfile", "-o", str(profile)]
        cmd += ["-m", "services.queue_manager", "worker", "--loglevel", "warn"]
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    async def wait_ready(self, timeout_s: float = 60) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.log_path.read_text()[-3000:]}")
            if await asyncio.to_thread(self.ready):
                return time.monotonic() - start
            await asyncio.sleep(0.2)
        raise TimeoutError(f"worker not ready in {timeout_s}s:\n{self.log_path.read_text()[-3000:]}")

    def counters(self) -> dict[str, float]:
        """The runtime's own counters (events read, duplicates skipped, rewinds, refetches):
        they say how much of the worker's time went to events that decided nothing."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return {}
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not (sample.name.startswith("qm_") and sample.name.endswith("_total")):
                    continue
                topic = sample.labels.get("topic", "")
                key = f"{sample.name}[{topic.rsplit('.', 1)[-1]}]" if topic else sample.name
                totals[key] = totals.get(key, 0) + sample.value
        return totals

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


# -- reading the decisions -------------------------------------------------------------


class Trail:
    """Reads qm.workloads from the beginning while the scenario runs; keeps, per uid, the
    timestamp of its Validated record and of its first decision record."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.validated: dict[str, int] = {}
        self.decided: dict[str, tuple[int, bool]] = {}  # uid -> (timestamp ms, reserved?)
        self.decision_ts: list[int] = []
        self.records = 0
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                          auto_offset_reset="earliest", fetch_max_bytes=16 * 1024 * 1024,
                                          max_partition_fetch_bytes=4 * 1024 * 1024)  # fmt: skip
        await self._consumer.start()
        await self._consumer._client.force_metadata_update()
        tps = [TopicPartition(self.topic, p) for p in sorted(self._consumer.partitions_for_topic(self.topic) or ())]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=200, max_records=5000)
            for records in batch.values():
                for r in records:
                    self.records += 1
                    for value in envelope_values(r.value):  # a bundle: each decision (ADR 0034)
                        head = value[:200]
                        if VALIDATED in head:
                            self.validated[orjson.loads(value)["payload"]["uid"]] = r.timestamp
                        elif RESERVED in head or DECISIONS[1] in head:
                            uid = orjson.loads(value)["payload"]["uid"]
                            if uid not in self.decided:
                                self.decided[uid] = (r.timestamp, RESERVED in head)
                                self.decision_ts.append(r.timestamp)

    async def wait_decisions(self, n: int, timeout_s: float, quiet_s: float = 5.0) -> bool:
        """Until n decisions are seen, or nothing new arrives for quiet_s, or timeout."""
        deadline = time.monotonic() + timeout_s
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            if len(self.decided) >= n:
                return True
            if len(self.decided) != last:
                last, last_change = len(self.decided), time.monotonic()
            elif time.monotonic() - last_change > quiet_s:
                return False
            await asyncio.sleep(0.2)
        return False

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self._consumer.stop()


def _pct(sorted_vals: list[float], p: float) -> float | None:
    if not sorted_vals:
        return None
    return sorted_vals[min(len(sorted_vals) - 1, int(p * len(sorted_vals)))]


# -- scenarios --------------------------------------------------------------------------


async def _fresh(bootstrap: str, tmp: Path, name: str, nominal: int, args, profile: bool):
    prefix = f"bq{uuid.uuid4().hex[:8]}."
    await create_topics(bootstrap, prefix)
    config = tmp / name / "config"
    write_config(config, args.cohorts, args.queues, nominal)
    prof = tmp / name / "worker.prof" if profile else None
    return prefix, config, prof


async def throughput(bootstrap: str, tmp: Path, name: str, args) -> dict:
    n = args.submissions
    per_cq = -(-n // (args.cohorts * args.queues))
    nominal = per_cq * 10 if name == "ample" else per_cq // 2
    prefix, config, prof = await _fresh(bootstrap, tmp, name, nominal, args, args.profile)
    tag = uuid.uuid4().hex[:6]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=256 * 1024)
    await producer.start()
    try:
        for i in range(n):
            key, value = submission(i, args.cohorts, args.queues, tag)
            await producer.send(prefix + "qm.workloads", key=key, value=value)
        await producer.flush()
    finally:
        await producer.stop()
    trail = Trail(bootstrap, prefix + "qm.workloads")
    await trail.start()
    worker = Worker(prefix, config, tmp / name / "data", tmp / name / "worker.log", prof)
    try:
        ready_s = await worker.wait_ready()
        ready_ms = int(time.time() * 1000)
        complete = await trail.wait_decisions(n, timeout_s=args.timeout)
        counters = await asyncio.to_thread(worker.counters)
    finally:
        worker.stop()
        await trail.stop()
    ts = sorted(trail.decision_ts)
    skip = int(len(ts) * args.warmup)
    steady = ts[skip:]
    rate = (len(steady) - 1) / ((steady[-1] - steady[0]) / 1000) if len(steady) > 1 and steady[-1] > steady[0] else None
    overall = len(ts) / ((ts[-1] - ready_ms) / 1000) if ts and ts[-1] > ready_ms else None
    # decisions/s in one-second windows over the steady part: how even the rate is
    windows: dict[int, int] = {}
    for t in steady:
        windows[(t - steady[0]) // 1000] = windows.get((t - steady[0]) // 1000, 0) + 1
    full = sorted(v for k, v in windows.items() if k < max(windows, default=0))
    result = {
        "scenario": f"throughput/{name}",
        "submissions": n,
        "nominal_gpus_per_cq": nominal,
        "decisions": len(ts),
        "reserved": sum(1 for _, r in trail.decided.values() if r),
        "pending": sum(1 for _, r in trail.decided.values() if not r),
        "complete": complete,
        "worker_ready_s": round(ready_s, 2),
        "warmup_excluded": skip,
        "decisions_per_s": round(rate, 1) if rate else None,
        "decisions_per_s_from_ready": round(overall, 1) if overall else None,
        "per_second_min_median_max": [full[0], full[len(full) // 2], full[-1]] if full else None,
        "drain_s": round((ts[-1] - ts[0]) / 1000, 2) if ts else None,
        "worker_counters": counters,
    }
    if not complete:  # why it stopped deciding (the temporary directory is removed at exit)
        result["worker_log_tail"] = (tmp / name / "worker.log").read_text(errors="replace")[-3000:]
    if prof is not None:
        result["profile_top"] = _profile_summary(prof)
    return result


async def latency(bootstrap: str, tmp: Path, args) -> list[dict]:
    rates = [float(r) for r in args.rates.split(",") if r]
    if not rates:
        return []
    prefix, config, prof = await _fresh(bootstrap, tmp, "latency", 1_000_000, args, args.profile_latency)
    trail = Trail(bootstrap, prefix + "qm.workloads")
    worker = Worker(prefix, config, tmp / "latency" / "data", tmp / "latency" / "worker.log", prof)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=1)
    results = []
    try:
        await worker.wait_ready()
        await producer.start()
        await trail.start()
        base = 0
        for k, rate in enumerate(rates):
            tag = uuid.uuid4().hex[:6]
            duration = args.duration if k == 0 else args.duration_extra
            n = int(rate * duration)
            load_before = os.getloadavg()
            # encoding is strict (schema validation): do it before the clock starts
            subs = [submission(base + i, args.cohorts, args.queues, tag) for i in range(n)]
            fins = [finish(base + i, args.cohorts, args.queues, tag) for i in range(n)] if args.lifetime else []
            topic = prefix + "qm.workloads"
            loop = asyncio.get_running_loop()
            lags: list[float] = []
            start = loop.time() + 0.1
            wall0 = time.time() + 0.1
            pending_sends = []
            fin_at = args.lifetime * rate if args.lifetime else None
            for i in range(n):
                scheduled = start + i / rate
                delay = scheduled - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                lags.append(loop.time() - scheduled)
                ts_ms = int((wall0 + i / rate) * 1000)
                key, value = subs[i]
                pending_sends.append(await producer.send(topic, key=key, value=value, timestamp_ms=ts_ms))
                if fin_at is not None and i >= fin_at:
                    j = i - int(fin_at)
                    fkey, fvalue = fins[j]
                    pending_sends.append(await producer.send(topic, key=fkey, value=fvalue, timestamp_ms=ts_ms))
            send_wall = loop.time() - start
            await asyncio.gather(*pending_sends)
            uids = [f"{tag}-{base + i}" for i in range(n)]
            deadline = time.monotonic() + min(args.timeout, 30.0)
            while time.monotonic() < deadline and not all(u in trail.decided and u in trail.validated for u in uids):
                await asyncio.sleep(0.2)
            lat = sorted(trail.decided[u][0] - trail.validated[u] for u in uids if u in trail.decided and u in trail.validated)
            # Undecided workloads count as slower than every decided one (their latency is at
            # least the wait above): a percentile that lands among them is reported as None.
            ranked = lat + [float("inf")] * (n - len(lat))
            lag = sorted(lags)
            # By submission time, in 5 s slices: a latency that grows slice after slice means
            # the worker falls behind the rate; a flat one means a fixed per-decision delay.
            slices: dict[int, list[float]] = {}
            for i, u in enumerate(uids):
                if u in trail.decided and u in trail.validated:
                    slices.setdefault(int(i / rate // 5), []).append(trail.decided[u][0] - trail.validated[u])
            warm = sorted([v for k, vals in slices.items() if k >= 1 for v in vals]
                          + [float("inf")] * (n - len(lat)))
            by_slice = [{"from_s": k * 5, "decided": len(v), "p50_ms": _pct(sorted(v), 0.5),
                         "p99_ms": _pct(sorted(v), 0.99)} for k, v in sorted(slices.items())]
            results.append({
                "scenario": "latency/ample" + (f"+lifetime{args.lifetime:g}s" if args.lifetime else ""),
                "target_rps": rate,
                "duration_s": duration,
                "submissions": n,
                "achieved_rps": round(n / send_wall, 1),
                "decided": len(lat),
                "p50_ms": _finite(_pct(ranked, 0.50)),
                "p99_ms": _finite(_pct(ranked, 0.99)),
                "p999_ms": _finite(_pct(ranked, 0.999)),
                # Without the first 5 s (the worker's first sends fetch topic metadata, its
                # first cohort indexes are built): reported beside the whole run, never instead.
                "after_first_5s_p50_ms": _finite(_pct(warm, 0.50)) if warm else None,
                "after_first_5s_p99_ms": _finite(_pct(warm, 0.99)) if warm else None,
                "max_ms": _finite(ranked[-1]) if ranked else None,
                "decided_p99_ms": _pct(lat, 0.99),
                "send_lag_p99_ms": round(_pct(lag, 0.99) * 1000, 2) if lag else None,
                "by_5s_slice": by_slice,
                "load_before": load_before,
                "load_after": os.getloadavg(),
            })  # fmt: skip
            base += n
            if len(lat) < n:
                skipped = ",".join(f"{r:g}" for r in rates[k + 1 :])
                if skipped:
                    results[-1]["note"] = f"saturated ({len(lat)}/{n} decided {min(args.timeout, 30.0):g} s after the "
                    results[-1]["note"] += f"last send): higher rates {skipped} skipped"
                break
            await asyncio.sleep(1.0)
    finally:
        await producer.stop()
        worker.stop()
        await trail.stop()
    if prof is not None and results:
        results[0]["profile_top"] = _profile_summary(prof)
    return results


def _finite(value: float | None) -> float | None:
    return None if value is None or value == float("inf") else value


def _profile_summary(path: Path, top: int = 25) -> list[str]:
    if not path.exists():
        return ["(no profile written)"]
    kept = Path(tempfile.gettempdir()) / f"bench-queue-{path.parent.name}.prof"
    shutil.copy(path, kept)  # kept for `python -m pstats` after the temporary directory is gone
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    out.write("\n---- by own time ----\n")
    stats.sort_stats("tottime").print_stats(top)
    return [f"(full profile: {kept})", *out.getvalue().splitlines()]


def _machine() -> dict:
    return machine()  # the shared record (bench/common.py): cores, memory, versions, git commit


async def _bench(args, tmp: Path) -> dict:
    await wait_for_broker(args.bootstrap, timeout_s=10)
    results = []
    for name in args.scenarios.split(","):
        if name in ("ample", "half-wait"):
            results.append(await throughput(args.bootstrap, tmp, name, args))
            results[-1]["load_after"] = os.getloadavg()
    results.extend(await latency(args.bootstrap, tmp, args))
    return results


def main() -> int:
    p = argparse.ArgumentParser(
        description="Queue-manager decisions/s and decision latency on the local broker (issue 4).",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--bootstrap", default=os.environ.get("QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--scenarios", default="ample,half-wait",
                   help="throughput scenarios, comma-separated: ample, half-wait (empty: none)")
    p.add_argument("--submissions", type=int, default=20_000, help="backlog size per throughput scenario")
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of the first decisions excluded from the rate")
    p.add_argument("--cohorts", type=int, default=10)
    p.add_argument("--queues", type=int, default=10, help="ClusterQueues per cohort")
    p.add_argument("--rates", default="500,1000,2000",
                   help="open-loop submission rates for the latency run, comma-separated (empty: none)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds at the first rate")
    p.add_argument("--duration-extra", type=float, default=10.0, help="seconds at each further rate")
    p.add_argument("--lifetime", type=float, default=0.0,
                   help="latency run: each workload finishes this many seconds after submission (0: never)")
    p.add_argument("--timeout", type=float, default=40.0,
                   help="max seconds to wait for a throughput phase's decisions (latency: after the last send, max 30)")
    p.add_argument("--profile", action="store_true", help="run the throughput workers under cProfile")
    p.add_argument("--profile-latency", action="store_true", help="run the latency worker under cProfile")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "bench-queue.json"))
    args = p.parse_args()
    load_before = os.getloadavg()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="bench-queue-"))
    try:
        results = asyncio.run(_bench(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = {
        "benchmark": "queue-manager: Validated -> QuotaReserved|Pending on qm.workloads, one worker, local broker",
        "config": f"{args.cohorts} cohorts x {args.queues} ClusterQueues, 1 GPU flavor, 1-GPU workloads",
        "targets": {"decisions_per_s": ">= 2000", "p99_ms_at_500_per_s": "< 50"},
        "timing": "Kafka record timestamps (CreateTime) of the Validated and decision records, same host clock",
        "machine": _machine(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "wall_s": round(time.monotonic() - started, 1),
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    thr = [r for r in results if r["scenario"].startswith("throughput")]
    lat = [r for r in results if r["scenario"].startswith("latency")]
    if thr:
        print("| scenario | submissions | reserved | pending | decisions/s (steady) | from ready | per-second min/median/max | worker ready s |")
        print("|---|---|---|---|---|---|---|---|")
        for r in thr:
            print(f"| {r['scenario']} | {r['submissions']} | {r['reserved']} | {r['pending']} | {r['decisions_per_s']} | "
                  f"{r['decisions_per_s_from_ready']} | {r['per_second_min_median_max']} | {r['worker_ready_s']} |")  # fmt: skip
        print()
    if lat:
        print("| scenario | target/s | achieved/s | decided | p50 ms | p99 ms | p99.9 ms | max ms | after 5 s: p50 / p99 ms | send lag p99 ms | load 1m |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in lat:
            print(f"| {r['scenario']} | {r['target_rps']:.0f} | {r['achieved_rps']} | {r['decided']}/{r['submissions']} | "
                  f"{r['p50_ms']} | {r['p99_ms']} | {r['p999_ms']} | {r['max_ms']} | "
                  f"{r['after_first_5s_p50_ms']} / {r['after_first_5s_p99_ms']} | {r['send_lag_p99_ms']} | "
                  f"{r['load_after'][0]:.2f} |")  # fmt: skip
            if r.get("note"):
                print(f"| ({r['note']}) |||||||||| ")
        print()
    for r in results:
        if "worker_log_tail" in r:
            print(f"---- {r['scenario']} incomplete; end of the worker's log ----\n{r['worker_log_tail']}")
        if "profile_top" in r:
            print(f"---- cProfile of the {r['scenario']} worker ----")
            print("\n".join(r["profile_top"][:80]))
    print(f"load average before {load_before}, after {report['load_after']}; wall {report['wall_s']} s")
    print(f"written {args.out}")
    best = max((r["decisions_per_s"] or 0 for r in thr), default=None)
    at_500 = next((r for r in lat if r["target_rps"] == 500), None)
    if best is not None:
        print("target >= 2,000 decisions/s:", "met" if best >= 2000 else f"NOT met ({best})")
    if at_500 is not None:
        for label, p99 in (("whole run", at_500["p99_ms"]), ("after the first 5 s", at_500["after_first_5s_p99_ms"])):
            verdict = "met" if p99 is not None and p99 < 50 else f"NOT met ({p99} ms)"
            print(f"target p99 < 50 ms at 500/s, {label}:", verdict)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
