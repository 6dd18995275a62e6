"""Time and quantity arithmetic for the cost ledger: integers inside, ``Decimal`` out.

Rounding rule (the one place it is decided, see ADR 0004):

* Usage is accumulated **exactly** as integers: ``milli-units x milliseconds`` per resource
  (``gpu_milli * duration_ms``, ``cpu_milli * duration_ms``, ``memory_milli * duration_ms``
  where memory is in milli-bytes as :func:`services.core.quantity.parse_quantity_milli`
  returns). Event times are integer epoch milliseconds (UTC), so nothing is lost.
* A ledger quantity (GPU-hours, core-hours, GiB-hours) is an exact ``Decimal`` with
  **9 decimal places** (a nano-unit-hour: 3.6 microseconds of one GPU). Converting the exact
  integer to nano-unit-hours rounds **ROUND_HALF_EVEN**, and it is done *cumulatively per
  series* (workload, flavor, usage kind): a row's quantity is
  ``round(cumulative exact usage after the row) - round(cumulative exact usage before it)``.
  So the rows of a series always sum to the correctly rounded total of the series, no
  matter how it was cut into hours or corrected — cutting at an hour boundary never creates
  or loses a nano-unit.
* Costs are exact ``Decimal`` products of those quantities and the unit prices (no
  rounding in the ledger). Rounding to currency minor units is the exporter's or the
  invoice's business (``billing export --cost-decimals``), ROUND_HALF_EVEN.

The field report case: 16 GPUs reserved 10:00:00, released 10:05:00 without starting is
``16000 milli * 300000 ms`` = ``4.8e9`` GPU-milli-ms = ``1.333333333`` GPU-hours
(4/3 rounded half-even at 9 places).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Context, Decimal
from functools import lru_cache
from typing import Final

__all__ = [
    "GIB_HOUR_DIVISOR",
    "HOUR_MS",
    "MILLI_HOUR_DIVISOR",
    "NANO",
    "QUANTITY_PLACES",
    "ceil_hour",
    "floor_hour",
    "iso_utc",
    "month_bounds_ms",
    "month_key",
    "nano_to_decimal",
    "parse_iso_utc_ms",
    "round_half_even_div",
    "to_nano",
]

HOUR_MS: Final = 3_600_000
#: Decimal places of every ledger quantity.
QUANTITY_PLACES: Final = 9
NANO: Final = 10**QUANTITY_PLACES
#: ``milli-units x ms`` in one unit-hour (GPU-hour, core-hour).
MILLI_HOUR_DIVISOR: Final = 1000 * HOUR_MS
#: ``milli-bytes x ms`` in one GiB-hour.
GIB_HOUR_DIVISOR: Final = 1000 * 2**30 * HOUR_MS

#: Wide enough that products of 9-place quantities and prices are never rounded.
EXACT: Final = Context(prec=60)


def round_half_even_div(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded to the nearest integer, ties to even."""
    if denominator <= 0:
        raise ValueError("denominator must be positive")
    quotient, remainder = divmod(numerator, denominator)  # floor division, remainder >= 0
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def to_nano(exact_milli_ms: int, divisor: int) -> int:
    """Exact ``milli-units x ms`` → nano-unit-hours (int), ROUND_HALF_EVEN."""
    return round_half_even_div(exact_milli_ms * NANO, divisor)


def nano_to_decimal(nano: int) -> Decimal:
    """Nano-unit-hours (int) → ``Decimal`` with exactly 9 decimal places."""
    return Decimal(nano).scaleb(-QUANTITY_PLACES)


def floor_hour(at_ms: int) -> int:
    return at_ms - at_ms % HOUR_MS


def ceil_hour(at_ms: int) -> int:
    return -((-at_ms) // HOUR_MS) * HOUR_MS


@lru_cache(maxsize=65536)
def iso_utc(at_ms: int) -> str:
    """Epoch ms → ``2023-07-01T10:00:00Z`` (milliseconds shown only when not whole seconds)."""
    seconds, millis = divmod(at_ms, 1000)
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{millis:03d}Z" if millis else f"{text}Z"


def parse_iso_utc_ms(text: str) -> int:
    """``2023-07-01T10:00:00Z`` (or with an offset, or a date) → epoch ms. Naive means UTC."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


@lru_cache(maxsize=4096)
def month_key(at_ms: int) -> str:
    """The UTC calendar month of an instant: ``"2023-07"`` (budget period)."""
    moment = datetime.fromtimestamp(at_ms // 1000, tz=UTC)
    return f"{moment.year:04d}-{moment.month:02d}"


@lru_cache(maxsize=4096)
def month_bounds_ms(at_ms: int) -> tuple[int, int]:
    """``[start, end)`` of the UTC calendar month containing ``at_ms``, in epoch ms."""
    moment = datetime.fromtimestamp(at_ms // 1000, tz=UTC)
    start = datetime(moment.year, moment.month, 1, tzinfo=UTC)
    end = datetime(moment.year + (moment.month == 12), moment.month % 12 + 1, 1, tzinfo=UTC)
    return int(start.timestamp()) * 1000, int(end.timestamp()) * 1000
