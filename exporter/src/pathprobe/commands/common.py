"""What the verb modules share: exit codes, argument types, output."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import sys
from pathlib import Path

from ..clock import ClockErrorBound
from ..config import ClockSettings
from ..files import write_atomic
from ..units import parse_quantity

EXIT_PROBE_FAILED = 1
EXIT_BAD_INPUT = 2


def network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a network: {text!r}") from exc


def quantity(text: str | None, what: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_quantity(text, what)
    except ValueError as exc:
        raise SystemExit(f"pathprobe: {exc}") from exc


def add_clock_option(parser: argparse.ArgumentParser, what: str) -> None:
    """--clock-error-bound auto|SECONDS (args.clock_error_bound: ClockSettings)."""
    parser.add_argument("--clock-error-bound", type=_clock_settings, default=ClockSettings(), metavar="auto|SECONDS",
                        help=f"this host's clock error bound, {what}: auto (ClockBound where it runs, else "
                        "chronyd; the default) or a figure in seconds")  # fmt: skip


def _clock_settings(value: str) -> ClockSettings:
    if value == "auto":
        return ClockSettings()
    try:
        return ClockSettings(source="stated", error_bound_seconds=float(value))
    except ValueError:  # pydantic's ValidationError is one: argparse names the option and the value
        raise argparse.ArgumentTypeError("auto, or seconds above 0 and at most 10") from None


def own_clock_bound(settings: ClockSettings) -> float | None:
    """This host's clock error bound now, as `settings` say to read it (None: unknown)."""
    bound = ClockErrorBound(settings)
    asyncio.run(bound.refresh())
    return bound.seconds


async def stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


def write_output(text: str, out: str | None) -> int:
    """To a file, atomically (all or nothing), or to standard output."""
    if out:
        write_atomic(Path(out), text)
    else:
        sys.stdout.write(text)
    return 0
