"""The always-on side of a host, for `pathprobe run` and `pathprobe serve` alike: the
supervised iperf3 server, the TCP request/response responder and the UDP echo responder."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Protocol

from .. import iperf3 as iperf3_binary
from .. import wire
from ..allow import AllowList
from ..config import Config, Iperf3Settings, Responders
from .base import Count, ResponderError, listen_error
from .echo import EchoResponder
from .iperf3 import Admit, ServedTests, Server, server_command, supervise
from .rr import RrResponder, RrServer

log = logging.getLogger(__name__)

# The longest test a server takes without a schedule to bound it (`pathprobe serve`): pathprobe's own
# are seconds long.
SERVE_MAX_TEST_SECONDS = 120.0

__all__ = ["Count", "Events", "Iperf3ServerState", "ResponderError", "Running", "held_ports", "start"]


class Running:
    """The started responders; close() stops them all, the iperf3 servers included."""

    def __init__(self, rr: RrServer, echo: EchoResponder, iperf3: list[asyncio.Task[None]]):
        self.rr, self.echo, self.iperf3 = rr, echo, iperf3

    async def close(self) -> None:
        for server in self.iperf3:
            server.cancel()
        await asyncio.gather(*self.iperf3, return_exceptions=True)
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
    wanted = [
        ("responders.rr_port", listen, cfg.responders.rr_port, socket.SOCK_STREAM),
        ("responders.echo_port", listen, cfg.responders.echo_port, socket.SOCK_DGRAM),
        *(
            ("iperf3.port" if i == 0 else f"iperf3.port + {i} (iperf3.processes)", listen, port, socket.SOCK_STREAM)
            for i, port in enumerate(cfg.iperf3.ports)
        ),
        ("web.listen", web_host or "0.0.0.0", web_port, socket.SOCK_STREAM),
    ]
    problems = []
    for field, host, port, kind in wanted:
        exc = _bind_error(host, port, kind)
        if exc is not None:
            proto = "tcp" if kind == socket.SOCK_STREAM else "udp"
            problems.append(f"{field}: {host}:{port}/{proto} is not free on this host: {exc.strerror or exc}")
    return problems


class Events(Protocol):
    """What the responders report for the metrics: requests by outcome, and the iperf3 server's
    state and restarts."""

    def count_request(self, responder: str, result: str, n: int = 1) -> None: ...
    def set_iperf3_up(self, up: bool) -> None: ...
    def iperf3_restarted(self, reason: str) -> None: ...


class Iperf3ServerState:
    """The supervised iperf3 server's state, kept where its supervisor reports it: whether it runs,
    and whether an admitted peer's test runs on it now. Control code reads it here (readiness; a
    host's own test waits while a peer's runs); whether it runs is handed on to `events`."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.up = False
        self.serving = False

    def set_up(self, up: bool) -> None:
        self.up = up
        self.events.set_iperf3_up(up)

    def set_serving(self, serving: bool) -> None:
        self.serving = serving


def _admission(iperf3: Iperf3Settings, allow: AllowList, decide: Admit | None, count: Count) -> Admit | None:
    """How the iperf3 server admits a test, each decision counted: by `decide` (default: the
    allow-list); None with iperf3.admit "anyone" (the server's output is then not read)."""
    if iperf3.admit == "anyone":
        log.warning("iperf3 server: admits anyone's tests (iperf3.admit: anyone)")
        return None
    by = decide or (lambda address: "ok" if allow.allows(address) else "not_allowed")

    def admit(address: str) -> str:
        result = by(address)
        count("iperf3", result, 1)
        return result

    return admit


def _all_up(ports: list[int], state: Iperf3ServerState) -> Callable[[int], Callable[[bool], None]]:
    """Each server's reporter of its state: the servers are up while every one of them is, and
    said so when that changes, once each has started or failed (not "down" while the others
    still start)."""
    ups: dict[int, bool] = {}  # each server's state, once it has one
    told: list[bool | None] = [None]

    def up(port: int) -> Callable[[bool], None]:
        def tell(running: bool) -> None:
            ups[port] = running
            now = len(ups) == len(ports) and all(ups.values())
            if now != told[0] and (now or len(ups) == len(ports)):
                told[0] = now
                state.set_up(now)

        return tell

    return up


def _supervised(  # noqa: PLR0913, PLR0917 - the servers' settings, and what they report to
    iperf3: Iperf3Settings,
    listen: str,
    state: Iperf3ServerState,
    events: Events,
    admit: Admit | None,
    served: ServedTests,
) -> list[asyncio.Task[None]]:
    """A supervised iperf3 server on each of iperf3.ports."""
    up = _all_up(iperf3.ports, state)
    return [
        asyncio.create_task(
            supervise(
                Server(server_command(iperf3, listen, port), port), up(port), events.iperf3_restarted, admit, served
            ),
            name=f"iperf3-server-{port}",
        )
        for port in iperf3.ports
    ]


async def start(  # noqa: PLR0913, PLR0917 - each responder's settings and hooks
    settings: Responders,
    iperf3: Iperf3Settings,
    allow: AllowList,
    events: Events,
    iperf3_admit: Admit | None = None,
    clock_bound: Callable[[], float | None] = lambda: None,
    server: Iperf3ServerState | None = None,
) -> Running:
    """Start every responder; raises ResponderError when one cannot listen. iperf3 tests
    are admitted by `iperf3_admit` (default: the allow-list; None with iperf3.admit "anyone").
    `clock_bound()`: this host's clock error bound, which the echo responder states. `server`:
    where the iperf3 server's state is kept (default: a state of its own, reported to `events`)."""
    state = server or Iperf3ServerState(events)
    count: Count = events.count_request
    listen = str(settings.listen)
    admit = _admission(iperf3, allow, iperf3_admit, count)
    for port in iperf3.ports:
        check_port_free("iperf3 server", listen, port)
    # Its peers' tests on this host's servers, and this host's end of each for their report requests
    # (none where no test is admitted: the servers' output is not read).
    served = ServedTests(
        iperf3_binary.version_text(iperf3.binary),
        iperf3.ports,
        state.set_serving,
        iperf3.max_test_seconds or SERVE_MAX_TEST_SECONDS,
    )
    rr = RrResponder(
        allow,
        settings.rr_max_connections_per_source,
        lambda result: count("rr", result, 1),
        served.report if admit is not None else None,
    )
    echo = EchoResponder(
        allow, settings.echo_max_pps_per_source, lambda result, n=1: count("echo", result, n), clock_bound
    )
    rr_server = await rr.start(listen, settings.rr_port)
    try:
        await echo.start(listen, settings.echo_port)
    except ResponderError:
        rr_server.close()
        raise
    servers = _supervised(iperf3, listen, state, events, admit, served)
    log.info(
        "responders on %s: iperf3 :%s (admits: %s), tcp rr :%d, udp echo :%d; answering %s",
        listen,
        ",".join(map(str, iperf3.ports)),
        iperf3.admit,
        settings.rr_port,
        settings.echo_port,
        allow,
    )
    return Running(rr_server, echo, servers)
