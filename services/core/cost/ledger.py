"""The cost-accounting fold: ``apply(state, event) -> (state, outputs)``.

What it does
------------
* Keeps, per workload, the *facts* it was told (reservation starts, pod starts, ends), each
  stamped with event time and an arrival sequence number. Usage intervals are derived from
  the facts, so events may arrive in any order: an interval ends at the first end event
  after its start or at the next start of the same interval (a replacement), whichever
  comes first.
* Two usage kinds per flavor: ``running`` (sum of running pods; each named pod is its own
  interval, so a gang whose pods start at different times is billed per pod) and
  ``reserved-idle`` = ``max(0, reserved - running)`` per resource — quota held but not used.
* Hours are closed on event time: once the watermark (largest event time seen, ticks
  included) minus ``close_delay_ms`` passes an hour's end, every active workload emits one
  :class:`LedgerRow` per (flavor, usage kind) with usage in that hour.
* An event older than a workload's closed hours is *late*: the affected closed hours are
  recomputed and the difference is emitted as correction rows (``ChargeClass=Correction``,
  amounts are deltas, a new revision and row id) — emitted rows are never edited. Hours
  older than ``correction_horizon_ms`` behind the closed watermark are final; events that
  would change them are reported as :class:`EventIgnored` (``TooLate``).
* Rows feed monthly budgets per cost center (namespace label) → :class:`BudgetAlert` when a
  threshold is first crossed and :class:`BudgetStatus` for every budget a call touched.
* Idempotent: a workload event whose ``event_id`` was already applied changes nothing and
  outputs nothing. Config, namespace and tick events are idempotent by value.

Ownership: ``apply`` updates the state it is given in place and returns it (a fold owns its
state; copying thousands of intervals per event would be slow). Snapshot with
:func:`state_to_dict` if you need the old one. Quantity and rounding rules: ``units``.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right, insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from heapq import heappop, heappush
from typing import Any

from services.core.cost.hour_texts import HourTexts
from services.core.cost.model import (
    Budget,
    BudgetAlert,
    BudgetsConfigured,
    BudgetStatus,
    BudgetUnit,
    ChargeClass,
    ClockTick,
    CostEvent,
    CostOutput,
    CostSettings,
    EventIgnored,
    Evicted,
    Finished,
    IgnoreReason,
    LedgerRow,
    NamespaceLabeled,
    PodsRunning,
    PodsStopped,
    PreFreezeExpired,
    PriceList,
    PriceListConfigured,
    Released,
    ReservationStarted,
    UsageKind,
)
from services.core.cost.pricing import (
    budget_from_dict,
    budget_to_dict,
    price_list_from_dict,
    price_list_to_dict,
)
from services.core.cost.units import (
    EXACT,
    GIB_HOUR_DIVISOR,
    HOUR_MS,
    MILLI_HOUR_DIVISOR,
    ceil_hour,
    floor_hour,
    month_key,
    nano_to_decimal,
    to_nano,
)

__all__ = [
    "CostState",
    "apply",
    "apply_tracked",
    "book_from_dict",
    "book_to_dict",
    "book_to_json",
    "fold",
    "initial_state",
    "restore_books",
    "row_id",
    "state_from_dict",
    "state_to_dict",
]

_RUNNING = UsageKind.RUNNING
_IDLE = UsageKind.RESERVED_IDLE
_ZERO = Decimal(0)
_PCT = Decimal("0.01")

# A fact is a list so it sorts by (at_ms, seq) and serializes as JSON as is:
#   start: [at_ms, seq, flavor, gpu_milli, cpu_milli, memory_milli]
#   end:   [at_ms, seq]
# A derived interval: (start_ms, end_ms | None, flavor, gpu_milli, cpu_milli, memory_milli)
Interval = tuple[int, int | None, str, int, int, int]
SeriesKey = tuple[str, str]  # (flavor, usage kind)


@dataclass(slots=True)
class _Book:
    """Everything the fold knows about one workload."""

    uid: str
    namespace: str = ""
    workload_name: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    seq: int = 0
    res_starts: list[list[Any]] = field(default_factory=list)
    res_ends: list[list[int]] = field(default_factory=list)  # PreFreezeExpired + workload-wide ends
    pod_starts: dict[str, list[list[Any]]] = field(default_factory=dict)
    pod_ends: dict[str, list[list[int]]] = field(default_factory=dict)  # PodsStopped per pod
    all_ends: list[list[int]] = field(default_factory=list)  # Released / Evicted / Finished
    finished: list[int] | None = None  # [at_ms, seq]
    billed_through_ms: int | None = None  # hours before this are closed for this workload
    # hour_ms -> (flavor, kind) -> [gpu, cpu, memory exact milli-ms, rows emitted]
    emitted: dict[int, dict[SeriesKey, list[int]]] = field(default_factory=dict)
    # (flavor, kind) -> [exact gpu, cpu, memory milli-ms, emitted nano gpu, cpu, memory]
    series: dict[SeriesKey, list[int]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    cache: tuple[list[Interval], list[Interval]] | None = None  # derived, not serialized
    # Derived, not serialized (book_to_json): the JSON text of each hour of ``emitted``, same
    # hours in the same order. _emit marks its hour changed; the horizon pruning in _close drops it.
    hour_texts: HourTexts = field(default_factory=HourTexts)


@dataclass(slots=True)
class CostState:
    settings: CostSettings = field(default_factory=CostSettings)
    watermark_ms: int | None = None
    closed_through_ms: int | None = None  # every hour before this is closed
    books: dict[str, _Book] = field(default_factory=dict)
    # Ordered set of uids with unbilled usage; each maps to its place in that order (_activate).
    active: dict[str, int] = field(default_factory=dict)
    finished_idle: dict[str, int] = field(default_factory=dict)  # uid -> billed through, for pruning
    forgotten: dict[str, int] = field(default_factory=dict)  # pruned uid -> finished at
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    price_list: PriceList | None = None
    budgets: tuple[Budget, ...] = ()
    # (cost center, month) -> [gpu nano-hours, {currency: cost}]
    budget_usage: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    alerts_sent: dict[tuple[str, str, int], None] = field(default_factory=dict)
    config_at: dict[str, int] = field(default_factory=dict)
    # Derived, not serialized: a min-heap of (billed_through_ms, place in active, uid), at least
    # one entry per active book with its current values (stale ones are skipped when popped).
    # A tick closes hours only of the books billed through less than its closed hour: with a
    # close delay, every workload seen within the delay is active and the rest wait, and
    # visiting every active book at every tick was ~a third of the fold in the Alibaba replay
    # (833-hour delay: 6.9 million visits for 66,000 that closed an hour).
    resume_at: list[tuple[int, int, str]] = field(default_factory=list)
    next_place: int = 0


def initial_state(
    settings: CostSettings | None = None, price_list: PriceList | None = None, budgets: Iterable[Budget] = ()
) -> CostState:
    return CostState(settings=settings or CostSettings(), price_list=price_list, budgets=tuple(budgets))


def row_id(workload_uid: str, flavor: str, usage_kind: str, hour_ms: int, revision: int) -> str:
    """Deterministic ledger row id: sha256 over the identifying fields and the revision."""
    text = f"{workload_uid}\x1f{flavor}\x1f{usage_kind}\x1f{hour_ms}\x1f{revision}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# --------------------------------------------------------------------------- apply


@dataclass(slots=True)
class _Ctx:
    state: CostState
    out: list[CostOutput]
    now_ms: int
    touched: dict[tuple[str, str], None] = field(default_factory=dict)  # (budget name, month)
    changed: dict[str, None] = field(default_factory=dict)  # uids whose book changed or was pruned


def apply(state: CostState, event: CostEvent) -> tuple[CostState, list[CostOutput]]:
    """Apply one event; return the (same, updated) state and the outputs it caused."""
    state, outputs, _ = apply_tracked(state, event)
    return state, outputs


def apply_tracked(state: CostState, event: CostEvent) -> tuple[CostState, list[CostOutput], tuple[str, ...]]:
    """:func:`apply`, also naming the workloads whose book changed (or was pruned: no longer in
    ``state.books``), so a shell storing one record per workload writes only those."""
    ctx = _Ctx(state, [], event.at_ms)
    book: _Book | None = None
    if isinstance(event, ClockTick):
        pass
    elif isinstance(event, NamespaceLabeled):
        if _newer_config(state, f"namespace/{event.namespace}", event.at_ms):
            state.namespace_labels[event.namespace] = dict(event.labels)
    elif isinstance(event, PriceListConfigured):
        if _newer_config(state, "price-list", event.at_ms):
            state.price_list = event.price_list
    elif isinstance(event, BudgetsConfigured):
        if _newer_config(state, "budgets", event.at_ms):
            state.budgets = tuple(event.budgets)
    else:
        book = _apply_workload(ctx, event)
    _advance(ctx, event.at_ms, book, isinstance(event, ClockTick) or not state.settings.close_on_ticks_only)
    _budget_statuses(ctx)
    return state, ctx.out, tuple(ctx.changed)


def fold(events: Iterable[CostEvent], state: CostState | None = None) -> tuple[CostState, list[CostOutput]]:
    """Apply events in order; all outputs concatenated."""
    current = state if state is not None else initial_state()
    outputs: list[CostOutput] = []
    for event in events:
        current, produced = apply(current, event)
        outputs.extend(produced)
    return current, outputs


def _newer_config(state: CostState, key: str, at_ms: int) -> bool:
    if at_ms < state.config_at.get(key, at_ms):
        return False  # an older version arriving late must not replace a newer one
    state.config_at[key] = at_ms
    return True


def _ignored(ctx: _Ctx, event: CostEvent, uid: str, reason: IgnoreReason, message: str) -> None:
    ctx.out.append(EventIgnored(event.event_id, uid, reason, message, event.at_ms))


def _apply_workload(ctx: _Ctx, event: CostEvent) -> _Book | None:
    state = ctx.state
    uid: str = event.workload_uid  # type: ignore[union-attr]
    if uid in state.forgotten:
        _ignored(
            ctx,
            event,
            uid,
            IgnoreReason.FORGOTTEN_WORKLOAD,
            f"workload {uid} finished and its ledger is final",
        )
        return None
    book = state.books.get(uid)
    if book is None:
        book = state.books[uid] = _Book(uid)
    if event.event_id in book.seen:
        return None  # at-least-once delivery: already applied
    book.seen.add(event.event_id)
    ctx.changed[uid] = None
    at_ms = event.at_ms
    hour_ms = floor_hour(at_ms)
    late = book.billed_through_ms is not None and hour_ms < book.billed_through_ms
    if late and state.closed_through_ms is not None:
        final_before = state.closed_through_ms - state.settings.correction_horizon_ms
        if hour_ms < final_before:
            _ignored(
                ctx,
                event,
                uid,
                IgnoreReason.TOO_LATE,
                f"event at {at_ms} would correct hours before {final_before}, past the correction horizon",
            )
            return None
    book.seq += 1
    key = [at_ms, book.seq]
    if isinstance(event, (ReservationStarted, PodsRunning)):
        if book.finished is not None and key > book.finished:
            _ignored(
                ctx, event, uid, IgnoreReason.AFTER_FINISH, f"workload {uid} finished at {book.finished[0]}"
            )
            return None
        if event.namespace:
            book.namespace = event.namespace
        if event.workload_name:
            book.workload_name = event.workload_name
        if event.labels:
            book.labels = tuple(sorted(event.labels))
        amounts = event.resources
        fact = [at_ms, book.seq, event.flavor, amounts.gpu_milli, amounts.cpu_milli, amounts.memory_milli]
        if isinstance(event, ReservationStarted):
            insort(book.res_starts, fact)
        else:
            insort(book.pod_starts.setdefault(event.pod_name, []), fact)
    elif isinstance(event, PodsStopped):
        insort(book.pod_ends.setdefault(event.pod_name, []), key)
    elif isinstance(event, PreFreezeExpired):
        insort(book.res_ends, key)
    elif isinstance(event, (Released, Evicted, Finished)):
        insort(book.res_ends, key)
        insort(book.all_ends, key)
        if isinstance(event, Finished) and (book.finished is None or key < book.finished):
            book.finished = key
    else:  # pragma: no cover - the union is exhaustive
        raise TypeError(f"not a cost event: {event!r}")
    book.cache = None
    if book.billed_through_ms is None:
        book.billed_through_ms = hour_ms
    elif late:
        _correct(ctx, book, hour_ms)
    if uid not in state.active:
        _activate(state, book)
    state.finished_idle.pop(uid, None)
    return book


def _activate(state: CostState, book: _Book) -> None:
    """Put ``book`` last in the active set, waiting for hours to close from its billed hour."""
    place = state.active[book.uid] = state.next_place
    state.next_place += 1
    if book.billed_through_ms is not None:
        heappush(state.resume_at, (book.billed_through_ms, place, book.uid))


def _due(state: CostState, closed_ms: int) -> list[str]:
    """The active books billed through less than ``closed_ms``, in the active set's order."""
    heap, active, books = state.resume_at, state.active, state.books
    due: dict[str, int] = {}
    while heap and heap[0][0] < closed_ms:
        billed, place, uid = heappop(heap)
        if active.get(uid) == place and books[uid].billed_through_ms == billed:
            due[uid] = place
    return sorted(due, key=due.__getitem__)


def _advance(ctx: _Ctx, at_ms: int, book: _Book | None, moves_watermark: bool = True) -> None:
    """Move the watermark; close every hour that is now complete."""
    state = ctx.state
    if moves_watermark and (state.watermark_ms is None or at_ms > state.watermark_ms):
        state.watermark_ms = at_ms
    if state.watermark_ms is None:
        return
    closed = floor_hour(state.watermark_ms - state.settings.close_delay_ms)
    if state.closed_through_ms is None or closed > state.closed_through_ms:
        state.closed_through_ms = closed
        for uid in _due(state, closed):  # the other active books close none of their hours yet
            _close(ctx, state.books[uid], closed)
        _prune(ctx)
    elif book is not None and book.uid in state.active and state.closed_through_ms is not None:
        _close(ctx, book, state.closed_through_ms)


# --------------------------------------------------------------------------- intervals


def _derive(starts: list[list[Any]], ends: list[list[int]]) -> list[Interval]:
    intervals: list[Interval] = []
    count = len(starts)
    for index, start in enumerate(starts):
        end: int | None = starts[index + 1][0] if index + 1 < count else None
        position = bisect_right(ends, start[:2])
        if position < len(ends):
            closing = ends[position][0]
            end = closing if end is None or closing < end else end
        intervals.append((start[0], end, start[2], start[3], start[4], start[5]))
    return intervals


def _intervals(book: _Book) -> tuple[list[Interval], list[Interval]]:
    if book.cache is None:
        finished = book.finished
        # A start after Finished never counts, even when it arrived before the Finished event.
        kept = (
            (lambda starts: starts)
            if finished is None
            else (lambda starts: [s for s in starts if s[:2] < finished])
        )
        reservations = _derive(kept(book.res_starts), book.res_ends)
        pods: list[Interval] = []
        for pod, starts in book.pod_starts.items():
            own = book.pod_ends.get(pod)
            ends = sorted(own + book.all_ends) if own else book.all_ends
            pods.extend(_derive(kept(starts), ends))
        book.cache = (reservations, pods)
    return book.cache


def _window(
    reservations: list[Interval], pods: list[Interval], lo: int, hi: int
) -> dict[SeriesKey, list[int]]:
    """Exact usage (milli-units x ms per resource) in ``[lo, hi)`` per (flavor, kind)."""
    usage: dict[SeriesKey, list[int]] = {}
    live_pods = [iv for iv in pods if iv[0] < hi and (iv[1] is None or iv[1] > lo)]
    for start, end, flavor, gpu, cpu, memory in live_pods:
        duration = (hi if end is None or end > hi else end) - (lo if start < lo else start)
        if duration > 0:
            acc = usage.setdefault((flavor, _RUNNING), [0, 0, 0])
            acc[0] += gpu * duration
            acc[1] += cpu * duration
            acc[2] += memory * duration
    live_res = [iv for iv in reservations if iv[0] < hi and (iv[1] is None or iv[1] > lo)]
    if not live_res:
        return usage
    for flavor in sorted({iv[2] for iv in live_res}):
        held = [iv for iv in live_res if iv[2] == flavor]
        used = [iv for iv in live_pods if iv[2] == flavor]
        idle = [0, 0, 0]
        inner = [start for start, *_ in held + used if lo < start < hi]
        inner += [end for _, end, *_ in held + used if end is not None and lo < end < hi]
        ordered = [lo, *sorted(set(inner)), hi] if inner else [lo, hi]
        for seg_lo, seg_hi in zip(ordered, ordered[1:], strict=False):
            reserved = [0, 0, 0]
            for start, end, _, gpu, cpu, memory in held:
                if start <= seg_lo and (end is None or end >= seg_hi):
                    reserved[0] += gpu
                    reserved[1] += cpu
                    reserved[2] += memory
            for start, end, _, gpu, cpu, memory in used:
                if start <= seg_lo and (end is None or end >= seg_hi):
                    reserved[0] -= gpu
                    reserved[1] -= cpu
                    reserved[2] -= memory
            length = seg_hi - seg_lo
            for index in range(3):
                if reserved[index] > 0:
                    idle[index] += reserved[index] * length
        if idle[0] or idle[1] or idle[2]:
            usage[(flavor, _IDLE)] = idle
    return usage


def _extent(
    reservations: list[Interval], pods: list[Interval], after_ms: int
) -> tuple[int, int | None] | None:
    """``(first start, last end or None if open)`` of intervals reaching past ``after_ms``."""
    first: int | None = None
    last: int | None = -1
    for start, end, *_ in (*reservations, *pods):
        if end is not None and end <= after_ms:
            continue
        first = start if first is None or start < first else first
        if end is None:
            last = None
        elif last is not None and end > last:
            last = end
    if first is None:
        return None
    return first, last


# --------------------------------------------------------------------------- closing and correcting


def _reaches_past_billed(book: _Book, extent: tuple[int, int | None] | None) -> bool:
    billed = book.billed_through_ms
    if billed is None:
        return True
    return extent is not None and (extent[1] is None or ceil_hour(extent[1]) > billed)


def _close(ctx: _Ctx, book: _Book, until_ms: int) -> None:
    """Emit regular rows for the workload's hours in ``[billed_through, until_ms)``."""
    state = ctx.state
    start_ms = book.billed_through_ms
    assert start_ms is not None
    if start_ms >= until_ms:
        # None of its hours closes yet. Hours close close_delay_ms behind the events, so every
        # workload seen within the delay comes here at every tick; marking them all changed
        # had the shell store them all (full replay, 833-h delay: cost service 202 -> 91 CPU-s).
        return
    ctx.changed[book.uid] = None
    reservations, pods = _intervals(book)
    extent = _extent(reservations, pods, start_ms)
    if start_ms < until_ms:
        if extent is not None:
            hour = max(start_ms, floor_hour(extent[0]))
            stop = until_ms if extent[1] is None else min(until_ms, ceil_hour(extent[1]))
            while hour < stop:
                usage = _window(reservations, pods, hour, hour + HOUR_MS)
                for key in sorted(usage):
                    _emit(ctx, book, key, hour, usage[key], ChargeClass.REGULAR)
                hour += HOUR_MS
        book.billed_through_ms = until_ms
        final_before = until_ms - state.settings.correction_horizon_ms
        emitted = book.emitted
        while emitted:
            oldest = next(iter(emitted))
            if oldest >= final_before:
                break
            del emitted[oldest]
            book.hour_texts.drop_oldest(oldest)
    # Nothing reaches past the billed hours any more: leave the active set.
    if not _reaches_past_billed(book, extent):
        state.active.pop(book.uid, None)
        if book.finished is not None:
            state.finished_idle[book.uid] = book.billed_through_ms
    elif book.uid in state.active:
        heappush(state.resume_at, (until_ms, state.active[book.uid], book.uid))


def _correct(ctx: _Ctx, book: _Book, from_hour_ms: int) -> None:
    """Re-derive closed hours from ``from_hour_ms`` and emit the differences as corrections."""
    assert book.billed_through_ms is not None
    reservations, pods = _intervals(book)
    zero = [0, 0, 0]
    for hour in range(from_hour_ms, book.billed_through_ms, HOUR_MS):
        usage = _window(reservations, pods, hour, hour + HOUR_MS)
        before = book.emitted.get(hour, {})
        for key in sorted(set(usage) | set(before)):
            now = usage.get(key, zero)
            then = before.get(key)
            old = then[:3] if then is not None else zero
            if now != old:
                delta = [now[0] - old[0], now[1] - old[1], now[2] - old[2]]
                _emit(ctx, book, key, hour, delta, ChargeClass.CORRECTION)


def _emit(
    ctx: _Ctx, book: _Book, key: SeriesKey, hour_ms: int, delta: list[int], charge_class: ChargeClass
) -> None:
    hour_map = book.emitted.get(hour_ms)
    if hour_map is None:
        hour_map = book.emitted[hour_ms] = {}
    book.hour_texts.changed(hour_ms)  # its text is made again by the next book_to_json
    entry = hour_map.get(key)
    if entry is None:
        entry = hour_map[key] = [0, 0, 0, 0]
    entry[0] += delta[0]
    entry[1] += delta[1]
    entry[2] += delta[2]
    series = book.series.get(key)
    if series is None:
        series = book.series[key] = [0, 0, 0, 0, 0, 0]
    series[0] += delta[0]
    series[1] += delta[1]
    series[2] += delta[2]
    gpu_nano = to_nano(series[0], MILLI_HOUR_DIVISOR)
    cpu_nano = to_nano(series[1], MILLI_HOUR_DIVISOR)
    memory_nano = to_nano(series[2], GIB_HOUR_DIVISOR)
    d_gpu, d_cpu, d_memory = gpu_nano - series[3], cpu_nano - series[4], memory_nano - series[5]
    series[3], series[4], series[5] = gpu_nano, cpu_nano, memory_nano
    if not (d_gpu or d_cpu or d_memory):
        return  # below a nano-unit-hour: carried in the series, shows up in a later row
    revision = entry[3]
    entry[3] += 1
    _publish_row(ctx, book, key, hour_ms, revision, charge_class, d_gpu, d_cpu, d_memory)


def _publish_row(
    ctx: _Ctx,
    book: _Book,
    key: SeriesKey,
    hour_ms: int,
    revision: int,
    charge_class: ChargeClass,
    d_gpu: int,
    d_cpu: int,
    d_memory: int,
) -> None:
    state = ctx.state
    settings = state.settings
    flavor, kind = key
    gpu_hours = nano_to_decimal(d_gpu)
    core_hours = nano_to_decimal(d_cpu)
    memory_gib_hours = nano_to_decimal(d_memory)
    price_list = state.price_list
    prices = price_list.prices_for(flavor) if price_list is not None else None
    if prices is None:
        list_cost = contracted_cost = _ZERO
    else:
        multiply, add = EXACT.multiply, EXACT.add
        list_cost = add(
            add(multiply(gpu_hours, prices.gpu.list_price), multiply(core_hours, prices.cpu.list_price)),
            multiply(memory_gib_hours, prices.memory.list_price),
        )
        contracted_cost = add(
            add(
                multiply(gpu_hours, prices.gpu.contracted_price),
                multiply(core_hours, prices.cpu.contracted_price),
            ),
            multiply(memory_gib_hours, prices.memory.contracted_price),
        )
    labels = state.namespace_labels.get(book.namespace)
    cost_center = (labels.get(settings.cost_center_label) if labels else None) or settings.default_cost_center
    row = LedgerRow(
        row_id=row_id(book.uid, flavor, kind, hour_ms, revision),
        revision=revision,
        charge_class=charge_class,
        workload_uid=book.uid,
        workload_name=book.workload_name,
        namespace=book.namespace,
        cost_center=cost_center,
        flavor=flavor,
        usage_kind=UsageKind(kind),
        charge_period_start_ms=hour_ms,
        charge_period_end_ms=hour_ms + HOUR_MS,
        gpu_hours=gpu_hours,
        core_hours=core_hours,
        memory_gib_hours=memory_gib_hours,
        list_cost=list_cost,
        contracted_cost=contracted_cost,
        currency=price_list.currency if price_list is not None else settings.default_currency,
        priced=prices is not None,
        tags=book.labels,
    )
    ctx.out.append(row)
    _account(ctx, row, d_gpu)


# --------------------------------------------------------------------------- budgets


def _account(ctx: _Ctx, row: LedgerRow, gpu_nano: int) -> None:
    state = ctx.state
    month = month_key(row.charge_period_start_ms)
    usage = state.budget_usage.get((row.cost_center, month))
    if usage is None:
        usage = state.budget_usage[(row.cost_center, month)] = [0, {}]
    usage[0] += gpu_nano
    costs: dict[str, Decimal] = usage[1]
    costs[row.currency] = EXACT.add(costs.get(row.currency, _ZERO), row.contracted_cost)
    for budget in state.budgets:
        if budget.cost_center != row.cost_center:
            continue
        ctx.touched[(budget.name, month)] = None
        used = _used(budget, usage)
        for threshold in budget.thresholds_pct:
            alert_key = (budget.name, month, threshold)
            if alert_key in state.alerts_sent or used * 100 < budget.limit * threshold:
                continue
            state.alerts_sent[alert_key] = None
            digest = hashlib.sha256(f"{budget.name}\x1f{month}\x1f{threshold}".encode()).hexdigest()[:32]
            ctx.out.append(
                BudgetAlert(
                    digest,
                    budget.name,
                    budget.cost_center,
                    month,
                    threshold,
                    budget.unit,
                    used,
                    budget.limit,
                    ctx.now_ms,
                )
            )


def _used(budget: Budget, usage: list[Any]) -> Decimal:
    if budget.unit is BudgetUnit.GPU_HOURS:
        return nano_to_decimal(usage[0])
    return usage[1].get(budget.currency, _ZERO)


def _budget_statuses(ctx: _Ctx) -> None:
    if not ctx.touched:
        return
    state = ctx.state
    by_name = {budget.name: budget for budget in state.budgets}
    for name, month in ctx.touched:
        budget = by_name[name]
        usage = state.budget_usage.get((budget.cost_center, month), [0, {}])
        used = _used(budget, usage)
        pct = (EXACT.multiply(used, Decimal(100)) / budget.limit).quantize(_PCT, rounding=ROUND_HALF_EVEN)
        ctx.out.append(
            BudgetStatus(
                name,
                budget.cost_center,
                month,
                budget.unit,
                budget.limit,
                used,
                EXACT.subtract(budget.limit, used),
                pct,
                ctx.now_ms,
            )
        )


# --------------------------------------------------------------------------- pruning


def _prune(ctx: _Ctx) -> None:
    """Forget finished workloads whose hours are all final (past the correction horizon)."""
    state = ctx.state
    assert state.closed_through_ms is not None
    final_before = state.closed_through_ms - state.settings.correction_horizon_ms
    while state.finished_idle:
        uid = next(iter(state.finished_idle))
        if state.finished_idle[uid] > final_before:
            break
        del state.finished_idle[uid]
        book = state.books.pop(uid)
        state.forgotten[uid] = book.finished[0] if book.finished else 0
        ctx.changed[uid] = None


# --------------------------------------------------------------------------- serialization


def _key_text(key: SeriesKey) -> str:
    return f"{key[0]}\t{key[1]}"


def _key_from(text: str) -> SeriesKey:
    flavor, kind = text.rsplit("\t", 1)
    return flavor, kind


def book_to_dict(book: _Book) -> dict[str, Any]:
    """One workload's book as plain JSON-able values (its usage sums can exceed 64 bits)."""
    return _book_to_dict(book)


def book_from_dict(data: dict[str, Any]) -> _Book:
    return _book_from_dict(data)


#: Compact, otherwise json.dumps' defaults (ensure_ascii); one encoder, not one per call.
_encode = json.JSONEncoder(separators=(",", ":")).encode


#: A book's JSON text in three parts: the fields before ``emitted`` (an object's text without
#: its closing brace), the hours of ``emitted`` ('"<hour>":{...}', the oldest already joined
#: by commas into one string: HourTexts), the fields after it (without the opening brace).
#: Strings only, so a snapshot of them does not change with the book.
BookJsonParts = tuple[str, tuple[str, ...], str]


def book_to_json(book: _Book, encode: Callable[[Any], str] | None = None) -> str:
    """``json.dumps(book_to_dict(book), separators=(",", ":"))``, the same text, made without
    re-encoding the closed hours: a shell stores the book after every event, and a tick touches
    every active book, so encoding all of ``emitted`` each time made the fold O(hours kept) per
    book and tick (the hours kept are the correction horizon: 168 by default, the whole trace
    in bench_replay). Each hour's text is kept (``HourTexts``) until ``_emit`` changes that
    hour or the horizon drops it; only the rest of the book (facts, series, event ids) is
    encoded per call. Standard ``json``: the exact usage sums exceed 64 bits. The fields around
    ``emitted`` come from the same ``_book_head``/``_book_tail`` as ``_book_to_dict``
    (tests/unit/core/cost/test_cost_book_json.py compares the two texts). ``encode``: a faster
    encoder that gives the same text (the shell's, which may use orjson)."""
    return join_book_json(book_json_parts(book, encode))


def book_json_parts(book: _Book, encode: Callable[[Any], str] | None = None) -> BookJsonParts:
    """``book_to_json``'s text, not yet joined: joining copies every hour's text, and a shell
    that stores a book once per batch of events joins only the parts it stores."""
    encode = encode or _encode
    emitted = book.emitted
    if len(book.hour_texts) != len(emitted):  # not kept in step (a book built by hand): start over
        book.hour_texts = HourTexts(emitted)

    def encode_hour(hour: int) -> str:
        return f'"{hour}":{encode({_key_text(key): entry for key, entry in emitted[hour].items()})}'

    hours = book.hour_texts.parts(encode_hour)
    return encode(_book_head(book))[:-1], hours, encode(_book_tail(book))[1:]


def join_book_json(parts: BookJsonParts) -> str:
    head, hours, tail = parts
    return f'{head},"emitted":{{{",".join(hours)}}},{tail}'


def restore_books(state: CostState, books: Iterable[_Book]) -> CostState:
    """Put stored books into a state whose watermark is known, re-deriving the active set and
    the finished-idle queue from the books themselves (so a shell stores neither: each book
    is self-contained and a crash between two book writes cannot lose a workload)."""
    idle: list[tuple[int, str]] = []
    for book in books:
        state.books[book.uid] = book
        reaches = _reaches_past_billed(
            book, _extent(*_intervals(book), book.billed_through_ms if book.billed_through_ms is not None else 0)
        )
        if reaches and book.uid not in state.active:
            _activate(state, book)
        elif book.finished is not None and book.billed_through_ms is not None:
            idle.append((book.billed_through_ms, book.uid))
    for billed, uid in sorted(idle):
        state.finished_idle[uid] = billed
    return state


def _book_head(book: _Book) -> dict[str, Any]:
    """A book's fields before ``emitted``, in their stored order."""
    return {
        "uid": book.uid,
        "namespace": book.namespace,
        "workloadName": book.workload_name,
        "labels": [list(pair) for pair in book.labels],
        "seq": book.seq,
        "resStarts": book.res_starts,
        "resEnds": book.res_ends,
        "podStarts": book.pod_starts,
        "podEnds": book.pod_ends,
        "allEnds": book.all_ends,
        "finished": book.finished,
        "billedThroughMs": book.billed_through_ms,
    }


def _book_tail(book: _Book) -> dict[str, Any]:
    """A book's fields after ``emitted``, in their stored order."""
    return {
        "series": {_key_text(key): values for key, values in book.series.items()},
        "seen": sorted(book.seen),
    }


def _book_to_dict(book: _Book) -> dict[str, Any]:
    return {
        **_book_head(book),
        "emitted": {
            str(hour): {_key_text(key): entry for key, entry in entries.items()}
            for hour, entries in book.emitted.items()
        },
        **_book_tail(book),
    }


def _book_from_dict(data: dict[str, Any]) -> _Book:
    emitted = {
        int(hour): {_key_from(key): list(entry) for key, entry in entries.items()}
        for hour, entries in data["emitted"].items()
    }
    return _Book(
        uid=data["uid"],
        namespace=data["namespace"],
        workload_name=data["workloadName"],
        labels=tuple((k, v) for k, v in data["labels"]),
        seq=data["seq"],
        res_starts=[list(fact) for fact in data["resStarts"]],
        res_ends=[list(fact) for fact in data["resEnds"]],
        pod_starts={pod: [list(fact) for fact in facts] for pod, facts in data["podStarts"].items()},
        pod_ends={pod: [list(fact) for fact in facts] for pod, facts in data["podEnds"].items()},
        all_ends=[list(fact) for fact in data["allEnds"]],
        finished=list(data["finished"]) if data["finished"] is not None else None,
        billed_through_ms=data["billedThroughMs"],
        emitted=emitted,
        series={_key_from(key): list(values) for key, values in data["series"].items()},
        seen=set(data["seen"]),
        hour_texts=HourTexts(emitted),
    )


def state_to_dict(state: CostState) -> dict[str, Any]:
    """The state as plain JSON-able values (str, int, list, dict, None); Decimals as strings."""
    s = state.settings
    return {
        "version": 1,
        "settings": {
            "costCenterLabel": s.cost_center_label,
            "defaultCostCenter": s.default_cost_center,
            "closeDelayMs": s.close_delay_ms,
            "correctionHorizonMs": s.correction_horizon_ms,
            "billingAccountId": s.billing_account_id,
            "defaultCurrency": s.default_currency,
            "closeOnTicksOnly": s.close_on_ticks_only,
        },
        "watermarkMs": state.watermark_ms,
        "closedThroughMs": state.closed_through_ms,
        "books": [_book_to_dict(book) for book in state.books.values()],
        "active": list(state.active),
        "finishedIdle": [[uid, at] for uid, at in state.finished_idle.items()],
        "forgotten": dict(state.forgotten),
        "namespaceLabels": {ns: dict(labels) for ns, labels in state.namespace_labels.items()},
        "priceList": price_list_to_dict(state.price_list) if state.price_list is not None else None,
        "budgets": [budget_to_dict(budget) for budget in state.budgets],
        "budgetUsage": [
            [cc, month, usage[0], {currency: str(cost) for currency, cost in usage[1].items()}]
            for (cc, month), usage in state.budget_usage.items()
        ],
        "alertsSent": [list(key) for key in state.alerts_sent],
        "configAt": dict(state.config_at),
    }


def state_from_dict(data: dict[str, Any]) -> CostState:
    if data.get("version") != 1:
        raise ValueError(f"unsupported cost state version {data.get('version')!r}")
    s = data["settings"]
    books = [_book_from_dict(book) for book in data["books"]]
    state = CostState(
        settings=CostSettings(
            cost_center_label=s["costCenterLabel"],
            default_cost_center=s["defaultCostCenter"],
            close_delay_ms=s["closeDelayMs"],
            correction_horizon_ms=s["correctionHorizonMs"],
            billing_account_id=s["billingAccountId"],
            default_currency=s["defaultCurrency"],
            close_on_ticks_only=bool(s.get("closeOnTicksOnly", False)),
        ),
        watermark_ms=data["watermarkMs"],
        closed_through_ms=data["closedThroughMs"],
        books={book.uid: book for book in books},
        finished_idle={uid: at for uid, at in data["finishedIdle"]},
        forgotten=dict(data["forgotten"]),
        namespace_labels={ns: dict(labels) for ns, labels in data["namespaceLabels"].items()},
        price_list=price_list_from_dict(data["priceList"]) if data["priceList"] is not None else None,
        budgets=tuple(budget_from_dict(budget) for budget in data["budgets"]),
        budget_usage={
            (cc, month): [gpu_nano, {currency: Decimal(cost) for currency, cost in costs.items()}]
            for cc, month, gpu_nano, costs in data["budgetUsage"]
        },
        alerts_sent={(name, month, int(t)): None for name, month, t in data["alertsSent"]},
        config_at=dict(data["configAt"]),
    )
    for uid in data["active"]:
        _activate(state, state.books[uid])
    return state
