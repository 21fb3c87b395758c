"""The always-on side of a host, for `pathprobe run` and `pathprobe serve` alike: the
supervised iperf3 server, the TCP request/response responder and the UDP echo responder."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Protocol

from .. import wire
from ..allow import AllowList
from ..config import Config, Iperf3Settings, Responders
from .base import Count, ResponderError, listen_error
from .echo import EchoResponder
from .iperf3 import Admit, server_command, supervise
from .rr import RrResponder, RrServer

log = logging.getLogger(__name__)

__all__ = ["Count", "Events", "ResponderError", "Running", "held_ports", "start"]


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
    exc = _bind_error(host, port, socket.SOCK_STREAM)
    if exc is not None:
        raise listen_error(what, host, port, exc)


def _bind_error(host: str, port: int, kind: socket.SocketKind) -> OSError | None:
    with socket.socket(wire.socket_family(host), kind) as probe:
        if kind == socket.SOCK_STREAM:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listeners bind: TIME_WAIT is no clash
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


def held_ports(cfg: Config) -> list[str]:
    """The exporter's listening ports that this host cannot give it now, by config field
    (`pathprobe check-config --free-ports`, before a deployment starts the exporter)."""
    listen = str(cfg.responders.listen)
    web_host, web_port = cfg.web.address()
    wanted = [("responders.rr_port", listen, cfg.responders.rr_port, socket.SOCK_STREAM),
              ("responders.echo_port", listen, cfg.responders.echo_port, socket.SOCK_DGRAM),
              ("iperf3.port", listen, cfg.iperf3.port, socket.SOCK_STREAM),
              ("web.listen", web_host or "0.0.0.0", web_port, socket.SOCK_STREAM)]  # fmt: skip
    problems = []
    for field, host, port, kind in wanted:
        exc = _bind_error(host, port, kind)
        if exc is not None:
            proto = "tcp" if kind == socket.SOCK_STREAM else "udp"
            problems.append(f"{field}: {host}:{port}/{proto} is not free on this host: {exc.strerror or exc}")
    return problems


class Events(Protocol):
    """What the responders report: requests by outcome, and the iperf3 server's state."""

    def count_request(self, responder: str, result: str, n: int = 1) -> None: ...
    def set_iperf3_up(self, up: bool) -> None: ...
    def set_iperf3_serving(self, serving: bool) -> None: ...
    def iperf3_restarted(self) -> None: ...


async def start(  # noqa: PLR0913, PLR0917 - each responder's settings and hooks
    settings: Responders,
    iperf3: Iperf3Settings,
    allow: AllowList,
    events: Events,
    iperf3_admit: Admit | None = None,
    clock_bound: Callable[[], float | None] = lambda: None,
) -> Running:
    """Start every responder; raises ResponderError when one cannot listen. iperf3 tests
    are admitted by `iperf3_admit` (default: the allow-list; None with iperf3.admit "anyone").
    `clock_bound()`: this host's clock error bound, which the echo responder states."""
    count: Count = events.count_request
    listen = str(settings.listen)
    if iperf3.admit == "anyone":
        admit = None
        log.warning("iperf3 server: admits anyone's tests (iperf3.admit: anyone)")
    else:
        decide = iperf3_admit or (lambda address: "ok" if allow.allows(address) else "not_allowed")

        def admit(address: str) -> str:
            result = decide(address)
            count("iperf3", result, 1)
            return result

    check_port_free("iperf3 server", listen, iperf3.port)
    rr = RrResponder(allow, settings.rr_max_connections_per_source, lambda result: count("rr", result, 1))
    echo = EchoResponder(allow, settings.echo_max_pps_per_source, lambda result, n=1: count("echo", result, n),
                         clock_bound)  # fmt: skip
    rr_server = await rr.start(listen, settings.rr_port)
    try:
        await echo.start(listen, settings.echo_port)
    except ResponderError:
        rr_server.close()
        raise
    server = asyncio.create_task(
        supervise(
            server_command(iperf3, listen),
            events.set_iperf3_up,
            events.iperf3_restarted,
            admit,
            events.set_iperf3_serving,
        ),
        name="iperf3-server",
    )
    log.info(
        "responders on %s: iperf3 :%d (admits: %s), tcp rr :%d, udp echo :%d; answering %s",
        listen, iperf3.port, iperf3.admit, settings.rr_port, settings.echo_port, allow,
    )  # fmt: skip
    return Running(rr_server, echo, server)
