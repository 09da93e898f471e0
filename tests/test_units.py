"""Human quantities: sizes, bandwidths, times (optsched.units)."""

from __future__ import annotations

import math

import pytest

from optsched.errors import OptschedError
from optsched.units import (
    format_size,
    format_time,
    parse_bandwidth,
    parse_fraction,
    parse_size,
    parse_size_range,
    parse_time,
)


@pytest.mark.parametrize("text, expected", [
    ("16GB", 16 * 10**9),
    ("16GiB", 16 * 2**30),
    ("512MB", 512 * 10**6),
    ("512MiB", 512 * 2**20),
    ("1.5e9", 1_500_000_000),
    ("1.5GB", 1_500_000_000),
    ("16 GB", 16 * 10**9),
    (" 16gb ", 16 * 10**9),
    ("4kB", 4000),
    ("4KiB", 4096),
    ("2TB", 2 * 10**12),
    ("1TiB", 2**40),
    ("100", 100),
    ("100B", 100),
    ("0", 0),
    (".5kB", 500),
])
def test_parse_size_strings(text, expected):
    got = parse_size(text)
    assert got == expected
    assert isinstance(got, int)


@pytest.mark.parametrize("value, expected", [(0, 0), (123, 123), (1.5e9, 1_500_000_000), (2**60 + 1, 2**60 + 1)])
def test_parse_size_numbers(value, expected):
    got = parse_size(value)
    assert got == expected
    assert isinstance(got, int)


@pytest.mark.parametrize("bad", ["", "GB", "16XB", "16GBs", "sixteen", "16iB", "1e", "--1", "-1", "-1GB",
                                 "nan", "inf", "1e400", -1, -0.5, float("nan"), float("inf"), True, None, [16]])
def test_parse_size_rejects(bad):
    with pytest.raises(OptschedError):
        parse_size(bad)


def test_parse_size_percentages_of_a_reference():
    assert parse_size("50%", whole=1000) == 500
    assert parse_size(" 12.5 % ", whole=80) == 10
    assert parse_size_range("25%..75%", 3, whole=1000) == [250, 500, 750]
    assert parse_size_range("10%,1kB", 1, whole=1000) == [100, 1000]
    with pytest.raises(OptschedError, match="a percentage means nothing here"):
        parse_size("50%")
    for bad in ("0%", "%", "x%", "5GB%", "inf%", "-5%"):
        with pytest.raises(OptschedError, match="cannot read"):
            parse_size(bad, whole=1000)


def test_parse_size_message_names_what():
    with pytest.raises(OptschedError, match="memory of device 'gpu0'"):
        parse_size("lots", "memory of device 'gpu0'")


@pytest.mark.parametrize("text, expected", [
    ("16GB/s", 16e9),
    ("900GiB/s", 900 * 2**30),
    ("25GB", 25e9),
    (" 12.5 GB/s ", 12.5e9),
    (16e9, 16e9),
    (0.5, 0.5),
    ("1.5B/s", 1.5),
])
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("bad", ["0GB/s", 0, -1, "-5GB/s", "fast", "16GB/h", float("nan"), float("inf")])
def test_parse_bandwidth_rejects(bad):
    with pytest.raises(OptschedError):
        parse_bandwidth(bad)


@pytest.mark.parametrize("text, expected", [
    ("10us", 10e-6),
    ("10µs", 10e-6),
    ("2.5ms", 2.5e-3),
    ("60s", 60.0),
    ("60", 60.0),
    ("5min", 300.0),
    ("1h", 3600.0),
    ("100ns", 100e-9),
    (0, 0.0),
    (1.25, 1.25),
])
def test_parse_time(text, expected):
    assert parse_time(text) == pytest.approx(expected, rel=1e-15, abs=0)


@pytest.mark.parametrize("bad", ["10 parsecs", "", "us", "-1s", -1, -1e-9, float("nan"), float("inf"), "nan",
                                 True])
def test_parse_time_rejects(bad):
    with pytest.raises(OptschedError):
        parse_time(bad)



@pytest.mark.parametrize("text, expected", [("1%", 0.01), ("0.5 %", 0.005), ("0.05", 0.05), ("1e-3", 0.001),
                                            (0.2, 0.2), (0, 0.0), ("100%", 1.0)])
def test_parse_fraction(text, expected):
    assert parse_fraction(text) == pytest.approx(expected, rel=1e-15, abs=0)


@pytest.mark.parametrize("bad", ["", "%", "abc", "5GB", "-1", "1%%", True])
def test_parse_fraction_rejects(bad):
    with pytest.raises(OptschedError, match="--gap"):
        parse_fraction(bad, "--gap")

def test_format_size_and_time():
    assert format_size(0) == "0 B"
    assert format_size(999) == "999 B"
    assert format_size(1_500_000_000) == "1.50 GB"
    assert format_size(16e12) == "16.00 TB"
    assert format_size(2e15) == "2000.00 TB"
    assert format_time(0) == "0 s"
    assert format_time(12.5e-6) == "12.5 us"
    assert format_time(0.0123) == "12.30 ms"
    assert format_time(2.5) == "2.500 s"
    assert format_time(math.inf) == "inf"
