"""Kubernetes quantities as integer milli-units: the one quantity type for quota arithmetic.

Every amount Quartermaster computes with (GPUs, CPU, memory, pods, quota limits) is an
``int`` of *milli-units*: ``"500m"`` CPU is ``500``, ``"8"`` GPUs is ``8000``, ``"16Gi"`` of
memory is ``16 * 2**30 * 1000``. Integer arithmetic keeps sums exact and comparisons cheap.

A limit that is not set (Kueue's ``borrowingLimit``/``lendingLimit`` left out) is
:data:`UNLIMITED`, which is ``None``: test with ``limit is UNLIMITED``; never add to it.

Public API (other teams import these):

* :func:`parse_quantity_milli` — ``"500m"`` / ``"16Gi"`` / ``8`` / ``1.5`` → ``int`` milli-units
  (rounded up, as Kubernetes' ``MilliValue`` does); raises :class:`QuantityError`.
* :func:`format_milli` — milli-units → a Kubernetes quantity string (``"4"``, ``"500m"``,
  ``"16Gi"``), as Kueue prints amounts in its messages.
* :func:`milli_to_units` — milli-units → a plain number for JSON (``int`` when whole).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Final

__all__ = [
    "MILLI",
    "UNLIMITED",
    "QuantityError",
    "format_milli",
    "milli_to_units",
    "parse_quantity_milli",
]

#: Milli-units per whole unit.
MILLI: Final = 1000

#: A limit that is not set. Kueue models it as a nil pointer; we use ``None``.
UNLIMITED: Final = None

_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: Final = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY_RE: Final = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)
_MEMORY_LIKE: Final = ("memory", "storage", "hugepages")


class QuantityError(ValueError):
    """A value is not a Kubernetes quantity."""


def parse_quantity_milli(value: object) -> int:
    """Parse a Kubernetes quantity into integer milli-units, rounding up like ``MilliValue``.

    Accepts strings (``"500m"``, ``"16Gi"``, ``"1.5"``, ``"1e3"``) and the numbers YAML
    produces (``8``, ``1.5``). Negative quantities are returned negative; callers that need
    a non-negative value check it themselves (and name the field in their error).
    """
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return value * MILLI
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a quantity")
        return _ceil(Fraction(repr(value)) * MILLI)
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    text = value.strip()
    match = _QUANTITY_RE.match(text)
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity (expected e.g. 8, 500m, 1.5, 16Gi)")
    number = Fraction(match.group("num"))
    if match.group("exp"):
        number *= Fraction(10) ** int(match.group("exp")[1:])
    else:
        suffix = match.group("suffix") or ""
        number *= _BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]
    return _ceil(number * MILLI)


def _ceil(number: Fraction) -> int:
    return -((-number.numerator) // number.denominator)


def milli_to_units(milli: int) -> int | float:
    """Milli-units as a plain JSON number: an ``int`` when whole, else a ``float``."""
    if milli % MILLI == 0:
        return milli // MILLI
    return milli / MILLI


def format_milli(milli: int, resource: str = "") -> str:
    """Format milli-units the way Kubernetes prints a quantity.

    Whole values print as integers (``"4"``); memory-like resources print with the largest
    exact binary suffix (``"16Gi"``); fractional values print in milli (``"500m"``).
    """
    if milli % MILLI != 0:
        return f"{milli}m"
    units = milli // MILLI
    if units and any(word in resource for word in _MEMORY_LIKE):
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            if units % _BINARY[suffix] == 0:
                return f"{units // _BINARY[suffix]}{suffix}"
    return str(units)
