"""What the verb modules share: exit codes, argument types, output."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import sys
from pathlib import Path

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
