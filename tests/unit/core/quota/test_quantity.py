import pytest

from services.core.quantity import (
    UNLIMITED,
    QuantityError,
    format_milli,
    milli_to_units,
    parse_quantity_milli,
)


@pytest.mark.parametrize(
    ("value", "milli"),
    [
        ("500m", 500),
        ("8", 8000),
        (8, 8000),
        (1.5, 1500),
        ("1.5", 1500),
        ("16Gi", 16 * 2**30 * 1000),
        ("1Ki", 1024 * 1000),
        ("2k", 2_000_000),
        ("1M", 10**9),
        ("1e3", 1_000_000),
        ("0.1m", 1),  # rounded up, like Kubernetes MilliValue
        ("100u", 1),
        ("0", 0),
        ("-2", -2000),
        (" 4 ", 4000),
    ],
)
def test_parse_quantity_milli(value, milli):
    assert parse_quantity_milli(value) == milli


@pytest.mark.parametrize("value", ["", "abc", "1.2.3", "5Gb", "Gi", True, None, [1], float("nan")])
def test_parse_quantity_rejects(value):
    with pytest.raises(QuantityError):
        parse_quantity_milli(value)


@pytest.mark.parametrize(
    ("milli", "resource", "text"),
    [
        (4000, "nvidia.com/gpu", "4"),
        (500, "cpu", "500m"),
        (16 * 2**30 * 1000, "memory", "16Gi"),
        (1500 * 1000, "memory", "1500"),
        (0, "memory", "0"),
        (-3000, "cpu", "-3"),
    ],
)
def test_format_milli(milli, resource, text):
    assert format_milli(milli, resource) == text


def test_units_and_unlimited():
    assert milli_to_units(8000) == 8
    assert milli_to_units(1500) == 1.5
    assert UNLIMITED is None
