"""HourTexts: joined with commas, a snapshot is always every hour's current text in ``emitted``'s
order, whatever mix of new hours, corrections inside and after the run, and horizon drops came
before; and a snapshot taken earlier keeps the text it had."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.cost.hour_texts import RUN_MIN, HourTexts

ops = st.lists(
    st.one_of(
        st.tuples(st.just("new"), st.integers(0, 400)),  # a new hour (a late one goes last, as in emitted)
        st.tuples(st.just("change"), st.integers(0, 10_000)),  # an existing hour, picked by index
        st.tuples(st.just("drop"), st.just(0)),  # the horizon drops the oldest
        st.tuples(st.just("snapshot"), st.integers(1, 5)),  # with a small run_min, to build runs often
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, start=st.integers(0, 30))
def test_a_snapshot_is_every_hour_in_order_and_never_changes_after(ops, start):
    emitted: dict[int, int] = {hour: 0 for hour in range(start)}  # hour -> version of its entries
    texts = HourTexts(emitted)
    taken: list[tuple[tuple[str, ...], str]] = []

    def encode_hour(hour: int) -> str:
        return f'"{hour}":{{"v":{emitted[hour]}}}'

    def expected() -> str:
        return ",".join(encode_hour(hour) for hour in emitted)

    for op, value in ops:
        if op == "new" and value not in emitted:
            emitted[value] = 0
            texts.changed(value)
        elif op == "change" and emitted:
            hour = list(emitted)[value % len(emitted)]
            emitted[hour] += 1
            texts.changed(hour)
        elif op == "drop" and emitted:
            oldest = next(iter(emitted))
            del emitted[oldest]
            texts.drop_oldest(oldest)
        elif op == "snapshot":
            parts = texts.parts(encode_hour, run_min=value)
            assert ",".join(parts) == expected()
            assert len(parts) <= value + 1  # the run and fewer than run_min listed hours
            taken.append((parts, expected()))
        assert list(texts.texts) == list(emitted)
    assert ",".join(texts.parts(encode_hour)) == expected()
    for parts, text in taken:
        assert ",".join(parts) == text


def test_a_snapshot_of_a_long_book_lists_at_most_run_min_hours():
    texts = HourTexts(range(3_000))
    parts = texts.parts(lambda hour: f'"{hour}":{{}}')
    assert len(parts) == 1 and parts[0].count(",") == 2_999
    for hour in range(3_000, 3_000 + RUN_MIN - 1):
        texts.changed(hour)
    assert len(texts.parts(lambda hour: f'"{hour}":{{}}')) == RUN_MIN  # the run and 63 hours
    texts.changed(3_000 + RUN_MIN - 1)
    assert len(texts.parts(lambda hour: f'"{hour}":{{}}')) == 1  # joined onto the run
