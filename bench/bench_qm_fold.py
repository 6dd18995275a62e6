"""bench-qm-fold: the queue-manager's fold over a recorded cohort stream, in process, without
Kafka, for telling two versions of the queue-manager's hot path apart.

The stream is the ``qm.workloads`` topic of a kept Kueue run (``bench/bench_kueue.py
--scenario smalls-phase --scale 0.1 --keep-topics`` prints nothing about it; the prefix is
``topic_prefix`` in its JSON). ``--record PREFIX`` reads that topic from the local broker once
and saves its records (keys and values, partition by partition) to ``--stream``; later runs
need no broker. Each run then does what the service does with every record, minus Kafka and
faust:

* decode: the record's envelopes, those of a type the fold reads validated and built
  (``envelopes_in``), the others passed over unvalidated;
* fold: ``fold.apply`` on its cohort's state, one state per key, skipping an event id the
  state has applied already (as ``ServiceRuntime.apply_once`` does);
* encode: the outputs, validated strictly and serialized (``encode``).

The fold decides afresh: its drains are the recorded drain_due's, so its decisions need not be
the recorded ones, only the same for every version that decides the same. The run prints CPU
seconds per phase, and a digest of every output's event type and event id: two versions whose
digests differ decide differently, and the comparison is void. `digest_without_pending` leaves
out the Pending messages, which say why a workload waits and change nothing else: two versions
that differ only in which waiting workloads they speak for have the same one (ADR 0077;
docs/benchmarks.md, "Each kind's share of the room").

This machine's speed moves by a third within minutes, so compare instruction counts, which do
not move (valgrind; the VM has no hardware counters), one tree at a time, and subtract a run
with ``--ways none`` (the stream read, nothing folded):

    valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python \\
        bench/bench_qm_fold.py --ways fold          # "I refs" is the count

(About 50 times slower than a plain run; ``--records N`` folds only the first N records.)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import hashlib
import pstats
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.adapters.kueue_config import KueueConfig  # noqa: E402
from services.contracts.codec import documents_of, encode, envelopes_in  # noqa: E402
from services.contracts.codec import epoch_of as epoch  # noqa: E402
from services.core.quota import load_objects  # noqa: E402
from services.queue_manager import state as fold  # noqa: E402
from services.sim.kueue_scenarios import DIAGNOSTIC, SCENARIOS, kueue_objects  # noqa: E402

DEFAULT_STREAM = Path.home() / ".cache" / "quartermaster" / "qm-fold-stream.jsonl"
FOLDED_TYPES = frozenset(t.EVENT_TYPE for t in fold.FOLDED)


async def record(prefix: str, stream: Path, bootstrap: str) -> int:
    """Save `prefix`qm.workloads, partition by partition in offset order, as JSON lines."""
    from services.adapters.bus import read_topic

    rows = [
        orjson.dumps({"partition": r.partition, "offset": r.offset, "key": (r.key or b"").decode(),
                      "value": base64.b64encode(r.value).decode()})
        async for r in read_topic(bootstrap, prefix + "qm.workloads", idle_timeout_s=2.0)
    ]
    stream.parent.mkdir(parents=True, exist_ok=True)
    stream.write_bytes(b"\n".join(rows) + b"\n")
    return len(rows)


def load_stream(stream: Path, limit: int | None) -> list[tuple[str, bytes, float]]:
    """(key, value, seconds after the stream's first event) per record, partition by partition."""
    rows = [orjson.loads(line) for line in stream.read_bytes().splitlines() if line]
    rows.sort(key=lambda r: (r["partition"], r["offset"]))
    records = [(r["key"], base64.b64decode(r["value"])) for r in rows[:limit]]
    times = [epoch(documents_of(value)[0]["occurred_at"]) for _, value in records]
    first = min(times, default=0.0)
    return [(key, value, at - first) for (key, value), at in zip(records, times, strict=True)]


def context_for(scenario_name: str, scale: float) -> fold.Context:
    """The queue-manager's context as bench_kueue runs it: the scenario's queues, the default
    requeue (a preempted workload at once, as Kueue's; ADR 0063), coalesced drains."""
    scenario = {**SCENARIOS, **DIAGNOSTIC}[scenario_name]
    scenario = scenario.scaled(scale) if scale < 1 else scenario
    config = KueueConfig.from_objects(load_objects(("bench", d) for d in kueue_objects(scenario)))
    return fold.Context(objects=config.objects, coalesce_drains=True, node_labels=config.node_labels())


def run(records: list[tuple[str, bytes, float]], context: fold.Context, ways: str, measure_after_s: float = 0.0,
        profile: cProfile.Profile | None = None, measure_until_s: float = float("inf")) -> dict:
    """Fold every record; count CPU (and profile) only for the records of events `measure_after_s`
    or more after the stream's first, so a late phase is measured with the state the records
    before it built."""
    states: dict[str, dict | None] = {}
    applied: dict[str, set[str]] = {}
    contexts = fold.KeyedContexts()
    digest = hashlib.sha256()
    decided = hashlib.sha256()  # the same without the Pending messages: what was admitted, evicted, asked
    seconds = {"decode": 0.0, "fold": 0.0, "encode": 0.0}
    folded = outputs_made = 0
    clock = time.process_time
    measured = 0
    for key, value, at in records:
        if ways == "none":
            continue
        measuring = measure_after_s <= at < measure_until_s
        if measuring:
            measured += 1
            if profile is not None:
                profile.enable()
        started = clock()
        envelopes = [e for _, _, e in envelopes_in(documents_of(value), FOLDED_TYPES) if e is not None]
        decoded = clock()
        seconds["decode"] += (decoded - started) * measuring
        for envelope in envelopes:
            if isinstance(envelope, Exception):
                raise envelope
            seen = applied.setdefault(key, set())
            if envelope.event_id in seen:
                continue
            seen.add(envelope.event_id)
            start_fold = clock()
            states[key], outputs = fold.apply(states.get(key), envelope, contexts.of(context, key))
            folded += measuring
            start_encode = clock()
            seconds["fold"] += (start_encode - start_fold) * measuring
            for output in outputs:
                encode(output.envelope)
                line = f"{output.envelope.event_type} {output.envelope.event_id}\n".encode()
                digest.update(line)
                if output.envelope.event_type != "workload.pending.v1":
                    decided.update(line)
            outputs_made += len(outputs) * measuring
            seconds["encode"] += (clock() - start_encode) * measuring
        if measuring and profile is not None:
            profile.disable()
    return {"records": len(records), "measured": measured, "folded": folded, "outputs": outputs_made,
            "digest": digest.hexdigest()[:16], "digest_without_pending": decided.hexdigest()[:16], **{f"{k}_cpu_s": round(v, 3) for k, v in seconds.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", metavar="PREFIX", help="save PREFIXqm.workloads from the broker to --stream first")
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--stream", type=Path, default=DEFAULT_STREAM, help=f"the saved stream (default {DEFAULT_STREAM})")
    parser.add_argument("--scenario", default="smalls-phase", choices=sorted({**SCENARIOS, **DIAGNOSTIC}),
                        help="the recorded run's scenario (its queues)")
    parser.add_argument("--scale", type=float, default=0.1, help="the recorded run's --scale (default 0.1)")
    parser.add_argument("--records", type=int, help="fold only the first N records")
    parser.add_argument("--ways", choices=("fold", "none"), default="fold",
                        help="none: read the stream and stop (the baseline to subtract from an instruction count)")
    parser.add_argument("--measure-after-s", type=float, default=0.0, metavar="S",
                        help="fold every record, but count CPU only for events S seconds or more after the first "
                             "(a late phase: at full scale the smalls-phase's smalls run from ~26 s)")
    parser.add_argument("--measure-until-s", type=float, default=float("inf"), metavar="S",
                        help="and only for events less than S seconds after the first (one phase of kueue-baseline: "
                             "its mediums run from ~60 to ~75 s)")
    parser.add_argument("--profile", type=int, default=0, metavar="K",
                        help="print the K costliest functions (cProfile) of the measured records")
    parser.add_argument("--profile-sort", default="cumulative", choices=["cumulative", "tottime", "ncalls"],
                        help="how --profile orders them: cumulative (default: the stack's costliest branches) "
                             "or tottime (where the time is spent itself)")
    args = parser.parse_args()
    if args.record:
        count = asyncio.run(record(args.record, args.stream, args.bootstrap))
        print(f"saved {count} records of {args.record}qm.workloads to {args.stream}")
    if not args.stream.exists():
        parser.error(f"{args.stream} does not exist: record a kept run's stream first with --record PREFIX "
                     "(bench/bench_kueue.py --scenario smalls-phase --scale 0.1 --keep-topics; "
                     "its JSON's topic_prefix)")
    records = load_stream(args.stream, args.records)
    context = context_for(args.scenario, args.scale)
    profile = cProfile.Profile() if args.profile else None
    result = run(records, context, args.ways, args.measure_after_s, profile, args.measure_until_s)
    print(orjson.dumps(result).decode())
    if profile is not None:
        pstats.Stats(profile).sort_stats(args.profile_sort).print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
