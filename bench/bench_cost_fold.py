"""bench-cost-fold: the cost service's fold (``CohortLedger.step``) over the Alibaba trace, in
process, without Kafka: an in-memory dict is the ledger table (as ``fold_cohorts`` uses it).

Two streams, both the ``qm.workloads`` records ``services/cost_accounting/trace_events.py``
makes from the trace's pods (reservation, pod running, workload running, finishes, hourly
clock ticks per cohort key):

* ``replay`` — shaped like bench_replay's cost input: two cohort keys (``cohort:research``,
  ``cohort:product``, as services/sim/config.py assigns the team namespaces), one tick per
  cohort and trace hour, and the correction horizon bench_replay configures (366 days), so a
  book keeps every hour it billed (no horizon pruning within the trace);
* ``default`` — one cohort key per team namespace and the default 168-hour horizon.

Each stream is folded two ways, alternating (A/B in one process: the machine is shared,
compare the ratio, not the absolute figures):

* ``per-event`` — every book a step hands over is joined into its text at once (what the
  service did before: each event that touched a book copied every hour of its text);
* ``per-batch`` — the books are joined once per batch of ``--batch`` records, for the values
  the batch stores (what the service does: ``cohort.BookText``, joined at the commit).

Both must give the same outputs (row ids, amounts, order) and the same stored records, or
the benchmark fails. Prints one line per run and a summary per stream.

    .venv/bin/python bench/bench_cost_fold.py      # replay: 500 pods, 2,000 hours; default: all pods
    .venv/bin/python bench/bench_cost_fold.py --stream replay --pods 8152 --hours 0 --rounds 1

This machine's speed moves by a third within minutes, so two versions of the fold are best told
apart by the instructions they execute, which do not move (valgrind; the VM has no hardware
counters for perf). Count one way at a time, and once with ``--ways none`` (the trace read and
the stream built, no fold) to subtract:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python \
        bench/bench_cost_fold.py --stream replay --pods 3000 --hours 2500 --rounds 1 --ways per-batch

(About 50 times slower than the plain run; "I refs" is the count.)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from services.contracts.codec import Envelope, make_envelope  # noqa: E402
from services.contracts.events import ClockTick  # noqa: E402
from services.core.cost.units import iso_utc  # noqa: E402
from services.cost_accounting import cohort  # noqa: E402
from services.cost_accounting.config import CostConfig, config_from_documents  # noqa: E402
from services.cost_accounting.trace_events import trace_envelopes, trace_labels  # noqa: E402
from services.cost_accounting.translate import at_ms  # noqa: E402
from services.sim.config import cohort_for  # noqa: E402
from services.trace import lifecycle_events, read_pods, synthetic_pods  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
REPLAY_HORIZON_HOURS = 24 * 366  # bench_replay.write_config
REPLAY_CLOSE_DELAY_HOURS = 833  # bench_replay's closeDelaySeconds with --settle: 10 s x 300,000


#: records per batch of the per-batch way (the service's batches take up to QM_BATCH_SIZE)
BATCH = 100


def config(horizon_hours: int | None, close_delay_hours: int = 0) -> CostConfig:
    docs = list(yaml.safe_load_all((ROOT / "examples" / "seed" / "pricelist.yaml").read_text()))
    for doc in docs:
        if doc.get("kind") == "CostSettings" and horizon_hours is not None:
            doc["spec"]["correctionHorizonHours"] = horizon_hours
        if doc.get("kind") == "CostSettings" and close_delay_hours:
            doc["spec"]["closeDelaySeconds"] = close_delay_hours * 3600
    return config_from_documents(("seed", doc) for doc in docs)


def settle_ticks(records: list[tuple[str, Envelope]], hours: int) -> list[tuple[str, Envelope]]:
    """Hourly ticks per cohort key for ``hours`` + 1 hours after the stream's last event, so that
    with a close delay of ``hours`` every hour closes (bench_replay's --settle)."""
    if not hours or not records:
        return []
    last_ms = max(at_ms(e.occurred_at) for _, e in records)
    keys = sorted({key for key, _ in records})
    return [
        (key, make_envelope(ClockTick(at=iso_utc(at), source="bench"), producer="bench", occurred_at=iso_utc(at),
                            identity=("settle", key, at)))
        for at in range(last_ms - last_ms % 3_600_000 + 3_600_000, last_ms + (hours + 2) * 3_600_000, 3_600_000)
        for key in keys
    ]


def stream(name: str, pods, hours: int | None = None) -> list[tuple[str, Envelope]]:
    """``(cohort key, envelope)`` in the order the service reads them; ``hours``: only the first
    hours of trace time."""
    records = [(key, e) for topic, key, e in trace_envelopes(lifecycle_events(pods)) if topic == "qm.workloads"]
    if hours is not None and records:
        end_ms = at_ms(records[0][1].occurred_at) + hours * 3_600_000
        records = [(key, e) for key, e in records if at_ms(e.occurred_at) <= end_ms]
    if name == "default":
        return records
    out: list[tuple[str, Envelope]] = []
    ticked: set[tuple[str, str]] = set()
    for _, e in records:
        if e.event_type != "clock.tick.v1":
            out.append((f"cohort:{cohort_for(e.payload.namespace)}", e))
            continue
        for key in ("cohort:research", "cohort:product"):  # the queue-manager's fan-out per cohort key
            if (key, e.occurred_at) not in ticked:
                ticked.add((key, e.occurred_at))
                out.append((key, dataclasses.replace(e, event_id=f"{e.event_id}:{key}")))
    return out


def fold(cfg: CostConfig, records: list[tuple[str, Envelope]], per_batch: bool, batch: int = BATCH
         ) -> tuple[float, list, dict]:
    ledger = cohort.CohortLedger(cfg, labels=trace_labels().get)
    store: dict = {}
    outputs: list = []
    staged: dict = {}
    gc.collect()
    started = time.perf_counter()
    for offset, (key, envelope) in enumerate(records):
        result = ledger.step(key, store, envelope, (0, offset))
        if result is not None:
            writes, produced = result
            if per_batch:
                store.update(writes)  # staged as handed over: a reload reads them as they are
                staged.update(writes)
            else:
                store.update(cohort.stored_records(writes))
            outputs.extend(produced)
        if per_batch and (offset + 1) % batch == 0:  # the batch's commit: its values are stored
            store.update(cohort.stored_records(staged))
            staged.clear()
    store.update(cohort.stored_records(staged))
    return time.perf_counter() - started, outputs, store


WAYS = ("per-event", "per-batch")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stream", choices=("replay", "default", "both"), default="both")
    p.add_argument("--pods", type=int, default=500, help="first N pods of the trace for the replay stream (default 500)")
    p.add_argument("--hours", type=int, default=2000,
                   help="first N trace hours of the replay stream (default 2000; 0: all ~3,585, where the "
                        "json-dumps runs take minutes: a book keeps every hour, so their cost grows with hours squared)")
    p.add_argument("--default-pods", type=int, default=0, help="first N pods for the default stream (0: all)")
    p.add_argument("--rounds", type=int, default=2, help="A/B rounds (each round runs both ways, order alternating)")
    p.add_argument("--batch", type=int, default=BATCH, help=f"records per batch of the per-batch way (default {BATCH})")
    p.add_argument("--ways", choices=(*WAYS, "both", "none"), default="both",
                   help="fold one way only (to count its instructions), or none (the stream alone)")
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--close-delay-hours", type=int, default=0,
                   help="the replay stream's close delay, with hourly ticks after its end until every hour "
                        f"closes (bench_replay's: {REPLAY_CLOSE_DELAY_HOURS}, 10 wall seconds at 300,000x: every "
                        "workload seen within the delay stays active, as in the service; default 0)")
    args = p.parse_args()
    ways = WAYS if args.ways == "both" else () if args.ways == "none" else (args.ways,)

    if args.trace.is_file():
        all_pods = read_pods(args.trace)
        source = str(args.trace)
    else:
        all_pods = synthetic_pods(2000, seed=11)
        source = "synthetic_pods(2000, seed=11) (trace not found)"
    print(f"pods from {source}; load {os.getloadavg()[0]:.2f}; python {sys.version.split()[0]}")
    names = ("replay", "default") if args.stream == "both" else (args.stream,)
    for name in names:
        count = args.pods if name == "replay" else (args.default_pods or len(all_pods))
        hours = args.hours or None if name == "replay" else None
        records = stream(name, all_pods[:count], hours)
        delay = args.close_delay_hours if name == "replay" else 0
        records += settle_ticks(records, delay)
        cfg = config(REPLAY_HORIZON_HOURS if name == "replay" else None, delay)
        times: dict[str, list[float]] = {way: [] for way in ways}
        reference: tuple[list, dict] | None = None
        if not ways:
            print(f"{name}: {len(records)} events built, none folded (--ways none)")
            continue
        for round_ in range(args.rounds):
            order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
            for way in order:
                seconds, outputs, store = fold(cfg, records, way == "per-batch", args.batch)
                if reference is None:
                    reference = (outputs, store)
                elif (outputs, store) != reference:
                    raise SystemExit(f"{name}: {way} gave different outputs or records")
                times[way].append(seconds)
                print(f"  {name} round {round_ + 1} {way:>12}: {seconds:7.2f} s  "
                      f"{len(records) / seconds:8.0f} events/s  {1e6 * seconds / len(records):8.1f} us/event")
        assert reference is not None
        rows = sum(1 for out in reference[0] if out.topic == "qm.billing")
        books = [len(v["book"]) for v in reference[1].values() if isinstance(v, dict) and v.get("book")]
        span = f"first {hours} trace hours, " if hours else ""
        print(f"{name}: {count} pods, {span}{len(records)} events, {rows} rows, same outputs and records; "
              f"largest book {max(books, default=0):,} chars, horizon {cfg.settings.correction_horizon_ms // 3_600_000} h, "
              f"close delay {cfg.settings.close_delay_ms // 3_600_000} h")
        best = {way: min(ts) for way, ts in times.items()}
        for way, ts in times.items():
            print(f"  {way:>12}: best {best[way]:.2f} s (median {statistics.median(ts):.2f}) = "
                  f"{len(records) / best[way]:.0f} events/s, {1e6 * best[way] / len(records):.1f} us/event")
        if len(best) == 2:
            print(f"  speed-up (best per-event / best per-batch of {args.batch}): "
                  f"{best['per-event'] / best['per-batch']:.2f}x")


if __name__ == "__main__":
    main()
