"""The always-on side of a host, for `pathprobe run` and `pathprobe serve` alike: the
supervised iperf3 server, the TCP request/response responder and the UDP echo responder."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

from .. import wire
from ..allow import AllowList
from ..config import Iperf3Settings, Responders
from .base import Count, ResponderError, listen_error
from .echo import EchoResponder
from .iperf3 import server_command, supervise
from .rr import RrResponder, RrServer

log = logging.getLogger(__name__)

__all__ = ["Count", "ResponderError", "Running", "start"]


class Running:
    """The started responders; close() stops them all, the iperf3 server included."""

    def __init__(self, rr: RrServer, echo: EchoResponder, iperf3: asyncio.Task[None]):
        self.rr, self.echo, self.iperf3 = rr, echo, iperf3

    async def close(self) -> None:
        self.iperf3.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.iperf3
        self.rr.close()
        self.echo.close()


def check_port_free(what: str, host: str, port: int) -> None:
    """Fail at once, naming the port, when another process (e.g. an iperf3 left by an
    older pathprobe) listens on it: otherwise the supervisor would restart in a loop."""
    with socket.socket(wire.socket_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as iperf3 binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise listen_error(what, host, port, exc) from exc


async def start(
    settings: Responders,
    iperf3: Iperf3Settings,
    allow: AllowList,
    count: Count,
    iperf3_up: Callable[[bool], None] = lambda _: None,
    iperf3_restarted: Callable[[], None] = lambda: None,
) -> Running:
    """Start every responder; raises ResponderError when one cannot listen."""
    listen = str(settings.listen)
    check_port_free("iperf3 server", listen, iperf3.port)
    rr = RrResponder(allow, settings.rr_max_connections_per_source, lambda result: count("rr", result, 1))
    echo = EchoResponder(allow, settings.echo_max_pps_per_source, lambda result, n=1: count("echo", result, n))
    rr_server = await rr.start(listen, settings.rr_port)
    try:
        await echo.start(listen, settings.echo_port)
    except ResponderError:
        rr_server.close()
        raise
    server = asyncio.create_task(
        supervise(server_command(iperf3, listen), iperf3_up, iperf3_restarted), name="iperf3-server"
    )
    log.info(
        "responders on %s: iperf3 :%d, tcp rr :%d, udp echo :%d; answering %s",
        listen, iperf3.port, settings.rr_port, settings.echo_port, allow,
    )  # fmt: skip
    return Running(rr_server, echo, server)
