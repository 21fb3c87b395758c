"""Parsing of human-written rates, sizes and durations ("500M", "40TB", "8ms").

In a config a bare number is in the field's unit (`timeout_seconds: 2`); on the command line a
duration or a rate needs its unit (`parse_cli_duration`, `parse_cli_rate`, `parse_packet_rate`):
`--rtt 8` might be 8 ms or 8 s, and read as seconds it planned a transfer of 147 days."""

from __future__ import annotations

import math
import re
from decimal import Decimal

_SI = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_BIN = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgtp]i?)?\s*(b|bit|bits|bps|bit/s|B)?\s*$", re.I)


# Longer strings are refused before any regular expression sees them: the patterns
# below backtrack quadratically on a long run of digits (16,000 digits took 22 s).
_MAX_TEXT = 64


def _number(value: object, what: str, example: str) -> float:
    """A YAML/JSON number (not a string) as a finite float.

    Anything else (null, a list, a mapping, a boolean) and numbers that are not finite
    (.inf, NaN, 1e999, an integer too large for a float) are a ValueError naming `what`,
    never a TypeError or OverflowError: config validation turns ValueErrors into messages.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a boolean" if isinstance(value, bool) else "null" if value is None else f"a {type(value).__name__}"
        raise ValueError(f"{what} must be a number or a string like {example!r}, not {kind}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{what} is too large") from None
    return _finite(number, what)


def _finite(number: float, what: str) -> float:
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number")
    return number


def _match(pattern: re.Pattern[str], text: str, what: str, examples: str) -> re.Match[str]:
    m = pattern.match(text) if len(text) <= _MAX_TEXT else None
    if not m:
        raise ValueError(f"{what}: cannot read {_show(text)} (expected e.g. {examples})")
    return m


def _show(text: str, limit: int = 40) -> str:
    """A user's string for an error message, cut short (a config may hold megabytes)."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def parse_quantity(value: object, what: str) -> float:
    """'500M' -> 5e8, '4Mi' -> 4194304, '40TB' -> 4e13; numbers pass through.

    SI prefixes are powers of 1000, as iperf3's -b; 'Ki'/'Mi'/... powers of 1024.
    The trailing unit letter (b, bit, B) is accepted and ignored: the caller's
    field says whether it holds bits or bytes. Always a finite number or a ValueError.
    """
    if isinstance(value, str):
        m = _match(_NUMBER, value, what, "500M, 2G, 4Mi")
        prefix = (m.group(2) or "").lower()
        number = _finite(float(m.group(1)) * (_BIN[prefix] if prefix in _BIN else _SI[prefix]), what)
    else:
        number = _number(value, what, "500M")
    if number < 0:
        raise ValueError(f"{what} must not be negative")
    return number


def format_bits(bits_per_second: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits_per_second >= scale:
            return f"{bits_per_second / scale:.3g} {unit}"
    return f"{bits_per_second:.0f} bit/s"


def format_seconds(seconds: float) -> str:
    if 0 < seconds < 1e-6:  # a clock error bound of a shared clock, a stated figure
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|ms|s|m|h|d)?\s*$")
_DURATION_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
# A number alone: on the command line, refused for a duration or a rate (zero aside: it is zero in any unit).
_BARE = re.compile(r"^\s*[0-9]*\.?[0-9]+(?:e[0-9]+)?\s*$", re.I)


def parse_duration(value: object, what: str) -> float:
    """'4ms' -> 0.004, '250us' -> 0.00025, '1m' -> 60, '1d' -> 86400; a bare number is seconds."""
    if isinstance(value, str):
        m = _match(_DURATION, value, what, "4ms, 250us, 1.5s, 1m")
        seconds = _finite(float(m.group(1)) * _DURATION_SCALE[m.group(2)], what)
    else:
        seconds = _number(value, what, "4ms")
    if seconds < 0:
        raise ValueError(f"{what} must not be negative")
    return seconds


def parse_ratio(value: object, what: str) -> float:
    """'1%' -> 0.01; a bare number is a ratio from 0 to 1."""
    if isinstance(value, str):
        text = value.strip()
        try:
            if len(text) > _MAX_TEXT:
                raise ValueError(text)
            ratio = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError as exc:
            raise ValueError(f"{what}: cannot read {_show(value)} (expected e.g. 1%, 0.01)") from exc
    else:
        ratio = _number(value, what, "1%")
    if not 0 <= ratio <= 1:  # also refuses NaN
        raise ValueError(f"{what} must be between 0 and 1 (0% and 100%)")
    return ratio


_DECIMAL_SCALE = {"us": Decimal("0.000001"), "ms": Decimal("0.001")}


def _unitless(text: str) -> bool:
    return len(text) <= _MAX_TEXT and _BARE.match(text) is not None and float(text) != 0


def parse_cli_duration(text: str, what: str, unit: str = "s") -> float:
    """A duration given on the command line, which must say its unit: '8' is refused with the
    forms to write instead, in `unit` (the flag's usual one: "us", "ms" or "s") and another."""
    if _unitless(text):
        n = text.strip()
        # Decimal: the other form exact and without an exponent, which a duration cannot have.
        other = (
            f"{(Decimal(n) * 1000).normalize():f}ms"
            if unit == "s"
            else f"{(Decimal(n) * _DECIMAL_SCALE[unit]).normalize():f}s"
        )
        raise ValueError(f"{what}: {n!r} has no unit; write e.g. {n}{unit} or {other}")
    return parse_duration(text, what)


def parse_cli_rate(text: str, what: str) -> float:
    """A bit rate given on the command line: an SI prefix as iperf3's -b ('500M') or a unit
    ('500Mbit/s', '9600bit/s'); '500' alone is refused (500 bit/s is rarely what was meant)."""
    if _unitless(text):
        n = text.strip()
        raise ValueError(f"{what}: {n!r} has no unit; write e.g. {n}M or {n}Mbit/s (bits per second)")
    return parse_quantity(text, what)


_PACKET_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(?:/s|pps)\s*$")


def parse_packet_rate(text: str, what: str) -> float:
    """Packets per second on the command line: '50/s' or '50pps' (a bare number is refused)."""
    if _unitless(text):
        raise ValueError(f"{what}: {text.strip()!r} has no unit; write e.g. {text.strip()}/s (packets per second)")
    m = _match(_PACKET_RATE, text, what, "50/s, 1000pps")
    return _finite(float(m.group(1)), what)


def format_prometheus_duration(seconds: float) -> str:
    """Seconds as Prometheus writes a duration (whole units: 1m, 90s, 1500ms)."""
    ms = round(seconds * 1000)
    for unit, scale in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % scale == 0:
            return f"{ms // scale}{unit}"
    return f"{ms}ms"
