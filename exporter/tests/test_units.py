from typing import Any

import pytest
from cpu import cpu_seconds

from pathprobe.units import (
    format_bits,
    format_prometheus_duration,
    parse_cli_duration,
    parse_cli_rate,
    parse_duration,
    parse_packet_rate,
    parse_quantity,
    parse_ratio,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500M", 500e6),
        ("2G", 2e9),
        ("1.5k", 1500),
        ("4Mi", 4 * 2**20),
        ("40TB", 40e12),
        ("100Mbit", 100e6),
        (7, 7.0),
        ("6291456", 6291456),
    ],
)
def test_quantities(text: str | int, value: float) -> None:
    assert parse_quantity(text, "x") == value


@pytest.mark.parametrize("bad", ["fast", "-1", "5 parsecs", True])
def test_bad_quantities_say_what(bad: str | bool) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_quantity(bad, "rate")


def test_durations_and_ratios() -> None:
    assert parse_duration("4ms", "d") == pytest.approx(0.004)
    assert parse_duration("250us", "d") == pytest.approx(0.00025)
    assert parse_duration(1.5, "d") == 1.5
    assert parse_ratio("2%", "l") == pytest.approx(0.02)
    assert parse_ratio(0.1, "l") == 0.1
    with pytest.raises(ValueError):
        parse_ratio("120%", "loss")
    with pytest.raises(ValueError):
        parse_duration("soon", "delay")


def test_format_bits() -> None:
    assert format_bits(4.75e9) == "4.75 Gbit/s"
    assert format_bits(224e6) == "224 Mbit/s"


@pytest.mark.parametrize("parse", [parse_quantity, parse_duration, parse_ratio])
@pytest.mark.parametrize("bad", [None, [], {}, float("inf"), float("nan"), -float("inf"), 10**400, "1e999"])
def test_anything_not_a_finite_number_is_a_value_error(parse: Any, bad: object) -> None:
    # Regression: None, lists and dicts raised TypeError, 10**400 OverflowError, and
    # inf passed: errors that config validation could not turn into a message.
    with pytest.raises(ValueError, match="what"):
        parse(bad, "what")


@pytest.mark.parametrize("parse", [parse_quantity, parse_duration, parse_ratio])
def test_a_long_string_is_refused_at_once(parse: Any) -> None:
    # The patterns backtracked quadratically on a run of digits: 16,000 digits took 22 s. Now
    # within a thousand parses of a plain value, in the same run (a machine's speed moves both).
    long = "9" * 20_000 + "x"
    with pytest.raises(ValueError, match="cannot read"):
        parse(long, "what")

    def refuse() -> None:
        with pytest.raises(ValueError):
            parse(long, "what")

    assert cpu_seconds(refuse, reps=5) < 1000 * cpu_seconds(lambda: parse("1", "what"), reps=5)


@pytest.mark.parametrize(
    ("text", "unit", "says"),
    [
        ("8", "ms", "'8' has no unit; write e.g. 8ms or 0.008s"),
        ("10", "s", "'10' has no unit; write e.g. 10s or 10000ms"),
        ("2", "us", "'2' has no unit; write e.g. 2us or 0.000002s"),
        (" 1.5 ", "s", "'1.5' has no unit; write e.g. 1.5s or 1500ms"),
    ],
)
def test_a_duration_on_the_command_line_needs_its_unit(text: str, unit: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"^--x: {says}$"):
        parse_cli_duration(text, "--x", unit)


@pytest.mark.parametrize(
    ("text", "seconds"), [("8ms", 0.008), ("250us", 250e-6), ("1m", 60), ("2h", 7200), ("1d", 86400), ("0", 0)]
)
def test_a_duration_with_its_unit_is_read(text: str, seconds: float) -> None:
    assert parse_cli_duration(text, "--x") == pytest.approx(seconds)


def test_a_rate_on_the_command_line_needs_a_prefix_or_a_unit() -> None:
    with pytest.raises(ValueError, match=r"'500' has no unit; write e.g. 500M or 500Mbit/s"):
        parse_cli_rate("500", "-b")
    assert parse_cli_rate("500M", "-b") == parse_cli_rate("500Mbit/s", "-b") == 500e6
    assert parse_cli_rate("9600bit/s", "-b") == 9600
    with pytest.raises(ValueError, match=r"'50' has no unit; write e.g. 50/s"):
        parse_packet_rate("50", "--rate")
    assert parse_packet_rate("50/s", "--rate") == parse_packet_rate("50pps", "--rate") == 50
    with pytest.raises(ValueError, match="cannot read '50 Hz'"):
        parse_packet_rate("50 Hz", "--rate")


@pytest.mark.parametrize(("seconds", "text"), [(60, "1m"), (90, "90s"), (7200, "2h"), (1.5, "1500ms"), (0, "0ms")])
def test_prometheus_durations_are_whole_units(seconds: float, text: str) -> None:
    assert format_prometheus_duration(seconds) == text
