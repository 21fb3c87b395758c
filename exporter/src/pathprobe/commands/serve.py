"""`pathprobe serve`: the responders only (iperf3 server, TCP rr, UDP echo), like iperf3 -s."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import sys
from collections import Counter
from typing import Any

from .. import responders
from ..allow import AllowList
from ..clock import ClockErrorBound
from ..config import Iperf3Settings, Responders
from ..responders.iperf3 import wait_listening
from ..strict import default
from ..units import format_seconds
from .common import EXIT_PROBE_FAILED, add_clock_option, network, stop_on_signals

# How long the iperf3 server may take to listen before `serve` gives up (it listens within milliseconds).
IPERF3_START_SECONDS = 10.0


def add_parser(sub: Any) -> None:
    s = sub.add_parser("serve", help="run the responders only (iperf3 server, TCP RR, UDP echo)")
    s.add_argument(
        "--listen",
        default=str(default(Responders, "listen")),
        type=ipaddress.ip_address,
        metavar="ADDRESS",
        help="the address the responders listen on (default %(default)s: every IPv4 address)",
    )
    s.add_argument(
        "--allow",
        action="append",
        default=[],
        type=network,
        metavar="CIDR",
        help="source networks to answer (repeatable); default: loopback only",
    )
    s.add_argument(
        "--rr-port", type=int, default=default(Responders, "rr_port"), help="TCP request/response (default %(default)s)"
    )
    s.add_argument(
        "--echo-port", type=int, default=default(Responders, "echo_port"), help="UDP echo (default %(default)s)"
    )
    s.add_argument(
        "--iperf3-port",
        type=int,
        default=default(Iperf3Settings, "port"),
        help="the first iperf3 server's (default %(default)s)",
    )
    s.add_argument(
        "--iperf3-processes",
        type=int,
        default=default(Iperf3Settings, "processes"),
        help="iperf3 servers, on --iperf3-port and the ports after it (iperf3.processes)",
    )
    s.add_argument("--iperf3", default=default(Iperf3Settings, "binary"), help="iperf3 binary")
    s.add_argument(
        "--rr-max-connections-per-source",
        type=int,
        default=default(Responders, "rr_max_connections_per_source"),
        help="TCP request/response connections one address may hold (default %(default)s)",
    )
    add_clock_option(s, "stated in every echo answer so that peers can trust one-way delays")
    s.set_defaults(func=cmd_serve)


class Counts:
    """What the responders report (responders.Events): the requests, printed at the end."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()
        self.iperf3_up: bool | None = None  # None: not started yet

    def count_request(self, responder: str, result: str, n: int = 1) -> None:
        self.requests[responder, result] += n

    def set_iperf3_up(self, up: bool) -> None:
        self.iperf3_up = up

    def iperf3_restarted(self, reason: str) -> None:
        pass


def cmd_serve(args: argparse.Namespace) -> int:
    allow = AllowList(args.allow or ["127.0.0.0/8", "::1/128"])
    settings = Responders(
        listen=args.listen,
        rr_port=args.rr_port,
        echo_port=args.echo_port,
        rr_max_connections_per_source=args.rr_max_connections_per_source,
    )
    # No schedule here: a test is admitted by its source address alone.
    iperf3 = Iperf3Settings(binary=args.iperf3, port=args.iperf3_port, processes=args.iperf3_processes, admit="peers")

    async def serve() -> None:
        stop = asyncio.Event()
        await stop_on_signals(stop)
        counts = Counts()
        bound = ClockErrorBound(args.clock_error_bound)
        await bound.refresh()
        running = await responders.start(settings, iperf3, allow, counts, clock_bound=lambda: bound.seconds)
        # The line below says "ready": only once iperf3 (a process of its own) listens, or a client
        # that connects at once finds the port closed (a lab test's did, on a VM short of CPU). A
        # server that cannot start leaves the other responders answering; its supervisor says why.
        for port in iperf3.ports:
            if not await wait_listening(port, IPERF3_START_SECONDS, lambda: counts.iperf3_up is False):
                print(f"pathprobe serve: the iperf3 server is not listening on :{port}", file=sys.stderr)
        refreshing = asyncio.create_task(bound.run(), name="clock-bound")
        stated = (
            f"{format_seconds(bound.seconds)} ({bound.source})"
            if bound.seconds is not None
            else "none known (peers withhold one-way delays to this host)"
        )
        print(
            f"pathprobe serve: iperf3 :{','.join(map(str, iperf3.ports))}, tcp rr :{args.rr_port}, "
            f"udp echo :{args.echo_port}; "
            f"answering {allow}; clock error bound {stated}",
            flush=True,
        )
        await stop.wait()
        refreshing.cancel()
        await running.close()
        outcomes = ", ".join(f"{r} {res}={n}" for (r, res), n in sorted(counts.requests.items()))
        print("requests by outcome: " + (outcomes or "none"))

    try:
        asyncio.run(serve())
    except responders.ResponderError as exc:
        print(f"pathprobe: {exc}", file=sys.stderr)
        return EXIT_PROBE_FAILED
    return 0
