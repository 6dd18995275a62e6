"""The JSON text of each billed hour of a book, kept between events (``book_json_parts``).

A book's stored text holds every hour it billed within the correction horizon: 168 hours by
default, the whole trace in bench_replay (up to ~3,500 hours, ~300 KB). ``_emit`` marks an hour
changed and only that hour is encoded again. But each event that touches a book also hands the
shell a snapshot of its text (the shell stores the last one of a batch, ADR 0001), and a
snapshot that listed every hour's text copied O(hours) per event: in the Alibaba replay that
copy was about a tenth of the cost service's CPU.

So the oldest hours are kept joined as one string, the *run*, and only the hours after it are
listed one by one: a snapshot is the run plus at most :data:`RUN_MIN` hour texts. The run is
a prefix of the hours in their order; a change to an hour inside it dissolves it (it is built
again from the texts at the next snapshot), and the horizon dropping the oldest hour cuts that
hour's text off its front.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["RUN_MIN", "HourTexts"]

#: Hours listed one by one before they are joined onto the run.
RUN_MIN = 64


class HourTexts:
    """hour -> the text ``"<hour>":{...}`` of a book's ``emitted``, in the same order.

    ``texts`` has every hour of ``emitted`` (None: changed since its text was made, listed in
    ``stale``). The first ``len(run_hours)`` hours of ``texts`` are joined in ``run``; the
    others are in ``recent``, in order. Strings only go out, so a snapshot never changes."""

    __slots__ = ("texts", "stale", "run", "run_hours", "recent")

    def __init__(self, hours: Iterable[int] = ()) -> None:
        self.texts: dict[int, str | None] = dict.fromkeys(hours)
        self.stale: set[int] = set(self.texts)
        self.run = ""
        self.run_hours: set[int] = set()
        self.recent: list[int] = list(self.texts)

    def __len__(self) -> int:
        return len(self.texts)

    def changed(self, hour: int) -> None:
        """``_emit`` changed this hour (a new hour goes after every other, as in ``emitted``)."""
        if hour not in self.texts:
            self.recent.append(hour)
        elif hour in self.run_hours:  # a correction inside the run: list its hours again
            self.recent = list(self.texts)
            self.run, self.run_hours = "", set()
        self.texts[hour] = None
        self.stale.add(hour)

    def drop_oldest(self, hour: int) -> None:
        """The horizon dropped ``hour``, the first of ``emitted``."""
        text = self.texts.pop(hour, None)
        self.stale.discard(hour)
        if hour in self.run_hours:  # the run's first text, never stale: cut it and its comma off
            self.run_hours.discard(hour)
            self.run = self.run[len(text) + 1 :] if self.run_hours else ""  # type: ignore[arg-type]
        elif self.recent and self.recent[0] == hour:
            del self.recent[0]

    def parts(self, encode_hour: Callable[[int], str], run_min: int = RUN_MIN) -> tuple[str, ...]:
        """The texts of every hour, in order, as few strings as the run allows (joined with
        commas they are the hours' text). ``encode_hour(hour)`` makes a stale hour's text."""
        texts = self.texts
        for hour in self.stale:
            texts[hour] = encode_hour(hour)
        self.stale.clear()
        recent = self.recent
        if len(recent) >= run_min:
            joined = ",".join([texts[hour] for hour in recent])  # type: ignore[misc]  # none is stale
            self.run = f"{self.run},{joined}" if self.run else joined
            self.run_hours.update(recent)
            recent = self.recent = []
        listed: tuple[str, ...] = tuple([texts[hour] for hour in recent])  # type: ignore[misc]
        return (self.run, *listed) if self.run else listed
