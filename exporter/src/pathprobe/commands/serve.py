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
from ..config import Iperf3Settings, Responders, default
from .common import EXIT_PROBE_FAILED, network, stop_on_signals


def add_parser(sub: Any) -> None:
    s = sub.add_parser("serve", help="run the responders only (iperf3 server, TCP RR, UDP echo)")
    s.add_argument("--listen", default=str(default(Responders, "listen")), type=ipaddress.ip_address)
    s.add_argument("--allow", action="append", default=[], type=network, metavar="CIDR",
                   help="source networks to answer (repeatable); default: loopback only")  # fmt: skip
    s.add_argument("--rr-port", type=int, default=default(Responders, "rr_port"))
    s.add_argument("--echo-port", type=int, default=default(Responders, "echo_port"))
    s.add_argument("--iperf3-port", type=int, default=default(Iperf3Settings, "port"))
    s.add_argument("--iperf3", default=default(Iperf3Settings, "binary"), help="iperf3 binary")
    s.add_argument("--rr-max-connections-per-source", type=int,
                   default=default(Responders, "rr_max_connections_per_source"))  # fmt: skip
    s.set_defaults(func=cmd_serve)


class Counts:
    """What the responders report (responders.Events): the requests, printed at the end."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()

    def count_request(self, responder: str, result: str, n: int = 1) -> None:
        self.requests[responder, result] += n

    def set_iperf3_up(self, up: bool) -> None:
        pass

    def set_iperf3_serving(self, serving: bool) -> None:
        pass

    def iperf3_restarted(self) -> None:
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
    iperf3 = Iperf3Settings(binary=args.iperf3, port=args.iperf3_port, admit="peers")

    async def serve() -> None:
        stop = asyncio.Event()
        await stop_on_signals(stop)
        counts = Counts()
        running = await responders.start(settings, iperf3, allow, counts)
        print(
            f"pathprobe serve: iperf3 :{args.iperf3_port}, tcp rr :{args.rr_port}, udp echo :{args.echo_port}; "
            f"answering {allow}",
            flush=True,
        )
        await stop.wait()
        await running.close()
        outcomes = ", ".join(f"{r} {res}={n}" for (r, res), n in sorted(counts.requests.items()))
        print("requests by outcome: " + (outcomes or "none"))

    try:
        asyncio.run(serve())
    except responders.ResponderError as exc:
        print(f"pathprobe: {exc}", file=sys.stderr)
        return EXIT_PROBE_FAILED
    return 0
