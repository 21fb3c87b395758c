"""Parsing of human-written rates and sizes ("500M", "40TB")."""

from __future__ import annotations

import re

_SI = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_BIN = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgtp]i?)?\s*(b|bit|bits|bps|bit/s|B)?\s*$", re.I)


def parse_quantity(value: int | float | str, what: str) -> float:
    """'500M' -> 5e8, '4Mi' -> 4194304, '40TB' -> 4e13; numbers pass through.

    SI prefixes are powers of 1000, as iperf3's -b; 'Ki'/'Mi'/... powers of 1024.
    The trailing unit letter (b, bit, B) is accepted and ignored: the caller's
    field says whether it holds bits or bytes.
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number or a string like '500M', not a boolean")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        m = _NUMBER.match(value)
        if not m:
            raise ValueError(f"{what}: cannot read {value!r} (expected e.g. 500M, 2G, 4Mi)")
        prefix = (m.group(2) or "").lower()
        number = float(m.group(1)) * (_BIN[prefix] if prefix in _BIN else _SI[prefix])
    if number < 0:
        raise ValueError(f"{what} must not be negative")
    return number


def format_bits(bits_per_second: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits_per_second >= scale:
            return f"{bits_per_second / scale:.3g} {unit}"
    return f"{bits_per_second:.0f} bit/s"


def format_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)?\s*$")
_DURATION_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}


def parse_duration(value: int | float | str, what: str) -> float:
    """'4ms' -> 0.004, '250us' -> 0.00025; a bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration like '4ms', not a boolean")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(value)
        if not m:
            raise ValueError(f"{what}: cannot read {value!r} (expected e.g. 4ms, 250us, 1.5s)")
        seconds = float(m.group(1)) * _DURATION_SCALE[m.group(2)]
    if seconds < 0:
        raise ValueError(f"{what} must not be negative")
    return seconds


def parse_ratio(value: int | float | str, what: str) -> float:
    """'1%' -> 0.01; a bare number is a ratio from 0 to 1."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a ratio like '1%' or 0.01, not a boolean")
    if isinstance(value, str):
        text = value.strip()
        try:
            ratio = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError as exc:
            raise ValueError(f"{what}: cannot read {value!r} (expected e.g. 1%, 0.01)") from exc
    else:
        ratio = float(value)
    if not 0 <= ratio <= 1:
        raise ValueError(f"{what} must be between 0 and 1 (0% and 100%)")
    return ratio
