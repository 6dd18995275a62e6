"""Quantity parsing for the policy layer: the core module when present, else ours."""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

try:  # pragma: no cover - depends on another engineer's module landing
    from services.core.quantity import parse_quantity_milli as _core_milli  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    _core_milli = None

from services.policy._quantity import parse_quantity
from services.policy._quantity import parse_quantity_milli as _own_milli


def quantity_milli(value: str | int | float) -> int:
    """Integer milli-units of a Kubernetes quantity; ValueError if malformed."""
    if isinstance(value, str):
        return _cached_milli(value)
    return _uncached_milli(value)


@lru_cache(maxsize=4096)
def _cached_milli(value: str) -> int:
    if value.isdigit():
        return int(value) * 1000
    return _uncached_milli(value)


def _uncached_milli(value: str | int | float) -> int:
    if _core_milli is not None:
        try:
            return int(_core_milli(value))
        except (TypeError, AttributeError):
            pass
    return _own_milli(value)


def canonical(value: Fraction) -> str:
    """A canonical string for a quantity, so equal quantities compare equal in CEL."""
    if value.denominator == 1:
        return str(value.numerator)
    for scale, suffix in ((1000, "m"), (10**6, "u"), (10**9, "n")):
        scaled = value * scale
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    return repr(float(value))


__all__ = ["canonical", "parse_quantity", "quantity_milli"]
