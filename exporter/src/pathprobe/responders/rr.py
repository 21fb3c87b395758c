"""TCP request/response responder: answers rr probes (wire.py) from allowed sources only, and
their requests for the report of the last throughput test they ran against this host's iperf3."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .. import wire
from ..allow import AllowList
from .base import listen_error

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 5.0
IDLE_TIMEOUT = 120.0
# A peer that stops reading answers is dropped once an answer cannot be sent in this time.
WRITE_TIMEOUT = 10.0
# The longest a report request may wait for the client's test on this host's server to end.
REPORT_WAIT_MOST = 10.0

# A source's report of its last test here (responders.iperf3.ServedTests.report), waiting at most
# the seconds given for a test of its that still runs.
Report = Callable[[str, float], Awaitable[dict[str, Any]]]


class RrResponder:
    def __init__(
        self,
        allow: AllowList,
        max_connections_per_source: int,
        count: Callable[[str], None],
        report: Report | None = None,
    ):
        self.allow = allow
        self.max_per_source = max_connections_per_source
        self.count = count  # called with accepted / report / not_allowed / revoked / rate_limited / malformed
        self.report = report
        self._open: Counter[str] = Counter()

    async def start(self, host: str, port: int) -> RrServer:
        listener = wire.stream_socket(host)
        # TCP only: lets a restart bind while old connections sit in TIME_WAIT; a second
        # listener on the same port still fails (that needs SO_REUSEPORT).
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
            listener.listen(128)
        except OSError as exc:
            listener.close()
            raise listen_error("tcp rr responder", host, port, exc) from exc
        return RrServer(listener, self._handle)

    async def _handle(self, sock: socket.socket, source: str) -> None:
        try:
            wire.tune(sock)
            conn = wire.Connection(sock, stamp_sends=True)
        except OSError:
            sock.close()
            return
        try:
            if not self.allow.allows(source):
                self.count("not_allowed")
                await _write(conn, b"N")
                return
            if self._open[source] >= self.max_per_source:
                self.count("rate_limited")
                await _write(conn, b"N")
                return
            self._open[source] += 1
            try:
                await self._serve(conn, source)
            finally:
                self._open[source] -= 1
                if not self._open[source]:
                    del self._open[source]
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            conn.close()

    async def _serve(self, conn: wire.Connection, source: str) -> None:
        async with asyncio.timeout(HELLO_TIMEOUT):
            hello, _ = await conn.read(wire.RR_HELLO.size)
        magic, version, size = wire.RR_HELLO.unpack(hello)
        if magic == wire.REPORT_MAGIC and version == wire.REPORT_VERSION and self.report is not None:
            await self._report(conn, source, min(size / 1000, REPORT_WAIT_MOST))
            return
        if magic != wire.RR_MAGIC or version != wire.RR_VERSION or not 1 <= size <= wire.RR_MAX_SIZE:
            self.count("malformed")
            await _write(conn, b"N")
            return
        self.count("accepted")
        await _write(conn, b"Y")
        follows_up = size >= wire.RR_FOLLOW_UP.size
        answered_ns: int | None = None  # the previous answer's clock read
        while True:
            async with asyncio.timeout(IDLE_TIMEOUT):
                request, arrived_ns = await conn.read(size)
            # Checked again at every request: a reload that removed or moved this peer ends its open
            # connections at their next probe, not when they close on their own.
            if not self.allow.allows(source):
                self.count("revoked")
                return
            answer = bytearray(request + wire.HOLD.pack(0))
            if follows_up:  # the previous answer's stretch from its clock read to its transmit stamp
                sent_ns = conn.sent_ns
                stretch = sent_ns - answered_ns if sent_ns is not None and answered_ns is not None else -1
                wire.RR_FOLLOW_UP.pack_into(answer, 0, stretch + 1 if 0 <= stretch < wire.MAX_STRETCH_NS else 0)
            # Taken last, so that the hold covers everything but the send (the next answer follows
            # this one up with that, as the echo's do).
            answered_ns = time.time_ns()
            wire.HOLD.pack_into(answer, size, max(0, answered_ns - arrived_ns))
            await _write(conn, answer)

    async def _report(self, conn: wire.Connection, source: str, wait: float) -> None:
        assert self.report is not None
        self.count("report")
        body = json.dumps(await self.report(source, wait), separators=(",", ":")).encode()
        await _write(conn, b"Y" + wire.REPORT_LENGTH.pack(len(body)) + body)


async def _write(conn: wire.Connection, data: bytes | bytearray) -> None:
    """Send `data`: at once when the socket takes it all (an answer's usual case, with nothing
    between the hold's clock read and the send), else the rest within WRITE_TIMEOUT. Its transmit
    stamp comes within the send unless queued: taken now, it wakes no one."""
    sent = conn.send_now(data)
    if sent < len(data):
        async with asyncio.timeout(WRITE_TIMEOUT):
            await conn.write(data[sent:])
    conn.take_sent_stamps(most=1)


class RrServer:
    """The responder's listening socket and its connections; close() ends them all."""

    def __init__(self, listener: socket.socket, handle: Callable[[socket.socket, str], Coroutine[Any, Any, None]]):
        self.listener = listener
        self._handle = handle
        self._connections: set[asyncio.Task[None]] = set()
        self._accepting = asyncio.create_task(self._accept(), name="rr-accept")

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(self.listener)
            except OSError as exc:  # e.g. out of file descriptors: keep serving the others
                log.warning("tcp rr responder: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.create_task(self._handle(sock, peer[0]), name=f"rr-{peer[0]}")
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    def close(self) -> None:
        self._accepting.cancel()
        for task in list(self._connections):
            task.cancel()
        self.listener.close()
