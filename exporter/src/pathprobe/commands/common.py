"""What the verb modules share: exit codes, argument types, output."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import sys
from pathlib import Path

from ..clock import ClockErrorBound
from ..config import ClockSettings, SteadyStateSettings
from ..files import write_atomic
from ..probes.steady import Detector
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


def add_length_options(parser: argparse.ArgumentParser, what: str, default: bool | None) -> None:
    """--steady-state / --fixed-length: whether `what` (TCP tests) stop once their rate has settled
    (their duration then their most) or run their full duration; `default` when neither is given
    (None: as the config says)."""

    def marked(flag: bool) -> str:
        return " (the default)" if default is flag else " (default: as the config says)" if default is None else ""

    lengths = parser.add_mutually_exclusive_group()
    lengths.add_argument("--steady-state", dest="steady_state", action="store_const", const=True,
                         help=f"{what} stop once their rate has settled; their duration is then their most"
                              + marked(True))  # fmt: skip
    lengths.add_argument(
        "--fixed-length",
        dest="steady_state",
        action="store_const",
        const=False,
        help=f"{what} run their full duration, slow start omitted" + marked(False),
    )
    parser.set_defaults(steady_state=default)


def detector(args: argparse.Namespace) -> Detector | None:
    """The steady-state detector with the config's defaults, or None for fixed-length tests."""
    return Detector.of(SteadyStateSettings()) if args.steady_state else None


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
