"""/metrics' HTTP(S) server.

Connections are handled as Go's net/http with ReadHeaderTimeout handles them, so that no
client, idle, slow or many, can hold an authorized scrape off: the server's own event loop
(a thread of its own, apart from the exporter's) accepts every connection and runs its TLS
handshake and reads its request without blocking, each phase under its deadline (`ConnectionLimits`);
a slow connection costs a descriptor, never a worker. A connection that sends nothing costs
nothing: the kernel holds it until its first byte (TCP_DEFER_ACCEPT, as nginx's `deferred`),
and one closed before then is dropped as it is accepted. Only requests read whole go to a small
pool of workers that run the app. Connections are capped per source address and in all; at a
cap, a new connection displaces the oldest one still reading its request (of its own address
first), so that a flood displaces itself and the scraper's next connection gets in. Connections
refused, displaced or cut short are counted in pathprobe_web_refused_total{reason}, rendered
with the snapshot's trailer. After an answer the connection waits for the client's next request
(keep-alive, `http.py`), as one still reading: idle, it is the first displaced at a cap.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import io
import logging
import resource
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from .. import webtls
from ..config import WebSettings
from ..listeners import bind, defer_accept
from ..webconfig import WebConfigSource
from . import tls
from .app import Evidence, Readiness, Reload, make_app
from .http import TLS_HANDSHAKE, Answer, Refusal, WsgiApp, answer, environ_of, keeps_open, refused
from .snapshot import Snapshot, Stats

log = logging.getLogger(__package__)  # one logger for /metrics: pathprobe.web


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection to /metrics may hold, and for how long.

    As Go's net/http (ReadHeaderTimeout, a goroutine per connection, no pool to fill), an idle
    or slow connection costs a descriptor and a coroutine on the server's event loop, never a
    worker: workers only answer requests read whole. Each phase has its own deadline from the
    moment it starts, so a client that trickles bytes gains nothing over one that sends none.
    """

    handshake_seconds: float = 5.0  # the TLS handshake
    request_seconds: float = 5.0  # request line, headers and body, once the handshake is done
    write_seconds: float = 10.0  # the whole response (a 500-peer exposition is 9 MB ungzipped)
    deadline_seconds: float = 60.0  # one request, from the connection (or its first byte, kept open) to its answer
    # A connection kept open after an answer waits this long for its next request (a scraper's
    # interval: above Prometheus's default 1m), displaced as one still reading at a cap.
    idle_seconds: float = 150.0
    requests_per_connection: int = 1000  # then closed, as nginx's keepalive_requests
    # How long the kernel holds a connection that has sent nothing before it hands it over
    # anyway (TCP_DEFER_ACCEPT); Linux rounds it up to its SYN-ACK retransmissions (1, 3, 7 s...).
    defer_accept_seconds: int = 5
    # Open at once from one address: at the cap a new connection takes the place of that
    # address's oldest one still reading its request, so a flood from one address only
    # displaces its own connections, and a scraper sharing it still gets in.
    per_source: int = 128  # above a burst of 64 concurrent scrapes from one address, which it would cut
    # Open at once in all (0: half the descriptor limit, 64 to 4096): at the cap the oldest
    # connection still reading its request from the address holding the most goes.
    connections: int = 0
    workers: int = 4  # threads answering complete requests (a first render or a reload can take seconds)
    max_head: int = 16 * 1024  # request line and headers (a scrape's are under 1 KiB)
    max_body: int = 16 * 1024


class _Conn:
    """One accepted connection: its source, its task, and whether it may still be displaced."""

    __slots__ = ("evicted", "reading", "source", "task", "writer")

    def __init__(self, source: str, task: asyncio.Task[None], writer: asyncio.StreamWriter):
        self.source, self.task, self.writer = source, task, writer
        self.reading = True  # handshake, request or an idle wait for the next: the connection may be displaced
        self.evicted = False


MAX_WAITING = 1024  # connections taken from the kernel (10 us each) and not yet given a stream
START_BATCH = 16  # streams made per turn of the server's loop (`_start_some`)


def default_connections() -> int:
    """Half the descriptors this process may open, 64 to 4096: the other half for probes and responders."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 4096 if soft == resource.RLIM_INFINITY else max(64, min(4096, soft // 2))


def raise_fd_limit() -> None:
    """The soft descriptor limit up to the hard one, as Go's runtime does at start: systemd's
    soft default of 1024 would cap /metrics' connections at 512."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.debug("cannot raise the descriptor limit to %d: %s", target, exc)


class MetricsServer:
    """The /metrics server: its own event loop in a daemon thread accepts and reads every
    connection (TLS handshake included) without blocking on any, and hands requests read whole
    to a small pool of workers that run the app."""

    def __init__(
        self,
        listeners: list[socket.socket],
        app: WsgiApp,
        *,
        snapshot: Snapshot,
        web_config: WebConfigSource,
        limits: ConnectionLimits,
    ) -> None:
        """`listeners`: bound and listening, one or more (--web.listen-address, systemd's); `snapshot`: what
        the app serves at /metrics (its stats count what this server refuses)."""
        self.listeners, self.app, self.snapshot, self.web_config, self.limits = (
            listeners,
            app,
            snapshot,
            web_config,
            limits,
        )
        self.stats = snapshot.stats or Stats(web_config)
        self.server_address = listeners[0].getsockname()
        self.max_connections = limits.connections or default_connections()
        self._by_source: dict[str, list[_Conn]] = {}  # oldest first
        self._tasks: set[asyncio.Task[None]] = set()  # every connection's, closing ones included
        self._stopping = False
        self._open = 0
        # Accepted, not yet given a stream: by source, and the sources in turn (`_start_some`).
        self._waiting: dict[str, collections.deque[tuple[socket.socket, bytes | None]]] = {}
        self._turns: collections.deque[str] = collections.deque()
        self._waiting_count = 0
        self._starting = False
        self._pool = concurrent.futures.ThreadPoolExecutor(limits.workers, thread_name_prefix="metrics-worker")
        self._loop = asyncio.new_event_loop()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name="metrics-http", daemon=True)
        self._thread.start()
        started.result(timeout=10)

    def _run(self, started: concurrent.futures.Future[None]) -> None:
        try:
            for listener in self.listeners:
                listener.setblocking(False)
                self._loop.add_reader(listener, self._accept, listener)
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        self._loop.run_forever()

    def _accept(self, listener: socket.socket) -> None:
        """The listener is readable: takes what the kernel has queued, which is cheap, and drops at
        once a connection the client closed before it sent a byte (with TCP_DEFER_ACCEPT those
        are the only ones without a request: a flood of silent connections reaches the server as
        a burst of them when the flood lets go). The rest wait, by source, for `_start_some`."""
        while self._waiting_count < MAX_WAITING:  # beyond, they wait in the kernel's queue
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of descriptors: pause a second, as asyncio's own server does, not spin
                log.warning("metrics: accept failed, pausing for a second: %s", exc)
                self._loop.remove_reader(listener)
                self._loop.call_later(1.0, self._loop.add_reader, listener, self._accept, listener)
                break
            sock.setblocking(False)
            try:
                first = sock.recv(5, socket.MSG_PEEK)  # what the TLS port answers plain HTTP by
            except BlockingIOError:  # nothing sent yet: a slow client, served under its deadlines
                first = None
            except OSError:  # reset
                first = b""
            if first == b"":
                sock.close()
                continue
            source = str(address[0])
            if source not in self._waiting:
                self._turns.append(source)
            self._waiting.setdefault(source, collections.deque()).append((sock, first))
            self._waiting_count += 1
        if self._turns and not self._starting:
            self._starting = True
            self._loop.call_soon(self._start_some)

    def _start_some(self) -> None:
        """Streams for a few waiting connections, one per source in turn, then back to the loop:
        making a stream and its task costs about 0.15 ms, so a burst of 1,000 connections from a
        few sources would hold a scrape from another source for 0.15 s if taken in arrival order;
        in turns, it waits for one connection of each busy source at most."""
        for _ in range(START_BATCH):
            if not self._turns:
                break
            source = self._turns.popleft()
            waiting = self._waiting[source]
            sock, first = waiting.popleft()
            self._waiting_count -= 1
            if waiting:
                self._turns.append(source)
            else:
                del self._waiting[source]
            task = self._loop.create_task(self._accepted(sock, first))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._starting = bool(self._turns)
        if self._starting:
            self._loop.call_soon(self._start_some)

    async def _accepted(self, sock: socket.socket, first: bytes | None) -> None:
        """A stream for `sock`, whose protocol starts `_connection` (as asyncio.start_server's
        does: a stream with a callback is the server side of a later start_tls). `first`: its
        first bytes, peeked (None: not there yet)."""
        connection = functools.partial(self._connection, first=first)
        protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=self.limits.max_head), connection)
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, sock)
        except OSError:
            sock.close()

    def renew(self) -> None:
        """A new snapshot now: what /metrics shows changed (Snapshot.renew)."""
        self.snapshot.renew()

    def shutdown(self) -> None:
        """Stops serving: the listener and every connection closed, the loop stopped."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if not self._thread.is_alive():
            self._loop.close()
        self.server_close()

    def server_close(self) -> None:
        for listener in self.listeners:
            listener.close()

    async def _stop(self) -> None:
        self._stopping = True
        for listener in self.listeners:
            self._loop.remove_reader(listener)
        for waiting in self._waiting.values():
            for sock, _ in waiting:
                sock.close()
        self._waiting.clear()
        self._turns.clear()
        self._waiting_count = 0
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- room for a new connection -----------------------------------------------------------

    def _admit(self, conn: _Conn) -> str | None:
        """Room for `conn`, displacing a connection still reading its request where a cap is
        reached; the reason it is refused when there is none to displace (all are being answered)."""
        mine = self._by_source.get(conn.source, [])
        if len(mine) >= self.limits.per_source and not self._evict(mine, "source_limit"):
            return "source_limit"
        if self._open >= self.max_connections:
            busiest = sorted(self._by_source.values(), key=len, reverse=True)
            if not any(self._evict(conns, "busy") for conns in busiest):
                return "busy"
        self._by_source.setdefault(conn.source, []).append(conn)
        self._open += 1
        return None

    def _evict(self, conns: list[_Conn], reason: str) -> bool:
        """Closes the oldest of `conns` still reading its request, counted under `reason`."""
        victim = next((c for c in conns if c.reading), None)
        if victim is None:
            return False
        self._release(victim)
        victim.evicted = True
        self.stats.refuse(reason)
        victim.writer.transport.abort()
        victim.task.cancel()
        return True

    def _release(self, conn: _Conn) -> None:
        conns = self._by_source.get(conn.source)
        if conns is not None and conn in conns:
            conns.remove(conn)
            self._open -= 1
            if not conns:
                del self._by_source[conn.source]

    # --- one connection ----------------------------------------------------------------------

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes | None = None
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        conn = _Conn(str(peer[0]) if peer else "?", task, writer)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        refused = self._admit(conn)
        if refused is not None:
            self.stats.refuse(refused)
            writer.transport.abort()
            return
        clean = False
        try:
            async with asyncio.timeout(self.limits.deadline_seconds) as whole:
                clean = await self._exchange(conn, reader, writer, first, whole)
        except asyncio.CancelledError:
            if not (conn.evicted or self._stopping):
                raise
            # Displaced by a newer connection (counted), or the server stops: nothing more to do.
            # Python 3.11's streams log a connection task that ends cancelled as an error (their
            # done callback asks it for its exception), so it ends as a return.
            task.uncancel()
        except TimeoutError:
            self.stats.refuse("deadline" if whole.expired() else "timeout")
        except (OSError, asyncio.IncompleteReadError) as exc:  # resets, a client gone mid-request
            log.debug("metrics: connection from %s: %s", conn.source, exc)
        finally:
            self._release(conn)
            if not clean or conn.evicted:
                writer.transport.abort()
        if clean:
            try:
                await _close(writer)
            except asyncio.CancelledError:  # the server stops (released: no eviction reaches it)
                writer.transport.abort()
                task.uncancel()

    async def _exchange(
        self,
        conn: _Conn,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        first: bytes | None,
        whole: asyncio.Timeout,
    ) -> bool:
        """TLS handshake, then requests and their answers, each under its deadline, for as long as
        the client keeps the connection; True when it ends between requests (a clean close).
        A phase past its deadline raises TimeoutError (counted as `timeout`), a request past
        `deadline_seconds` from its first byte as `deadline` (`whole`, rescheduled per request)."""
        # Per connection, as the toolkit's GetConfigForClient: a certificate, key, CA or users
        # file changed on disk takes effect with the next connection.
        access = self.web_config.current()
        context = access.ssl_context
        if context is not None:
            if first is not None and tls.looks_like_http(first):
                self.stats.refuse("tls_handshake")
                await tls.answer_http_on_tls(reader, writer, self.limits.max_head)
                return True
            if not await self._handshake(conn, writer, context):
                return False
            if not webtls.allowed(writer.get_extra_info("peercert"), access.client_allowed_sans):
                # Go refuses it in the handshake with a bad_certificate alert; Python's ssl has no
                # hook there, and none to send an alert after it: the connection is closed.
                self.stats.refuse("tls_handshake")
                log.debug("metrics: client certificate of %s has none of client_allowed_sans", conn.source)
                return False
        scheme = "https" if context is not None else "http"
        for served in range(self.limits.requests_per_connection):
            if served:
                conn.reading = True
                whole.reschedule(None)  # the idle wait has its own timeout
            reply = await self._one_request(conn, reader, served, scheme, whole)
            if reply is None:
                return served > 0  # closed (or idle past its time) between requests, or before the first
            async with asyncio.timeout(self.limits.write_seconds):
                writer.write(reply.data)
                await writer.drain()
            if reply.close:
                return True
        return True

    async def _one_request(
        self, conn: _Conn, reader: asyncio.StreamReader, served: int, scheme: str, whole: asyncio.Timeout
    ) -> Answer | None:
        """The answer to the connection's next request (`served` answered before it); None when the
        client closed before sending one (or, on a connection kept open, sent none within `idle_seconds`)."""
        kept = served > 0
        try:
            environ = await self._read_request(conn, reader, kept, whole)
        except Refusal as refusal:
            self.stats.refuse(refusal.reason)
            return Answer(refused(refusal), close=True)
        if environ is None:
            return None
        environ["wsgi.url_scheme"] = scheme
        conn.reading = False
        last = served + 1 >= self.limits.requests_per_connection
        keep = keeps_open(environ) and not last and not self._stopping
        return await self._loop.run_in_executor(self._pool, answer, self.app, environ, keep)

    async def _read_request(
        self, conn: _Conn, reader: asyncio.StreamReader, kept: bool, whole: asyncio.Timeout
    ) -> dict[str, Any] | None:
        """The WSGI environ of the next request; None when the client closed before sending one,
        or, kept open, sent nothing within `idle_seconds`. The first request's whole head is read
        within `request_seconds` of the connection's start (after its handshake), a later one's
        within `request_seconds` of its first byte."""
        limits, loop = self.limits, self._loop
        first_by = loop.time() + (limits.idle_seconds if kept else limits.request_seconds)
        try:
            async with asyncio.timeout_at(first_by):
                first = await reader.readexactly(1)
        except asyncio.IncompleteReadError:
            return None
        except TimeoutError:
            if kept:
                return None
            raise
        if kept:
            whole.reschedule(loop.time() + limits.deadline_seconds)
        async with asyncio.timeout_at(loop.time() + limits.request_seconds if kept else first_by):
            if first[0] == TLS_HANDSHAKE:  # a TLS client on the plain port: Go's server answers 400
                raise Refusal("bad_request", "400 Bad Request")
            try:
                head = first + await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError as exc:  # the head is over `max_head`: the reader's limit
                raise Refusal("header_too_large", "431 Request Header Fields Too Large") from exc
            environ = environ_of(head, conn.source, limits.max_body)
            environ["wsgi.input"] = io.BytesIO(await reader.readexactly(int(environ.get("CONTENT_LENGTH", "0"))))
        return environ

    async def _handshake(self, conn: _Conn, writer: asyncio.StreamWriter, context: ssl.SSLContext) -> bool:
        try:
            async with asyncio.timeout(self.limits.handshake_seconds):
                await writer.start_tls(context)
        except (OSError, TimeoutError) as exc:  # ssl.SSLError, a timeout, a reset: one client's problem
            self.stats.refuse("tls_handshake")
            log.debug("metrics: TLS handshake with %s failed: %r", conn.source, exc)
            return False
        return True


async def _close(writer: asyncio.StreamWriter) -> None:
    """Closes after a whole answer (a TLS close_notify included), cut after a second if the client
    does not take it: a descriptor is never held past the connection's accounting for long."""
    writer.close()
    try:
        async with asyncio.timeout(1.0):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        writer.transport.abort()


def serve(  # noqa: PLR0913 - the settings, the registry, and what the exporter lends the server
    settings: WebSettings,
    registry: CollectorRegistry,
    *,
    reload: Reload | None = None,
    ready: Readiness | None = None,
    web_config: WebConfigSource | None = None,
    limits: ConnectionLimits | None = None,
    listeners: list[socket.socket] | None = None,
    evidence: Evidence | None = None,
) -> MetricsServer:
    """Start the metrics server in a daemon thread; returns it for shutdown(). `web_config`: TLS
    and basic auth (default: settings.config_file's; raises yamlfile.ConfigError when it is bad).
    `listeners`: the sockets to serve on, listening (default: one bound to settings.listen); the
    server closes them."""
    if web_config is None:
        web_config = WebConfigSource(settings.config_file)
    limits = limits or ConnectionLimits()
    # Bound here, not in the server's thread: a taken port is the caller's OSError.
    listeners = listeners if listeners is not None else [bind(settings.listen)]
    try:
        for listener in listeners:
            defer_accept(listener, limits.defer_accept_seconds)
        stats = Stats(web_config)
        snapshot = Snapshot(registry, refresh=settings.refresh_seconds, stats=stats)
        app = make_app(snapshot, web_config, reload if settings.enable_lifecycle else None, ready, evidence)
        return MetricsServer(listeners, app, snapshot=snapshot, web_config=web_config, limits=limits)
    except BaseException:
        for listener in listeners:
            listener.close()
        raise
