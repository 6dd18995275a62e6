"""Kubernetes resource quantities ("16Gi", "500m", "1e3") as exact fractions.

TODO(quantity): replace with `services.core.quantity` (parse_quantity_milli) once it
lands; this private parser exists only so the policy layer does not wait for it.
The wrapper in `quantity.py` already prefers the core module when importable.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
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
_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse_quantity(value: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity exactly; raises ValueError when malformed."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a quantity: {value!r}")
        return Fraction(value)
    m = _RE.match(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = Fraction(m.group(1)), m.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def parse_quantity_milli(value: str | int | float) -> int:
    """Milli-units, rounded up as Kubernetes' MilliValue does."""
    return math.ceil(parse_quantity(value) * 1000)
