"""What the full-stack benchmarks share: the machine record, the JSON result file, the stack of
four service processes on fresh topics, peak memory, consumer-group lag, progress lines.

Every result JSON carries ``machine`` (cores, memory, Python/faust/aiokafka/Kafka versions, git
commit and whether the tree is dirty), ``load_before``/``load_after`` (the machine is shared:
read the figures next to the load) and ``summary_rows``: the rows ``bench/summary.py`` prints
in the markdown table (figure, measured, anchor, target, met).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient  # noqa: E402

from services.adapters import bus  # noqa: E402
from services.adapters.bus import create_topics  # noqa: E402
from services.contracts.codec import documents_of  # noqa: E402
from services.demo.stack import SERVICES, Stack, free_base_port, service_nice  # noqa: E402

RESULTS = ROOT / "bench" / "results"
BOOTSTRAP = os.environ.get("QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092")


# -- the record of where and on what a figure was measured ---------------------------------


def _git(*args: str, strip: bool = True) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout
        return out.strip() if strip else out
    except (OSError, subprocess.TimeoutExpired):
        return ""


def kafka_version() -> str | None:
    """The broker version deploy/kafka runs (its pom pins the jars)."""
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", (ROOT / "deploy/kafka/pom.xml").read_text())
    return match.group(1) if match else None


def machine() -> dict[str, Any]:
    mem = None
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem = round(int(line.split()[1]) / 2**20, 1)
    dirty = _git("status", "--porcelain", strip=False)  # unstripped: each line's status columns lead it
    return {
        "cpus": os.cpu_count(),
        "memory_gib": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "faust": version("faust-streaming"),
        "aiokafka": version("aiokafka"),
        "orjson": version("orjson"),
        "kafka": kafka_version(),
        "git_commit": _git("rev-parse", "HEAD") or None,
        "git_dirty": bool(dirty.strip()),
        "git_dirty_paths": [line[3:] for line in dirty.splitlines()][:40],
        # which uncommitted edits the run saw (the same diff gives the same digest)
        "git_diff_sha256": hashlib.sha256(_git("diff", "HEAD").encode()).hexdigest()[:16] if dirty else None,
        # the settings the services ran with, where they differ from the defaults
        "settings": {k: v for k, v in sorted(os.environ.items()) if k.startswith("QM_")},
        "nice": {service: service_nice(service) for service in SERVICES},  # ADR 0022, ADR 0029
        "calibration_s": calibration_s(),  # lower is faster: read figures of different days next to it
    }


def calibration_s(runs: int = 3) -> float:
    """Seconds this machine takes, now, for a fixed piece of pure-Python work like the services'
    own (JSON envelopes in and out, dicts): the best of `runs`. The same commit's wall time moved
    by 10-20% between days, and by up to 2x within one morning (the unit tests took ~10 s in stop
    27's session and 19 s at the start of stop 28's), so a figure is read next to this, and
    compared only with runs of one session."""
    envelope = {"event_id": "e" * 32, "event_type": "workload.validated.v1", "occurred_at": "2026-12-03T10:00:00Z",
                "payload": {"uid": "u" * 36, "namespace": "team-a", "pod_sets": [{"count": 1, "requests": {"cpu": 1000}}]}}
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        folded: dict[str, int] = {}
        for i in range(20_000):
            document = json.loads(json.dumps(envelope))
            key = f"{document['payload']['namespace']}-{i % 97}"
            folded[key] = folded.get(key, 0) + document["payload"]["pod_sets"][0]["requests"]["cpu"]
        best = min(best, time.perf_counter() - started)
    return round(best, 3)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_result(name: str, report: dict[str, Any], out: str | Path | None = None) -> Path:
    """bench/results/<name>.json (or ``out``), with the machine record added (pass the one taken
    at the start as ``report["machine"]``: the commit can move while a long run goes on)."""
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # the record taken when the run started (services load the code then), else now
    report = {"benchmark": name, **report, "machine": report.get("machine") or machine()}
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path


def row(figure: str, measured: Any, anchor: Any, target: Any, met: bool | None, note: str = "") -> dict[str, Any]:
    """One line of the summary table. ``met`` None: no target, or not comparable at this scale."""
    return {"figure": figure, "measured": measured, "anchor": anchor, "target": target, "met": met, "note": note}


def print_rows(rows: list[dict[str, Any]]) -> None:
    print("| figure | measured | Kueue / anchor | target | met? |")
    print("|---|---|---|---|---|")
    for r in rows:
        met = {True: "yes", False: "**no**", None: "n/a"}[r["met"]]
        note = f" ({r['note']})" if r.get("note") else ""
        print(f"| {r['figure']} | {r['measured']} | {r['anchor']} | {r['target']} | {met}{note} |")


def pct(sorted_values: list[float], p: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


class Progress:
    """A progress line on stderr at most every ``every_s`` seconds (stdout stays the result)."""

    def __init__(self, label: str, every_s: float = 5.0) -> None:
        self.label, self.every_s = label, every_s
        self.started = time.monotonic()
        self._last = 0.0

    def __call__(self, message: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= self.every_s:
            self._last = now
            print(f"[{self.label} {now - self.started:6.1f}s] {message}", file=sys.stderr, flush=True)


# -- memory -----------------------------------------------------------------------------------


def vm_hwm_mib(pid: int) -> float | None:
    """Peak resident memory of a live process (VmHWM), MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _stat_cpu_s(stat: str) -> float:
    """User + system seconds from a /proc .../stat line (after the name, which may hold ")")."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, *, digits: int | None = 1) -> float | None:
    """User + system CPU time a live process has used so far (seconds; unrounded: digits=None)."""
    try:
        seconds = _stat_cpu_s(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None
    return seconds if digits is None else round(seconds, digits)


BROKER_LABEL = "broker (kafka)"


def broker_pid() -> int | None:
    """The local broker's pid, from deploy/kafka/kafka.sh's pid file (None: another broker)."""
    cache = Path(os.environ.get("QM_CACHE", Path.home() / ".cache" / "quartermaster"))
    pid_file = Path(os.environ.get("QM_KAFKA_HOME", cache / "kafka-run")) / "broker.pid"
    try:
        pid = int(pid_file.read_text().strip())
        alive = "kafka" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except (OSError, ValueError):
        return None
    return pid if alive else None


def compiler_cpu_s(pid: int | None, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds the JVM's JIT compiler threads ("C1/C2 CompilerThread") of `pid` have used
    (None: no such process). A thread's name is cut at 15 characters in /proc."""
    if pid is None:
        return None
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return None
    total = 0.0
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        if "CompilerThre" in stat[stat.index("(") + 1 : stat.rindex(")")]:
            total += _stat_cpu_s(stat)
    return total


def own_cpu_s() -> float:
    """CPU seconds this process (the load generator / simulator) has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return round(usage.ru_utime + usage.ru_stime, 1)


def own_peak_mib() -> float:
    """This process's peak resident memory (ru_maxrss is KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


# -- the stack --------------------------------------------------------------------------------


@dataclass
class BenchStack:
    """Fresh prefixed topics, a config directory, and the four services as processes
    (services/demo/stack.py), each in its own consumer group for this run only.

    ``env`` adds to (or overrides) the demo's settings. Use as ``async with``; on exit the
    services' peak memory is read (``peak_mib``) before they are stopped, and this run's
    topics are deleted unless ``keep_topics``."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    bootstrap: str = BOOTSTRAP
    keep_topics: bool = False
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    peak_mib: dict[str, float | None] = field(default_factory=dict)
    cpu_s: dict[str, float | None] = field(default_factory=dict)
    ready_s: float | None = None
    broker_cpu_at_start: float | None = None  # the local broker's CPU seconds when the services started
    broker_jit_at_start: float | None = None  # ... and its JIT compiler threads' (ADR 0043)
    broker_jit_cpu_s: float | None = None  # what the broker spent compiling during the run
    # every second from the services' start: each process's CPU in that second, % of one core
    cpu_timeline: list[dict[str, float]] = field(default_factory=list)
    timeline_since: float | None = None  # time.monotonic() at cpu_timeline's 0 s
    # every second, at the same at_s: each process's agents' qm_batch_seconds sums so far
    # ({topic: {step: s}}), how busy each agent's one-batch-at-a-time loop was
    loop_timeline: list[dict[str, Any]] = field(default_factory=list)
    _sampler: asyncio.Task[None] | None = field(default=None, init=False, repr=False)  # fills cpu_timeline

    def __post_init__(self) -> None:
        self.prefix = f"bench-{self.run}."
        self.suffix = f"-bench-{self.run}"
        self.run_dir = Path(f"/tmp/quartermaster-{self.name}-{self.run}")
        self.config_dir = self.run_dir / "config"
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self.stack: Stack | None = None

    def service_env(self) -> dict[str, str]:
        return {
            "QM_KAFKA_BOOTSTRAP": self.bootstrap, "QM_TOPIC_PREFIX": self.prefix, "QM_APP_ID_SUFFIX": self.suffix,
            "QM_CONFIG_DIR": str(self.config_dir), "QM_POLICY_DIR": str(ROOT / "policies" / "library"),
            "QM_STORE": os.environ.get("QM_STORE", "memory://"), "QM_DATA_DIR": str(self.run_dir / "data"), "QM_LOG_LEVEL": "warning",
            **self.env,
        }  # fmt: skip

    async def create_topics(self) -> None:
        await create_topics(self.bootstrap, self.prefix)

    async def start(self) -> None:
        """Start the four services and wait until each answers /readyz."""
        self.stack = Stack(self.run_dir, self.service_env(), base_port=free_base_port())
        pid = broker_pid()
        self.broker_cpu_at_start = cpu_seconds(pid) if pid else None
        self.broker_jit_at_start = compiler_cpu_s(pid)
        started = self.timeline_since = time.monotonic()
        self.stack.start()
        self._sampler = asyncio.create_task(self._sample_cpu(started))
        await asyncio.to_thread(self.stack.wait_ready, 120)
        self.ready_s = round(time.monotonic() - started, 1)

    async def _sample_cpu(self, started: float, every_s: float = 1.0) -> None:
        """Fill ``cpu_timeline``: which process had the cores when. Totals alone hid that in
        kueue-baseline's last phases the two cores were full and the queue-manager had ~55% of one.
        The processes are the ones running when it starts (the services are started before)."""
        pids = {**self.pids(), "bench": os.getpid()}
        broker = broker_pid()
        if broker:
            pids[BROKER_LABEL] = broker
        before = {label: cpu_seconds(pid, digits=None) for label, pid in pids.items()}
        last = time.monotonic()
        while True:
            await asyncio.sleep(every_s)
            now = {label: cpu_seconds(pid, digits=None) for label, pid in pids.items()}
            at = time.monotonic()
            # over the time that really passed: a busy loop wakes this sampler late
            sample: dict[str, float] = {"at_s": round(at - started, 1)}
            for label, used in now.items():
                if used is not None and before.get(label) is not None:
                    sample[label] = round(100 * (used - before[label]) / (at - last))
            self.cpu_timeline.append(sample)
            if self.stack is not None:
                loops = await asyncio.to_thread(self._batch_seconds_now)
                self.loop_timeline.append({"at_s": sample["at_s"], **loops})
            before, last = now, at

    def _batch_seconds_now(self) -> dict[str, dict[str, dict[str, float]]]:
        """Every process's qm_batch_seconds sums, read from its /metrics."""
        assert self.stack is not None
        out = {}
        for name, _ in self.stack.instances():
            sums = batch_seconds_of(self.stack.port(name))
            if sums:
                out[name] = sums
        return out

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in (self.stack.processes.items() if self.stack else ())}

    def read_peak_memory(self) -> dict[str, float | None]:
        """Peak memory (VmHWM) of each live service, and the CPU seconds it has used (``cpu_s``);
        the local broker's CPU since the services started too (it shares the machine's cores)."""
        for service, pid in self.pids().items():
            value = vm_hwm_mib(pid)
            if value is not None:
                self.peak_mib[service] = value
                self.cpu_s[service] = cpu_seconds(pid)
        pid = broker_pid()
        now = cpu_seconds(pid) if pid else None
        if now is not None and self.broker_cpu_at_start is not None:
            self.cpu_s[BROKER_LABEL] = round(now - self.broker_cpu_at_start, 1)
        jit = compiler_cpu_s(pid)
        if jit is not None and self.broker_jit_at_start is not None:
            self.broker_jit_cpu_s = round(jit - self.broker_jit_at_start, 1)
        return self.peak_mib

    def exited(self) -> dict[str, dict[str, Any]]:
        """Services whose process has ended, with its exit code and the first error it logged."""
        out = {}
        for service, process in (self.stack.processes.items() if self.stack else ()):
            if process.poll() is not None:
                out[service] = {"exit_code": process.returncode, "first_error": first_error(
                    self.run_dir / f"{service}.log"), "log": str(self.run_dir / f"{service}.log")}
        return out

    def groups(self, services: Iterable[str]) -> list[str]:
        """Every consumer group of these services (admission has two: ADR 0026)."""
        return list(self.reads(services))

    def reads(self, services: Iterable[str]) -> dict[str, list[str]]:
        """Each consumer group of these services -> the topics it reads, with this stack's prefix."""
        return {f"qm-{s}{self.suffix}{lane}": [self.prefix + t for t in topics]
                for s in services for lane, topics in SERVICE_INPUTS[s].items()}

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self.stack is not None:
            self.read_peak_memory()
            await asyncio.to_thread(self.stack.stop)
        if not self.keep_topics:
            await delete_topics(self.bootstrap, lambda t: t.startswith(self.prefix) or self.suffix in t)
        shutil.rmtree(self.run_dir / "data", ignore_errors=True)

    async def __aenter__(self) -> BenchStack:
        await self.create_topics()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def first_error(log: Path) -> str | None:
    """Why a service stopped: the first line saying a component crashed, else the first ERROR
    line of its log (faust's and ours), shortened."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    errors = [line for line in lines if "[ERROR]" in line or '"level": "error"' in line]
    crashed = [line for line in errors if "Crashed reason=" in line and "CancelledError" not in line]
    picked = crashed or errors
    return picked[0][:400] if picked else None


async def delete_topics(bootstrap: str, mine) -> list[str]:
    """Delete this run's own topics (``mine(name)`` true), nothing else."""
    try:
        return await bus.delete_topics(bootstrap, mine)
    except Exception as error:  # noqa: BLE001 - cleanup must not hide the result
        print(f"(could not delete this run's topics: {error})", file=sys.stderr)
        return []


async def group_lag(bootstrap: str, groups: list[str]) -> dict[str, dict[str, int] | None]:
    """Per consumer group and input topic: records not yet committed (end − committed offset).
    None for a group that has committed nothing yet."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        lags: dict[str, dict[str, int] | None] = {}
        for group in groups:
            committed = await admin.list_consumer_group_offsets(group)
            tps = [tp for tp in committed if not tp.topic.endswith("-changelog")]
            if not tps:
                lags[group] = None
                continue
            ends = await consumer.end_offsets(tps)
            per: dict[str, int] = {}
            for tp in tps:
                per[tp.topic] = per.get(tp.topic, 0) + max(0, ends[tp] - committed[tp].offset)
            lags[group] = per
        return lags
    finally:
        await consumer.stop()
        await admin.close()


async def committed_total(bootstrap: str, groups: list[str]) -> int:
    """The sum of every committed offset of these groups: it grows while any of them works."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        total = 0
        for group in groups:
            total += sum(o.offset for o in (await admin.list_consumer_group_offsets(group)).values())
        return total
    finally:
        await admin.close()


async def topic_end_offsets(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """Records written to each topic so far (sum of partition end offsets)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        out = {}
        for topic in topics:
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            out[topic] = sum((await consumer.end_offsets(tps)).values()) if tps else 0
        return out
    finally:
        await consumer.stop()


# The topics each service's consumer group reads (topics.yaml names). Only asked about a group
# that has committed nothing: it is drained when these are all still empty (the preemption
# service reads only qm.preemption, and a replay without preemption writes none).
SERVICE_INPUTS = {
    "admission": {"": ("qm.cluster",), "-facts": ("qm.cluster",)},  # its faust agent, its fact lane
    "queue-manager": {"": ("qm.workloads", "qm.clock")},
    "preemption": {"": ("qm.preemption",)},
    "cost-accounting": {"": ("qm.workloads", "qm.billing")},
}


async def _nothing_to_read(bootstrap: str, lags: dict[str, Any], reads: dict[str, list[str]]) -> dict[str, Any]:
    """``lags`` with {} for each group that has committed nothing and whose topics are all empty."""
    idle = [g for g, per in lags.items() if per is None and reads.get(g)]
    if not idle:
        return lags
    ends = await topic_end_offsets(bootstrap, sorted({t for g in idle for t in reads[g]}))
    return {g: ({} if g in idle and not any(ends[t] for t in reads[g]) else per) for g, per in lags.items()}


async def wait_drained(bootstrap: str, groups: list[str], timeout_s: float, progress: Progress | None = None,
                       poll_s: float = 2.0, stall_s: float = 30.0, stack: BenchStack | None = None,
                       ignore: tuple[str, ...] = (), reads: dict[str, list[str]] | None = None,
                       note_without: tuple[str, ...] = ()) -> dict[str, Any]:
    """Wait until every group has committed everything it reads (twice in a row: faust commits
    every few seconds), or until what is left has not moved for ``stall_s`` (a stalled agent:
    waiting longer would not help), a service of ``stack`` exiting, or the timeout. Topics
    ending with one of ``ignore`` do not count. ``reads``: group -> the topics it reads, so a
    group that has committed nothing because they are empty counts as drained. Returns
    drained, stalled topics, last lags (and ``exited`` services), and ``drained_without_at``:
    the ``time.monotonic()`` at which everything but the topics ending with one of
    ``note_without`` was committed by the same rule (None: not yet, or not asked)."""
    deadline = time.monotonic() + timeout_s
    calm, last, since = 0, None, time.monotonic()
    calm_without, drained_without_at = 0, None
    lags: dict[str, Any] = {}

    def result(**figures: Any) -> dict[str, Any]:
        return {**figures, "drained_without_at": drained_without_at}

    while time.monotonic() < deadline:
        if stack is not None and stack.exited():
            return result(drained=False, stalled={}, lags=await group_lag(bootstrap, groups), exited=stack.exited())
        lags = await _nothing_to_read(bootstrap, await group_lag(bootstrap, groups), reads or {})
        left = {f"{g} {t}": n for g, per in lags.items()
                for t, n in (per if per is not None else {"(nothing committed)": -1}).items()
                if n and not t.endswith(ignore)}
        calm = calm + 1 if not left else 0
        if note_without and drained_without_at is None:
            calm_without = calm_without + 1 if not any(not k.endswith(note_without) for k in left) else 0
            if calm_without >= 2:
                drained_without_at = time.monotonic()
        if calm >= 2:
            return result(drained=True, stalled={}, lags=lags)
        if left != last:
            last, since = left, time.monotonic()
        elif time.monotonic() - since >= stall_s:
            return result(drained=False, stalled=left, lags=lags)
        if progress:
            progress(f"draining: not yet committed {left}")
        await asyncio.sleep(poll_s)
    return result(drained=False, stalled={}, lags=lags, timed_out=True)


def scale_arg(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError("scale must be in (0, 1]")
    return value


# -- profiling (py-spy, sampling the live processes) ------------------------------------------


class PySpy:
    """``py-spy record`` against running pids; ``stop()`` returns, per label, the functions with
    the largest share of samples (own time, and inclusive) from the collapsed stacks."""

    def __init__(self, out_dir: Path, rate: int = 50) -> None:
        self.out_dir, self.rate = out_dir, rate
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        out_dir.mkdir(parents=True, exist_ok=True)

    def start(self, label: str, pid: int) -> None:
        exe = Path(sys.executable).with_name("py-spy")
        if not exe.exists():
            print("(py-spy not found next to the interpreter: no profile)", file=sys.stderr)
            return
        out = self.out_dir / f"{label}.collapsed"
        # --nonblocking: sample without pausing the service, so the figures stay close to unprofiled ones.
        proc = subprocess.Popen([str(exe), "record", "--pid", str(pid), "--format", "raw", "--rate", str(self.rate),
                                 "--nonblocking", "--output", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        self.procs[label] = (proc, out)

    def stop(self, top: int = 15) -> dict[str, dict[str, Any]]:
        summaries = {}
        for label, (proc, out) in self.procs.items():
            proc.send_signal(2)  # SIGINT: py-spy writes its file and exits
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            summaries[label] = summarize_collapsed(out, top) if out.exists() else {"error": "no samples written"}
        return summaries


def summarize_collapsed(path: Path, top: int = 15) -> dict[str, Any]:
    """Collapsed stacks ("f1;f2;f3 count" per line) → the share of samples (%) spent idle in
    the event loop's select (waiting for the broker), the top functions by own samples, and
    the top functions of our own code (services/) by inclusive samples."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]  # one entry per function, not per line
        if frames[-1].startswith("EpollSelector.select"):
            idle += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            if "(services/" in frame and "ServiceRuntime.main" not in frame and "<module>" not in frame:
                inclusive[frame] = inclusive.get(frame, 0) + count

    def ranked(counts: dict[str, int]) -> list[list[Any]]:
        return [[f, round(100 * c / total, 1)] for f, c in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": total, "file": str(path), "idle_in_select_pct": round(100 * idle / total, 1) if total else None,
            "own_pct": ranked(own) if total else [], "services_inclusive_pct": ranked(inclusive) if total else []}


def stop_on_signals() -> None:
    """SIGTERM / SIGINT cancel the running benchmark, so its ``async with BenchStack`` still
    stops the services and deletes the run's topics (a background job ignores SIGINT, and a
    plain SIGTERM would leave four service processes behind)."""
    import signal

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)


_BATCH_SUM = re.compile(r'^qm_batch_seconds_sum\{(?=[^}]*topic="([^"]*)")(?=[^}]*step="([^"]*)")[^}]*\} (\S+)$',
                        re.MULTILINE)


def batch_seconds_of(port: int) -> dict[str, dict[str, float]]:
    """A service's qm_batch_seconds sums ({topic: {step: seconds}}) from its /metrics, {} if it
    does not answer. It asks for this series alone (`name[]`): a queue-manager with a thousand
    ClusterQueues would otherwise render all of theirs every second, on the CPU the benchmark
    measures."""
    try:
        query = urllib.parse.urlencode({"name[]": "qm_batch_seconds_sum"})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?{query}", timeout=1) as response:
            return batch_seconds_in(response.read().decode())
    except (OSError, ValueError):
        return {}


def batch_seconds_in(text: str) -> dict[str, dict[str, float]]:
    """The qm_batch_seconds sums of a Prometheus text exposition, {topic: {step: seconds}}."""
    out: dict[str, dict[str, float]] = {}
    for topic, step, value in _BATCH_SUM.findall(text):
        out.setdefault(topic, {})[step] = float(value)
    return out


def envelope_values(value: bytes) -> list[bytes]:
    """The envelopes a record carries, each as its own JSON: one, or a bundle's (ADR 0034)."""
    if value[:1] != b"[":
        return [value]
    return [orjson.dumps(document) for document in documents_of(value)]


def one_per_envelope(records: list[Any]) -> list[Any]:
    """Records as read, with each bundle replaced by one record per envelope (same key, partition,
    offset and timestamp), for figures that count envelopes."""
    out: list[Any] = []
    for record in records:
        if record.value[:1] != b"[":
            out.append(record)
            continue
        out.extend(SimpleNamespace(topic=record.topic, partition=record.partition, offset=record.offset,
                                   timestamp=record.timestamp, key=record.key, value=value)
                   for value in envelope_values(record.value))
    return out


async def read_records(bootstrap: str, topic: str) -> list[Any]:
    """Every record of a topic up to its end offsets now (aiokafka ConsumerRecords, with their
    timestamps), read without a consumer group. For the figures after a run."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                                fetch_max_bytes=32 * 2**20, max_partition_fetch_bytes=8 * 2**20)  # fmt: skip
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not tps:
            return []
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if end[tp] > 0}
        out: list[Any] = []
        quiet = 0
        while remaining and quiet < 3:  # compaction or markers can leave the end past the last record
            batch = await consumer.getmany(*remaining, timeout_ms=1000, max_records=10_000)
            quiet = 0 if batch else quiet + 1
            for tp, records in batch.items():
                out.extend(r for r in records if r.offset < end[tp])
                if records and records[-1].offset + 1 >= end[tp]:
                    remaining.discard(tp)
        return out
    finally:
        await consumer.stop()


def run_figures(stack: BenchStack, started: float, at_start: dict, load_before: list[float]) -> dict[str, Any]:
    """What every full-stack result records about its run: wall, machine, load, where its logs are."""
    return {
        "bench_wall_s": round(time.monotonic() - started, 1),
        "machine": at_start,
        "load_before": load_before,
        "load_after": load(),
        "topic_prefix": stack.prefix,
        "logs": str(stack.run_dir),
    }


def process_figures(stack: BenchStack, own_label: str) -> dict[str, Any]:
    """Per process over the run: when each service was ready, the CPU it used, its peak memory."""
    return {
        "services_ready_s": stack.ready_s,
        "cpu_seconds": {**stack.cpu_s, own_label: own_cpu_s()},
        "peak_memory_mib": {**stack.peak_mib, own_label: own_peak_mib()},
        # the broker's JIT compiling during the run: a few CPU-s when warm, ~14+ just started (ADR 0043)
        "broker_jit_cpu_s": stack.broker_jit_cpu_s,
        # per second, each process's % of one core ("bench": this process, the load generator)
        "cpu_timeline": stack.cpu_timeline,
    }


class CollectorClock:
    """Time this process spends in the cyclic garbage collector while inside ``with``, and how
    many collections of each generation it ran (gc.callbacks): the load generator's own pauses,
    which the services share the cores with."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._began: float | None = None

    def __enter__(self) -> CollectorClock:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.seconds += time.perf_counter() - self._began
            self.collections[info["generation"]] += 1
            self._began = None

    def figures(self) -> dict[str, Any]:
        return {"s": round(self.seconds, 2), "collections_by_generation": list(self.collections),
                "thresholds": list(gc.get_threshold())}


JIT_WARNING_CPU_S = 5.0  # a warm broker compiles 1–4 CPU-s in a run; one just started 14+


def jit_note(result: dict[str, Any]) -> str:
    """A line saying the broker was still compiling during this run, if it was (ADR 0043)."""
    jit = result.get("broker_jit_cpu_s")
    if jit is None or jit < JIT_WARNING_CPU_S:
        return ""
    return (f"NOTE: the broker spent {jit} CPU-s compiling its hot paths (a JVM just started), CPU the services "
            "did not get; warm it first (`make bench-warmup`, or any run) to measure Quartermaster, not the JIT")


def add_run_options(parser: argparse.ArgumentParser, *, profile: bool = True) -> None:
    if profile:
        parser.add_argument("--profile", action="store_true", help="sample every service with py-spy during the run")
        parser.add_argument("--profile-dir", default="/tmp/quartermaster-bench-profiles")
    parser.add_argument("--keep-topics", action="store_true", help="keep this run's topics on the broker afterwards")


def run_cli(main_async: Callable[[argparse.Namespace], Awaitable[int]], parser: argparse.ArgumentParser) -> int:
    """Run a benchmark; a signal stops it cleanly (stop_on_signals) and says so."""
    args = parser.parse_args()
    try:
        return asyncio.run(main_async(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        kept = "kept (--keep-topics)" if getattr(args, "keep_topics", False) else "deleted"
        print(f"interrupted by a signal: services stopped, this run's topics {kept}, no result written",
              file=sys.stderr)
        return 130
