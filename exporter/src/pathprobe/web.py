"""/metrics over HTTP(S), optionally with basic auth, served from a snapshot.

Rendering the registry costs time in proportion to peers (about 0.5 s for 500
peers with prometheus_client), and a scrape must never wait on that. So a
background thread renders a snapshot every `refresh` seconds (slower when
rendering is slow, so that it never takes more than 5% of a core) for as long as
scrapes keep coming, and a scrape returns the latest snapshot at once. Only the
very first scrape renders in the request. What a scrape reads is at most
`refresh` seconds old (it says how old in pathprobe_scrape_snapshot_age_seconds),
and every result carries its own timestamp metric. A render that raises is logged and
counted (pathprobe_scrape_render_errors_total) and the last good snapshot is served on,
its age growing, until the next render (`refresh` later) succeeds: /metrics never answers
500 for what the exporter holds.

Connections are handled so that no client can hold the others off: the listening
socket is never wrapped in TLS (the handshake of each connection runs in its own
worker thread, under the socket timeout), every socket has a timeout for each read
and write and a deadline for the whole connection, the listen backlog is 128, and
at most `max_workers` connections are served at once (more wait for a worker up to
a second, then are closed). Connections refused or cut short are counted in
pathprobe_web_refused_total{reason}, rendered with the snapshot's trailer.
"""

from __future__ import annotations

import base64
import gzip
import hmac
import io
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .config import WebSettings

if TYPE_CHECKING:
    from _typeshed.wsgi import ErrorStream

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]


REFUSED_REASONS = ("busy", "deadline", "timeout", "tls_handshake", "unauthorized", "header_too_large", "bad_request")


class Stats:
    """Connections refused or cut short, by reason (REFUSED_REASONS); shared by the server and the app."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refused: Counter[str] = Counter()

    def refuse(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] += 1

    def exposition(self) -> bytes:
        with self._lock:
            counts = dict(self.refused)
        lines = [
            "# HELP pathprobe_web_refused_total Connections to /metrics refused or cut short, by reason.",
            "# TYPE pathprobe_web_refused_total counter",
            *(f'pathprobe_web_refused_total{{reason="{r}"}} {counts.get(r, 0)}' for r in REFUSED_REASONS),
        ]
        return ("\n".join(lines) + "\n").encode()


class Snapshot:
    def __init__(
        self, registry: CollectorRegistry, refresh: float = 5.0, idle_after: float = 300.0, stats: Stats | None = None
    ):
        self.registry = registry
        self.stats = stats
        self.refresh, self.idle_after = refresh, idle_after
        self._lock = threading.Lock()
        self._body = b""
        self._gzipped = b""
        self._taken = time.monotonic()  # before the first render: its age counts from the start
        self._render_seconds = 0.0
        self._last_scrape = 0.0
        self._scraped = threading.Event()
        self._thread: threading.Thread | None = None
        self.render_errors = 0
        self._failing = 0  # renders failed in a row

    def render(self) -> None:
        """A new snapshot; on an error, the last one stays (never raises)."""
        start = time.monotonic()
        try:
            body = generate_latest(self.registry)
        except Exception:
            self._failed()
            return
        # Compressed once here rather than per scrape (Prometheus asks for gzip): a 500-peer
        # exposition is about 9 MB of text and 0.5 MB gzipped.
        gzipped = gzip.compress(body, compresslevel=1)
        with self._lock:
            self._body, self._gzipped, self._taken = body, gzipped, time.monotonic()
            self._render_seconds = self._taken - start
            self._failing = 0

    def _failed(self) -> None:
        with self._lock:
            self.render_errors += 1
            self._failing += 1
            failing = self._failing
        if failing == 1:  # the traceback once; then a line per failure until a render succeeds
            log.exception("rendering /metrics failed: serving the last snapshot, retrying in %g s", self.refresh)
        else:
            log.error("rendering /metrics failed again (%d in a row): serving the last snapshot", failing)

    def _refresh_loop(self) -> None:
        while True:
            self._scraped.wait()
            time.sleep(max(self.refresh, 20 * self._render_seconds))
            self.render()
            if time.monotonic() - self._last_scrape > self.idle_after:
                self._scraped.clear()  # nobody scrapes: stop rendering until someone does

    def get(self, gzipped: bool = False) -> bytes:
        """The latest snapshot, plus its age; gzip members concatenate, so the trailer is a member of its own."""
        self._last_scrape = time.monotonic()
        with self._lock:
            first = not self._body and not self.render_errors  # the very first scrape renders itself
            if self._thread is None:
                self._thread = threading.Thread(target=self._refresh_loop, name="render", daemon=True)
                self._thread.start()
        if first:
            self.render()
        self._scraped.set()
        with self._lock:
            trailer = _trailer(time.monotonic() - self._taken, self._render_seconds, self.render_errors)
        if self.stats is not None:
            trailer += self.stats.exposition()
        with self._lock:
            if gzipped:
                return self._gzipped + gzip.compress(trailer, compresslevel=1)
            return self._body + trailer


def _trailer(age: float, render_seconds: float, render_errors: int) -> bytes:
    return (
        "# HELP pathprobe_scrape_snapshot_age_seconds Age of the metrics snapshot this scrape returned.\n"
        "# TYPE pathprobe_scrape_snapshot_age_seconds gauge\n"
        f"pathprobe_scrape_snapshot_age_seconds {age:.6f}\n"
        "# HELP pathprobe_scrape_render_seconds Time taken to render that snapshot.\n"
        "# TYPE pathprobe_scrape_render_seconds gauge\n"
        f"pathprobe_scrape_render_seconds {render_seconds:.6f}\n"
        "# HELP pathprobe_scrape_render_errors_total Renders of the snapshot that failed (logged); the last good "
        "snapshot is served until one succeeds.\n"
        "# TYPE pathprobe_scrape_render_errors_total counter\n"
        f"pathprobe_scrape_render_errors_total {render_errors}\n"
    ).encode()


LANDING = b"""<html><head><title>pathprobe</title></head><body><h1>pathprobe</h1>
<p><a href="/metrics">Metrics</a></p></body></html>"""

# An Authorization header longer than this is refused before any comparison.
MAX_AUTHORIZATION = 1024


# Answers a reload: None when the new config was applied, else what is wrong with it.
Reload = Callable[[], "str | None"]


def make_app(
    snapshot: Snapshot, basic_auth: tuple[str, str] | None, reload: Reload | None = None
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    return _App(snapshot, basic_auth, reload)


class _App:
    """The WSGI app: /metrics (the snapshot), / and /-/reload, behind basic auth when set."""

    def __init__(self, snapshot: Snapshot, basic_auth: tuple[str, str] | None, reload: Reload | None):
        self.snapshot, self.reload = snapshot, reload
        self.expected = None
        if basic_auth:
            self.expected = b"Basic " + base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode())

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        refused = self._unauthorized(environ, start_response)
        if refused is not None:
            return refused
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._metrics(environ, start_response)
        if path == "/-/reload":
            return self._lifecycle(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html")])
            return [LANDING]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"Not found\n"]

    def _refuse(self, reason: str) -> None:
        if self.snapshot.stats is not None:
            self.snapshot.stats.refuse(reason)

    def _unauthorized(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes] | None:
        """The answer refusing a request without the password; None when it may go on."""
        if self.expected is None:
            return None
        given = environ.get("HTTP_AUTHORIZATION", "").encode()
        if len(given) > MAX_AUTHORIZATION:
            self._refuse("header_too_large")
            start_response("431 Request Header Fields Too Large", [("Content-Type", "text/plain")])
            return [b"Authorization header too large\n"]
        # Constant time: the time taken says nothing about how much of the password matched.
        if not hmac.compare_digest(given, self.expected):
            self._refuse("unauthorized")
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="pathprobe"')])
            return [b"Unauthorized\n"]
        return None

    def _metrics(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        gz = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        body = self.snapshot.get(gzipped=gz)
        headers = [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))]
        if gz:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    def _lifecycle(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        text = [("Content-Type", "text/plain")]
        if self.reload is None:
            start_response("403 Forbidden", text)
            return [b"Lifecycle API is not enabled (web.enable_lifecycle).\n"]
        if environ.get("REQUEST_METHOD") not in ("POST", "PUT"):
            start_response("405 Method Not Allowed", [*text, ("Allow", "POST, PUT")])
            return [b"Only POST or PUT requests allowed.\n"]
        problem = self.reload()
        if problem is not None:  # as Prometheus answers a failed reload
            start_response("500 Internal Server Error", text)
            return [f"failed to reload config: {problem}\n".encode()]
        start_response("200 OK", text)
        return [b"config reloaded\n"]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128  # listen backlog (socketserver's default of 5 dropped concurrent scrapes)
    # Set by serve() before the first connection:
    ssl_context: ssl.SSLContext | None = None
    stats: Stats
    io_timeout = 10.0  # each read and write, the TLS handshake included
    deadline = 60.0  # a whole connection
    _slots: threading.BoundedSemaphore

    def configure(self, stats: Stats, io_timeout: float, deadline: float, max_workers: int) -> None:
        self.stats, self.io_timeout, self.deadline = stats, io_timeout, deadline
        self._slots = threading.BoundedSemaphore(max_workers)
        self._lock = threading.Lock()
        self._open: dict[int, float] = {}  # fd -> monotonic deadline of connections being served
        self._stopped = threading.Event()
        threading.Thread(target=self._reap, name="metrics-reaper", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        """In the serving thread: hand the connection to a worker, if one is free within a second."""
        if not self._slots.acquire(timeout=1.0):
            self.stats.refuse("busy")
            self.shutdown_request(request)
            return
        try:
            with self._lock:
                self._open[request.fileno()] = time.monotonic() + self.deadline
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request.fileno())
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """In a worker: TLS handshake (under the timeout), then the HTTP exchange."""
        fd = request.fileno()
        conn = request
        try:
            request.settimeout(self.io_timeout)
            if self.ssl_context is not None:
                try:
                    conn = self.ssl_context.wrap_socket(request, server_side=True)
                except OSError as exc:  # ssl.SSLError, a timeout, a reset: one client's problem
                    self.stats.refuse("tls_handshake")
                    log.debug("metrics: TLS handshake with %s failed: %s", client_address, exc)
                    return
            self.finish_request(conn, client_address)
        except TimeoutError as exc:  # reading the request (writes time out inside wsgiref's handler)
            self.stats.refuse("timeout")
            log.debug("metrics: connection from %s: %s", client_address, exc)
        except OSError as exc:  # resets, a connection cut at its deadline
            log.debug("metrics: connection from %s: %s", client_address, exc)
        except Exception:
            self.handle_error(conn, client_address)
        finally:
            self._forget(fd)  # before the close: the reaper must never touch a reused descriptor
            self.shutdown_request(conn)
            self._slots.release()

    def _forget(self, fd: int) -> None:
        with self._lock:
            self._open.pop(fd, None)

    def _reap(self) -> None:
        """Cut connections past their deadline (a client that trickles bytes beats a per-read timeout)."""
        while not self._stopped.wait(0.25):
            now = time.monotonic()
            with self._lock:
                for fd, deadline in list(self._open.items()):
                    if now > deadline:
                        del self._open[fd]
                        self.stats.refuse("deadline")
                        sock = socket.socket(fileno=fd)
                        try:
                            sock.shutdown(socket.SHUT_RDWR)  # wakes the worker; it closes the socket
                        except OSError:
                            pass
                        finally:
                            sock.detach()

    def shutdown(self) -> None:
        self._stopped.set()
        super().shutdown()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug(format, *args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server refuses a request it cannot parse before the app sees it: a request or
        header line over 64 KiB (414, 431), too many headers, a malformed request line (400)."""
        self.server.stats.refuse("header_too_large" if code in (414, 431) else "bad_request")
        super().send_error(code, message, explain)

    def get_stderr(self) -> ErrorStream:
        """Where wsgiref writes the traceback of a failed response (e.g. a write timeout): the debug log."""
        return _DebugLog()


class _DebugLog(io.TextIOBase):
    def write(self, text: str) -> int:
        if text.strip():
            log.debug("metrics: %s", text.rstrip())
        return len(text)


def serve(  # noqa: PLR0913 - keyword-only: the server's limits, with their defaults
    settings: WebSettings,
    registry: CollectorRegistry,
    *,
    reload: Reload | None = None,
    io_timeout: float = 10.0,
    deadline: float = 60.0,
    max_workers: int = 64,
) -> WSGIServer:
    """Start the metrics server in a daemon thread; returns it for shutdown()."""
    auth = None
    if settings.basic_auth:
        auth = (settings.basic_auth.username, settings.basic_auth.password_file.read_text().strip())
    ctx = None
    if settings.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(settings.tls.cert_file), str(settings.tls.key_file))
    host, port = settings.address()
    server_class = _Server6 if ":" in host else _Server
    stats = Stats()
    app = make_app(Snapshot(registry, stats=stats), auth, reload if settings.enable_lifecycle else None)
    server = make_server(host, port, app, server_class, _QuietHandler)
    assert isinstance(server, _Server)
    server.ssl_context = ctx
    server.configure(stats, io_timeout, deadline, max_workers)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
