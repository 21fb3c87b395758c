"""What the verb modules share: exit codes, argument types, output."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from ..capacity import Review
from ..clock import ClockErrorBound
from ..config import ClockSettings
from ..files import write_atomic
from ..limits import window_share
from ..probe_settings import SteadyStateSettings
from ..probes.steady import Detector
from ..units import parse_cli_duration, parse_cli_rate, parse_packet_rate, parse_quantity

EXIT_PROBE_FAILED = 1
EXIT_BAD_INPUT = 2


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage error is one line (the usage of `capacity` alone is 20):
    what is wrong and where to read more, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message.removeprefix('argument ')} (see {self.prog} --help)\n")


def _argument_type(parse: Callable[[str, str], float], flag: str) -> Callable[[str], float]:
    """`parse` (units.py: every flag's one parser) as an argparse type: its error says what is wrong
    with the value; argparse's names the flag."""

    def convert(text: str) -> float:
        try:
            return parse(text, flag)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(flag).lstrip(": ")) from None

    return convert


def duration_arg(flag: str, unit: str = "s") -> Callable[[str], float]:
    """A duration flag's type (seconds): its unit required, `unit` the one an error suggests."""
    return _argument_type(lambda text, what: parse_cli_duration(text, what, unit), flag)


def add_duration(
    parser: argparse.ArgumentParser, *flags: str, help_text: str, default: float | None = None, unit: str = "s"
) -> None:
    """A duration flag, its unit required (seconds on the namespace): every command's in one shape."""
    parser.add_argument(*flags, type=duration_arg(flags[0], unit), default=default, metavar="DURATION", help=help_text)


def bitrate_arg(flag: str) -> Callable[[str], float]:
    """A bit rate flag's type (bits/s): 500M or 500Mbit/s, never 500 alone."""
    return _argument_type(parse_cli_rate, flag)


def packet_rate_arg(flag: str) -> Callable[[str], float]:
    """A packet rate flag's type (packets/s): 50/s or 50pps."""
    return _argument_type(parse_packet_rate, flag)


def host_arg(text: str) -> str:
    """A target's name or address, as given, once it resolves: a bad name is a usage error of one
    line, not the resolver's UnicodeError traceback (`not..a..host`)."""
    try:
        socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise argparse.ArgumentTypeError(f"cannot resolve {text!r}: {reason}") from None
    return text


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
    lengths.add_argument(
        "--steady-state",
        dest="steady_state",
        action="store_const",
        const=True,
        help=f"{what} stop once their rate has settled; their duration is then their most" + marked(True),
    )
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
    """--clock-error-bound auto|DURATION (args.clock_error_bound: ClockSettings)."""
    parser.add_argument(
        "--clock-error-bound",
        type=_clock_settings,
        default=ClockSettings(),
        metavar="auto|DURATION",
        help=f"this host's clock error bound, {what}: auto (ClockBound where it runs, else "
        "chronyd; the default) or a stated figure (e.g. 2us, 0.5ms)",
    )


_CLOCK_BOUND = duration_arg("--clock-error-bound")


def _clock_settings(value: str) -> ClockSettings:
    if value == "auto":
        return ClockSettings()
    seconds = _CLOCK_BOUND(value)  # a bare number: the forms to write instead
    try:
        return ClockSettings(source="stated", error_bound_seconds=seconds)
    except ValueError:  # pydantic's ValidationError is one: argparse names the option and the value
        raise argparse.ArgumentTypeError("auto, or a duration above 0 and at most 10s (e.g. 2us)") from None


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


def empty_review(
    args: argparse.Namespace, target: str, buffers: tuple[int | None, int | None], volume: float, source: str = "sweep"
) -> Review:
    """A review of `target` with the command's protocol, direction, window share and price, before
    any row. `buffers`: the receiver's tcp_rmem and the sender's tcp_wmem max."""
    direction = "receive" if args.reverse else "send"
    share = args.window_share or window_share()
    return Review(target, args.protocol, direction, [], None, *buffers, share, volume, args.price_per_gb, source=source)
