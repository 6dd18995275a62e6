"""How long the two hops between a finish and the quota it frees take, read back from the bus.

A finished pod frees its quota only once two hops have passed:
* admission's fact lane forwards the cluster's `workload.finished.v1` from `qm.cluster` onto
  the cohort's stream on `qm.workloads` (ADR 0023, ADR 0026), unless the watcher (here the
  simulated cluster) sent it there itself (ADR 0075): then there is no such hop;
* the queue-manager applies it and writes `workload.released.v1` (and, in the same step or at
  its next drain, the reservations that use the quota).

`quota_held` is the whole stretch a finished run kept its quota: from its last
`workload.quota_reserved.v1` to that release, so its run time plus every hop around it (admit,
start, finish, forward, release). Held 450 ms for a 200 ms run means the quota worked 44% of
that time.

Both are measured from the records' own timestamps (each producer's send time), so they include
every queue in between: the broker, the fetch, and the records ahead in the service's batch. By
phase (the finishes of each `window_s` of the run), because a service that keeps up most of the
run and falls behind in its last seconds shows only there: in kueue-baseline the small
workloads run last, in a burst, and the queue-manager's hop grows from ~40 ms to ~400 ms.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from typing import Any

import orjson
from common import envelope_values, pct

from services.adapters.bus import read_topic

FINISHED = b"workload.finished.v1"
RELEASED = b"workload.released.v1"
RESERVED = b"workload.quota_reserved.v1"
POD_RUNNING = b"pod.running.v1"
DRAIN_DUE = b"queue.drain_due.v1"


def _uid(value: bytes) -> str | None:
    try:
        return orjson.loads(value)["payload"]["uid"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def _stats(values: list[float]) -> dict[str, Any]:
    values = sorted(values)
    if not values:
        return {"n": 0, "p50_ms": None, "p90_ms": None}
    return {"n": len(values), "p50_ms": round(1000 * pct(values, 0.5)), "p90_ms": round(1000 * pct(values, 0.9))}


def finish_hops(cluster: list[tuple[float, bytes]], workloads: list[tuple[float, bytes]],
                window_s: float = 5.0) -> dict[str, Any]:
    """`cluster`, `workloads`: (timestamp s, value) of every record of qm.cluster / qm.workloads.
    Per workload's first finish: forwarded (qm.cluster → qm.workloads, for the finishes that
    went through admission's fact lane) and released (the finish on the cohort's stream → the
    queue-manager's release), overall and per window of the run. A finish its source sent to
    the cohort's stream itself (ADR 0075) is on qm.workloads alone: it happened there, and has
    no forwarding hop."""
    on_cluster = {}  # uid -> when the cluster said so on qm.cluster
    for t, value in cluster:
        if FINISHED in value and (uid := _uid(value)) is not None:
            on_cluster.setdefault(uid, t)
    forwarded_at = {}  # uid -> its first finish on the cohort's stream
    released_at = {}
    reserved_at: dict[str, list[float]] = {}  # every reservation: a preempted workload has several
    for t, value in ((t, one) for t, record in workloads for one in envelope_values(record)):
        if FINISHED in value and (uid := _uid(value)) is not None:
            forwarded_at.setdefault(uid, t)
        elif RELEASED in value and b'"Finished"' in value and (uid := _uid(value)) is not None:
            released_at.setdefault(uid, t)
        elif RESERVED in value and (uid := _uid(value)) is not None:
            reserved_at.setdefault(uid, []).append(t)
    finished_at = {uid: on_cluster.get(uid, t) for uid, t in forwarded_at.items()}
    if not finished_at:
        return {}
    start = min(finished_at.values())
    forwarding, releasing, holding = [], [], []
    phases: dict[int, tuple[list[float], list[float], list[float]]] = {}
    for uid, forwarded in forwarded_at.items():
        phase = phases.setdefault(int((finished_at[uid] - start) // window_s), ([], [], []))
        if uid in on_cluster:
            forwarding.append(forwarded - finished_at[uid])
            phase[0].append(forwarded - finished_at[uid])
        if uid in released_at:
            releasing.append(released_at[uid] - forwarded)
            phase[1].append(released_at[uid] - forwarded)
            last = _ran_on(reserved_at.get(uid, ()), finished_at[uid])
            if last is not None:
                holding.append(released_at[uid] - last)
                phase[2].append(released_at[uid] - last)
    return {
        "forwarded_by_admission": _stats(forwarding),
        "released_by_queue_manager": _stats(releasing),
        # reservation -> release of the run that finished: its run time plus every hop around it
        "quota_held": _stats(holding),
        "by_phase": [{"finished_from_s": k * window_s, "forwarded": _stats(f), "released": _stats(r), "held": _stats(h)}
                     for k, (f, r, h) in sorted(phases.items())],
    }


def _ran_on(reservations: Iterable[float], finished: float) -> float | None:
    """The reservation that ran to a finish: the last one made before it (a preempted workload
    was reserved more than once)."""
    return max((t for t in reservations if t <= finished), default=None)


def quota_cycle(workloads: list[tuple[float, bytes]], window_s: float = 5.0) -> list[dict[str, Any]]:
    """Where a quota's turn goes between two reservations, per phase of the run (the finishes of
    each `window_s`), from the cohort's stream alone (`workloads`: (timestamp s, value) of every
    record of qm.workloads). For each run that finished, from the reservation it ran on:

    * `to_running`: reservation → its pod's `pod.running` on the cohort's stream (the admit
      action's trip to the cluster, the start, and the fact's trip back);
    * `running`: that → its `workload.finished` (the run itself, plus the cluster's reporting);
    * `to_release`: the finish → the queue-manager's release;
    * `to_reuse`: the release → the next reservation in the same cohort (how long freed quota
      waited for a drain);
    * `drain_every`: between two `queue.drain_due` of one cohort (ADR 0016): how often a busy
      cohort drains.

    The sum of the first four is one turn of a quota that is always wanted again."""
    running_at: dict[str, list[float]] = {}
    reserved: dict[str, list[float]] = {}
    reservations_of: dict[str, list[float]] = {}  # cohort -> every reservation's time
    finished_at: dict[str, float] = {}
    released: dict[str, tuple[float, str]] = {}
    dues: dict[str, list[float]] = {}
    for t, value in ((t, one) for t, record in workloads for one in envelope_values(record)):
        if not any(m in value for m in (RESERVED, POD_RUNNING, FINISHED, RELEASED, DRAIN_DUE)):
            continue
        try:
            document = orjson.loads(value)
            event_type, payload = document["event_type"], document["payload"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
        if event_type == "workload.quota_reserved.v1":
            reserved.setdefault(payload["uid"], []).append(t)
            reservations_of.setdefault(payload.get("cohort") or payload["cluster_queue"], []).append(t)
        elif event_type == "pod.running.v1":
            running_at.setdefault(payload["workload_uid"], []).append(t)
        elif event_type == "workload.finished.v1":
            finished_at.setdefault(payload["uid"], t)
        elif event_type == "workload.released.v1" and payload.get("reason") == "Finished":
            released.setdefault(payload["uid"], (t, payload.get("cohort") or payload["cluster_queue"]))
        elif event_type == "queue.drain_due.v1":
            dues.setdefault(payload["cohort"], []).append(t)
    if not finished_at:
        return []
    start = min(finished_at.values())
    legs = ("to_running", "running", "to_release", "to_reuse", "drain_every")
    phases: dict[int, dict[str, list[float]]] = {}
    for times in reservations_of.values():
        times.sort()
    for uid, finished in finished_at.items():
        phase = phases.setdefault(int((finished - start) // window_s), {leg: [] for leg in legs})
        ran_on = _ran_on(reserved.get(uid, ()), finished)
        began = min((t for t in running_at.get(uid, ()) if ran_on is not None and ran_on <= t <= finished),
                    default=None)
        if began is not None:
            phase["to_running"].append(began - ran_on)
            phase["running"].append(finished - began)
        if uid in released:
            freed, cohort = released[uid]
            phase["to_release"].append(freed - finished)
            later = reservations_of.get(cohort, [])
            index = bisect.bisect_left(later, freed)
            if index < len(later):
                phase["to_reuse"].append(later[index] - freed)
    for times in dues.values():
        times.sort()
        for before, after in itertools.pairwise(times):
            if (k := int((after - start) // window_s)) in phases:
                phases[k]["drain_every"].append(after - before)
    return [{"finished_from_s": k * window_s, **{leg: _stats(values) for leg, values in phase.items()}}
            for k, phase in sorted(phases.items())]


async def read_finish_hops(bootstrap: str, prefix: str, window_s: float = 5.0) -> dict[str, Any]:
    """finish_hops over what the topics hold now (read before they are deleted), with the
    quota's whole turn (`quota_cycle`)."""
    async def timed(topic: str, *markers: bytes) -> list[tuple[float, bytes]]:
        return [(r.timestamp_ms / 1000, r.value) async for r in read_topic(bootstrap, prefix + topic)
                if any(m in r.value for m in markers)]
    workloads = await timed("qm.workloads", FINISHED, RELEASED, RESERVED, POD_RUNNING, DRAIN_DUE)
    hops = finish_hops(await timed("qm.cluster", FINISHED), workloads, window_s)
    if hops:
        hops["quota_cycle"] = quota_cycle(workloads, window_s)
    return hops


def slowest_release(hops: dict[str, Any]) -> dict[str, Any]:
    """The phase whose finishes the queue-manager released slowest (by p50)."""
    return max(hops["by_phase"], key=lambda p: p["released"]["p50_ms"] or 0)


def hops_line(hops: dict[str, Any]) -> str:
    """One line for a run's output: the overall hops, and the phase where the release took longest."""
    if not hops:
        return "finish hops: no finishes"
    worst = slowest_release(hops)
    f, r = hops["forwarded_by_admission"], hops["released_by_queue_manager"]
    forwarding = (f"admission forwards in {f['p50_ms']} / {f['p90_ms']} ms" if f["n"] else
                  "each finish sent to its cohort's stream by the cluster itself (ADR 0075)")
    return (f"finish hops (p50 / p90): {forwarding}, the queue-manager "
            f"releases in {r['p50_ms']} / {r['p90_ms']} ms; slowest release in the finishes from "
            f"{worst['finished_from_s']:g} s: {worst['released']['p50_ms']} / {worst['released']['p90_ms']} ms"
            + _held_part(hops, worst) + _cycle_part(hops, worst))


def _held_part(hops: dict[str, Any], worst: dict[str, Any]) -> str:
    """Reservation to release, run time included (absent from results written before it was measured)."""
    held, there = hops.get("quota_held"), worst.get("held")
    if not held or not held["n"] or not there:
        return ""
    return (f"; quota held from reservation to release {held['p50_ms']} / {held['p90_ms']} ms "
            f"({there['p50_ms']} / {there['p90_ms']} ms in that phase)")


def _cycle_part(hops: dict[str, Any], worst: dict[str, Any]) -> str:
    """A quota's turn in the phase of the slowest release (absent from older results)."""
    there = next((p for p in hops.get("quota_cycle", ()) if p["finished_from_s"] == worst["finished_from_s"]), None)
    if there is None or not there["to_reuse"]["n"]:
        return ""
    legs = [("reserved → running", "to_running"), ("running → finished", "running"),
            ("finished → released", "to_release"), ("released → reserved again", "to_reuse")]
    turn = ", ".join(f"{label} {there[key]['p50_ms']}" for label, key in legs if there[key]["n"])
    drains = there["drain_every"]
    return (f"; a quota's turn there (p50 ms): {turn}"
            + (f"; each busy cohort drained every {drains['p50_ms']} ms" if drains["n"] else ""))
