"""Human quantities: `16GB`, `16GiB`, `512MB`, `1.5e9`, `50%` (of a reference size), `16GB/s`, `10us`.

Decimal prefixes (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB,
GiB, TiB) powers of 1024, as in every storage vendor's and the IEC's usage.
"""

from __future__ import annotations

import math
import re

from .errors import OptschedError

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtTpP]?)(i?)([bB]?)\s*$")
_POW = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ns|us|µs|ms|s|min|h)?\s*$")
_TIME_SCALE = {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}


def is_share(value) -> bool:
    """A size written as a percentage ('50%'), which `parse_size` reads only against a reference."""
    return isinstance(value, str) and value.strip().endswith("%")


def parse_size(value: str | int | float, what: str = "size", whole: int | None = None) -> int:
    """Bytes from a number or a string such as '16GB', '16GiB', '512MB', '1.5e9', or '50%' of `whole` bytes
    where the caller has a reference (the CLI's budgets: the keep-everything peak)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return int(value)   # exact, also beyond 2**53 where a float would round
    if is_share(value):
        if whole is None:
            raise OptschedError(f"{what} {value!r}: a percentage means nothing here", hint="write it as 16GB or 512MB")
        share = _bare_number(value.strip()[:-1])
        if share is None or not 0 < share < math.inf:
            raise OptschedError(f"cannot read {what} {value!r}", hint="write a percentage as 50%")
        return int(round(share / 100 * whole))
    return int(round(_amount(value, what)))


def _bare_number(text: str) -> float | None:
    """The number a string holds with no unit at all ('50', '1e-3'), else None."""
    m = _SIZE.match(text)
    return None if not m or m.group(2) or m.group(3) or m.group(4) else float(m.group(1))


def _amount(value: str | int | float, what: str) -> float:
    """Bytes as a float, unrounded: sizes round it, bandwidths must not."""
    if isinstance(value, bool):
        raise OptschedError(f"{what} must be a number of bytes, not {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        m = _SIZE.match(str(value))
        if not m:
            raise OptschedError(f"cannot read {what} {value!r}",
                                hint="write it as 16GB, 16GiB, 512MB or 1.5e9")
        prefix, binary = m.group(2).lower(), m.group(3)
        base = 1024 if binary else 1000
        if binary and not prefix:
            raise OptschedError(f"cannot read {what} {value!r}", hint="write it as 16GiB or 16GB")
        number = float(m.group(1)) * base ** _POW[prefix]
    if not math.isfinite(number) or number < 0:
        raise OptschedError(f"{what} must be a finite, non-negative number of bytes, not {value!r}")
    return number


def parse_fraction(value: str | int | float, what: str = "fraction") -> float:
    """A fraction from a number or a percentage: '0.01', '1%' and 0.01 are the same. The range is the reader's to
    check (a solver's gap: `SolveOptions`)."""
    if isinstance(value, bool):
        raise OptschedError(f"{what} must be a number, not {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    share = text.endswith("%")
    number = _bare_number(text[:-1] if share else text)
    if number is None:
        raise OptschedError(f"cannot read {what} {value!r}", hint="write it as 0.01 or 1%")
    return number / (100 if share else 1)


def parse_bandwidth(value: str | int | float, what: str = "bandwidth") -> float:
    """Bytes per second from a number or a string such as '16GB/s' or '900GiB/s'."""
    text = value
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("/s"):
            text = text[:-2]
    bw = _amount(text, what)
    if bw <= 0:
        raise OptschedError(f"{what} must be positive, not {value!r}")
    return bw


def parse_time(value: str | int | float, what: str = "time") -> float:
    """Seconds from a number or a string such as '10us', '2.5ms', '60s', '5min'."""
    if isinstance(value, bool):
        raise OptschedError(f"{what} must be a number of seconds, not {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _TIME.match(str(value))
        if not m:
            raise OptschedError(f"cannot read {what} {value!r}", hint="write it as 60, 60s, 2.5ms or 10us")
        seconds = float(m.group(1)) * _TIME_SCALE[m.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise OptschedError(f"{what} must be a finite, non-negative number of seconds, not {value!r}")
    return seconds


def format_size(nbytes: float) -> str:
    """'1.50 GB' style, decimal prefixes, for tables and messages."""
    if nbytes is None or (isinstance(nbytes, float) and not math.isfinite(nbytes)):
        return str(nbytes)
    n = float(nbytes)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


def format_time(seconds: float) -> str:
    """'12.3 ms' style for tables and messages."""
    if seconds is None or not math.isfinite(seconds):
        return str(seconds)
    s = abs(seconds)
    if s == 0:
        return "0 s"
    if s < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if s < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def parse_size_range(value: str, steps: int, what: str = "size range", whole: int | None = None) -> list[int]:
    """Budgets from '2GB..16GB' (`steps` evenly spaced values, both ends
    included), a list '1GB,2GB,4GB', or one size; percentages of `whole` as in `parse_size`."""
    text = str(value).strip()
    if ".." not in text:
        return [parse_size(v, what, whole) for v in text.split(",")]
    lo_text, _, hi_text = text.partition("..")
    lo, hi = parse_size(lo_text, what, whole), parse_size(hi_text, what, whole)
    if lo > hi:
        raise OptschedError(f"{what} {value!r} runs backwards",
                            hint=f"write it as {hi_text.strip()}..{lo_text.strip()}")
    if steps < 1 or (steps == 1 and lo != hi):
        raise OptschedError(f"{what} {value!r} needs at least 2 steps, not {steps}")
    if lo == hi:
        return [lo]
    return [int(round(lo + (hi - lo) * i / (steps - 1))) for i in range(steps)]
