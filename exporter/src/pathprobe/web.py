"""/metrics over HTTP(S), optionally with basic auth, served from a snapshot.

Rendering the registry costs time in proportion to peers (about 0.5 s for 500
peers with prometheus_client), and a scrape must never wait on that. So a
background thread renders a snapshot for as long as scrapes keep coming, and a
scrape returns the latest snapshot at once. Only the very first scrape renders in
the request. Prometheus scrapes at a fixed interval, so each render is timed just
ahead of the next scrape expected (Scrapers): a scraper that keeps its interval
reads a snapshot a few render times old, and a render is made per scrape, not per
`refresh` (at a 15 s scrape interval, a third of the renders). Renders are at least
`refresh` seconds apart (`web.refresh_seconds`; more when rendering is slow, so that it never
takes more than 5% of a core) and at most MAX_AGE_SECONDS; with no scraper keeping an
interval, they come every `refresh`.
What a scrape reads says how old it is (pathprobe_scrape_snapshot_age_seconds), and
every result carries its own timestamp metric. A render that raises is logged and
counted (pathprobe_scrape_render_errors_total) and the last good snapshot is served on,
its age growing, until the next render succeeds: /metrics never answers 500 for what
the exporter holds.

Connections are handled as Go's net/http with ReadHeaderTimeout handles them, so that no
client, idle, slow or many, can hold an authorized scrape off: the server's own event loop
(a thread of its own, apart from the exporter's) accepts every connection and runs its TLS
handshake and reads its request without blocking, each phase under its deadline (`Limits`);
a slow connection costs a descriptor, never a worker. A connection that sends nothing costs
nothing: the kernel holds it until its first byte (TCP_DEFER_ACCEPT, as nginx's `deferred`),
and one closed before then is dropped as it is accepted. Only requests read whole go to a small
pool of workers that run the app. Connections are capped per source address and in all; at a
cap, a new connection displaces the oldest one still reading its request (of its own address
first), so that a flood displaces itself and the scraper's next connection gets in. Connections
refused, displaced or cut short are counted in pathprobe_web_refused_total{reason}, rendered
with the snapshot's trailer.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import gzip
import html
import io
import logging
import resource
import socket
import ssl
import threading
import time
import urllib.parse
from asyncio import sslproto
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from . import __version__, build
from .config import WebSettings
from .webconfig import Passwords, WebConfigSource

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]


REFUSED_REASONS = (
    "busy",
    "source_limit",
    "deadline",
    "timeout",
    "tls_handshake",
    "unauthorized",
    "header_too_large",
    "bad_request",
)


class Stats:
    """Connections refused or cut short, by reason (REFUSED_REASONS); shared by the server and the app."""

    def __init__(self, web_config: WebConfigSource | None = None) -> None:
        self._lock = threading.Lock()
        self.refused: Counter[str] = Counter()
        self.web_config = web_config

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
            *(self.web_config.exposition() if self.web_config is not None else []),
        ]
        return ("\n".join(lines) + "\n").encode()


# A render falls due this many render times, and this much more, before the next scrape expected.
RENDER_LEAD, RENDER_MARGIN_SECONDS = 2, 0.1
# The oldest a snapshot gets while scrapes come (unless rendering is slow): half the 30 s after
# which PathprobeMetricsSnapshotStale fires (monitoring params: snapshot_stale_seconds).
MAX_AGE_SECONDS = 15.0


class Scrapers:
    """When each scraper (by source address) is expected next: Prometheus scrapes a target at a
    fixed interval (its scrape_interval, 1m by default), so its next scrape comes one interval
    after its last."""

    def __init__(self, kept: int = 16) -> None:
        self.kept = kept
        self._seen: dict[str, tuple[float, float | None]] = {}  # source -> (last scrape, the interval before it)

    def scraped(self, source: str, now: float) -> None:
        before = self._seen.pop(source, None)
        self._seen[source] = (now, now - before[0] if before else None)
        if len(self._seen) > self.kept:
            del self._seen[next(iter(self._seen))]  # the one unheard of longest

    def next_expected(self, now: float, shortest: float = 0.0) -> float | None:
        """The earliest next scrape of a scraper keeping an interval of at least `shortest` (its last
        scrape less than two intervals ago); None when none does. Past `now` when a scrape is due and late."""
        expected = [last + interval for last, interval in self._seen.values()
                    if interval and interval >= shortest and now - last < 2 * interval]  # fmt: skip
        return min(expected, default=None)


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
        self._render_seconds = 0.0  # the last render's wall-clock time: how far ahead of a scrape to start one
        self._render_cpu_seconds = 0.0  # its CPU time: how far apart renders must be to take at most 5% of a core
        self._tried = self._taken  # when the last render began, whether or not it succeeded
        self._rendered_for: float | None = None  # the expected scrape the thread's last render was timed for
        self._last_scrape = 0.0
        self._scrapers = Scrapers()
        self._scraped = threading.Event()
        self._news = threading.Event()  # a scrape (or close) since the render thread last timed its render
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.render_errors = 0
        self._failing = 0  # renders failed in a row

    def render(self) -> None:
        """A new snapshot; on an error, the last one stays (never raises)."""
        start, cpu_start = time.monotonic(), time.thread_time()
        self._tried = start
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
            self._render_cpu_seconds = time.thread_time() - cpu_start
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

    def next_render(self, now: float) -> float:
        """When the next render falls due: just ahead of the next scrape expected (RENDER_LEAD
        render times before it), so that a scraper keeping its interval reads a snapshot that
        fresh, and every render is read; but no sooner than `refresh` after the last one began (nor
        than 20 times its CPU time: at most 5% of a core; its wall-clock time on a busy host, when the
        render thread waits for a CPU, would hold the next render off for nothing), and no later than
        MAX_AGE_SECONDS after it (a scrape that comes early, or another client, reads no older
        snapshot). With no scraper keeping an interval (the first scrapes, or a client now and then):
        every `refresh`."""
        return self._timing(now)[0]

    def _timing(self, now: float) -> tuple[float, float | None]:
        """next_render's time, and the expected scrape it is timed for (None: not timed for one)."""
        with self._lock:
            floor = self._tried + max(self.refresh, 20 * self._render_cpu_seconds)
            # A scraper more often than `refresh` gets a render per `refresh` (as it always did), not timed for it.
            expected = self._scrapers.next_expected(now, shortest=self.refresh)
            lead = RENDER_LEAD * self._render_seconds + RENDER_MARGIN_SECONDS
        # Rendered for it already (timed for it, or begun within its lead): again only if it is
        # `refresh` late. "Timed for it" counts on its own because the lead moves with each render's
        # time: a render timed with a longer lead than its own time gives would otherwise look early.
        if expected is None:
            due, timed_for = floor, None
        elif self._rendered_for == expected or self._tried >= expected - lead:
            due, timed_for = max(floor, expected + self.refresh), None
        else:
            due, timed_for = max(floor, expected - lead), expected
        capped = max(floor, self._tried + MAX_AGE_SECONDS)
        return (due, timed_for) if due <= capped else (capped, None)

    def _refresh_loop(self) -> None:
        while not self._closed.is_set():
            self._scraped.wait()
            self._news.clear()
            if self._closed.is_set():
                return
            due, timed_for = self._timing(time.monotonic())
            if self._news.wait(max(0.0, due - time.monotonic())):
                continue  # a scrape came meanwhile: the render is timed again (or the snapshot closed)
            self.render()
            self._rendered_for = timed_for
            if time.monotonic() - self._last_scrape > self.idle_after:
                self._scraped.clear()  # nobody scrapes: stop rendering until someone does

    def close(self) -> None:
        """Stop the background renders (a process's last snapshot is never closed: it exits)."""
        self._closed.set()
        self._scraped.set()
        self._news.set()

    def get(self, gzipped: bool = False, source: str = "") -> bytes:
        """The latest snapshot, plus its age; gzip members concatenate, so the trailer is a member of its own.
        `source`: the scraper's address, whose interval times the renders."""
        self._last_scrape = time.monotonic()
        with self._lock:
            self._scrapers.scraped(source, self._last_scrape)
            first = not self._body and not self.render_errors  # the very first scrape renders itself
            if self._thread is None:
                self._thread = threading.Thread(target=self._refresh_loop, name="render", daemon=True)
                self._thread.start()
        if first:
            self.render()
        self._scraped.set()
        self._news.set()
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


# An Authorization header longer than this is refused before any comparison.
MAX_AUTHORIZATION = 1024


# Answers a reload: None when the new config was applied, else what is wrong with it.
Reload = Callable[[], "str | None"]
# Answers /-/ready: None when ready, else why not.
Readiness = Callable[[], "str | None"]

# Answered without basic auth: health checks (the compose healthcheck, the Ansible role's wait
# for the start) need no scrape password, and what they tell (up; ready or why not) is no secret.
# TLS, and a client certificate where one is required, apply to them as to any connection.
OPEN_PATHS = ("/-/healthy", "/-/ready")
TEXT = [("Content-Type", "text/plain; charset=utf-8")]


def landing_page() -> bytes:
    """The page at /: the version and the endpoints, as the toolkit's exporters show them."""
    links = "".join(f'<li><a href="{href}">{href}</a>: {what}</li>' for href, what in (
        ("/metrics", "the metrics"), ("/-/healthy", "200 while the exporter serves"),
        ("/-/ready", "200 once it probes and answers peers, else 503 and why")))  # fmt: skip
    return (f"<!DOCTYPE html><html><head><title>pathprobe exporter</title></head><body><h1>pathprobe exporter</h1>"
            f"<p>Throughput, RTT and loss between regions. Version {html.escape(__version__)}, revision "
            f"{html.escape(build.revision())}.</p><ul>{links}</ul></body></html>\n").encode()  # fmt: skip


def make_app(snapshot: Snapshot, web_config: WebConfigSource | None = None, reload: Reload | None = None,
             ready: Readiness | None = None) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:  # fmt: skip
    return _App(snapshot, web_config or WebConfigSource(None), reload, ready)


class _App:
    """The WSGI app: /metrics (the snapshot), /, /-/healthy, /-/ready and /-/reload, behind the
    web config's basic auth when it has users."""

    def __init__(self, snapshot: Snapshot, web_config: WebConfigSource, reload: Reload | None,
                 ready: Readiness | None):  # fmt: skip
        self.snapshot, self.web_config, self.reload, self.ready = snapshot, web_config, reload, ready
        self.passwords = Passwords()
        self.landing = landing_page()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path not in OPEN_PATHS:
            refused = self._unauthorized(environ, start_response)
            if refused is not None:
                return refused
        routes = {"/metrics": self._metrics, "/-/healthy": self._healthy, "/-/ready": self._ready,
                  "/-/reload": self._lifecycle, "/": self._landing}  # fmt: skip
        route = routes.get(path)
        if route is None:
            start_response("404 Not Found", TEXT)
            return [b"Not found\n"]
        return route(environ, start_response)

    def _healthy(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        start_response("200 OK", TEXT)
        return [b"pathprobe is healthy.\n"]

    def _ready(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        problem = self.ready() if self.ready is not None else None
        if problem is not None:
            start_response("503 Service Unavailable", TEXT)
            return [f"pathprobe is not ready: {problem}\n".encode()]
        start_response("200 OK", TEXT)
        return [b"pathprobe is ready.\n"]

    def _landing(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [self.landing]

    def _refuse(self, reason: str) -> None:
        if self.snapshot.stats is not None:
            self.snapshot.stats.refuse(reason)

    def _unauthorized(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes] | None:
        """The answer refusing a request without a user's password; None when it may go on."""
        users = self.web_config.current().users
        if not users:
            return None
        given = environ.get("HTTP_AUTHORIZATION", "")
        if len(given) > MAX_AUTHORIZATION:
            self._refuse("header_too_large")
            start_response("431 Request Header Fields Too Large", [("Content-Type", "text/plain")])
            return [b"Authorization header too large\n"]
        if not self.passwords.check(users, given):
            self._refuse("unauthorized")
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="pathprobe"')])
            return [b"Unauthorized\n"]
        return None

    def _metrics(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        gz = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        body = self.snapshot.get(gzipped=gz, source=environ.get("REMOTE_ADDR", ""))
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


@dataclass(frozen=True)
class Limits:
    """What one connection to /metrics may hold, and for how long.

    As Go's net/http (ReadHeaderTimeout, a goroutine per connection, no pool to fill), an idle
    or slow connection costs a descriptor and a coroutine on the server's event loop, never a
    worker: workers only answer requests read whole. Each phase has its own deadline from the
    moment it starts, so a client that trickles bytes gains nothing over one that sends none.
    """

    handshake_seconds: float = 5.0  # the TLS handshake
    request_seconds: float = 5.0  # request line, headers and body, once the handshake is done
    write_seconds: float = 10.0  # the whole response (a 500-peer exposition is 9 MB ungzipped)
    deadline_seconds: float = 60.0  # the whole connection
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


class _Refusal(Exception):
    """A request refused before the app: counted under `reason`, answered with `status`."""

    def __init__(self, reason: str, status: str):
        super().__init__(status)
        self.reason, self.status = reason, status


class _Conn:
    """One accepted connection: its source, its task, and whether it may still be displaced."""

    __slots__ = ("evicted", "reading", "source", "task", "writer")

    def __init__(self, source: str, task: asyncio.Task[None], writer: asyncio.StreamWriter):
        self.source, self.task, self.writer = source, task, writer
        self.reading = True  # handshake or request not done yet: the connection may be displaced
        self.evicted = False


def _response(status: str, headers: list[tuple[str, str]], body: bytes, head_only: bool = False) -> bytes:
    names = {name.lower() for name, _ in headers}
    extra = [] if "content-length" in names else [("Content-Length", str(len(body)))]
    lines = [f"HTTP/1.1 {status}", *(f"{n}: {v}" for n, v in [*headers, *extra]), "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head_only else body)


def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    """Method, target, version and headers of a request head (ending in CRLF CRLF)."""
    lines = head.decode("latin-1").split("\r\n")[:-2]
    parts = lines[0].split(" ") if lines else []
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        raise _Refusal("bad_request", "400 Bad Request")
    if len(lines) > 101:  # http.server's limit of 100 headers
        raise _Refusal("header_too_large", "431 Request Header Fields Too Large")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():  # no folded or malformed lines
            raise _Refusal("bad_request", "400 Bad Request")
        headers.append((name, value.strip()))
    return parts[0], parts[1], parts[2], headers


async def _read_request(reader: asyncio.StreamReader, limits: Limits, source: str) -> dict[str, Any] | None:
    """The WSGI environ of the next request; None when the client closed before sending one."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as exc:  # the head is over `max_head`: the reader's limit
        raise _Refusal("header_too_large", "431 Request Header Fields Too Large") from exc
    except asyncio.IncompleteReadError:
        return None
    method, target, version, headers = _parse_head(head)
    path, _, query = target.partition("?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method, "PATH_INFO": urllib.parse.unquote(path, "latin-1"), "QUERY_STRING": query,
        "SERVER_PROTOCOL": version, "REMOTE_ADDR": source, "wsgi.url_scheme": "http",
    }  # fmt: skip
    for name, value in headers:
        key = name.upper().replace("-", "_")
        key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + key
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    if "HTTP_TRANSFER_ENCODING" in environ:  # nothing here takes a chunked body
        raise _Refusal("bad_request", "411 Length Required")
    length = environ.get("CONTENT_LENGTH", "0")
    if not length.isdigit() or int(length) > limits.max_body:
        raise _Refusal("bad_request", "413 Content Too Large")
    environ["wsgi.input"] = io.BytesIO(await reader.readexactly(int(length)))
    return environ


WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

# asyncio gives every TLS connection a 256 KiB read buffer, filled on allocation: 64 idle TLS
# connections held 16 MiB, 4,096 would hold 1 GiB. One read never yields more than a TLS record
# (16 KiB); nothing else in the exporter speaks TLS through asyncio.
sslproto.SSLProtocol.max_size = 16 * 1024


def answer(app: WsgiApp, environ: dict[str, Any]) -> bytes:
    """The app's whole response to one request, as bytes on the wire (in a worker thread)."""
    started: list[Any] = []
    try:
        body = b"".join(app(environ, lambda status, headers, exc_info=None: started.extend((status, headers))))
    except Exception:
        log.exception("metrics: answering %s %s failed", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))
        return _response("500 Internal Server Error", [("Content-Type", "text/plain")], b"Internal error\n")
    return _response(started[0], list(started[1]), body, head_only=environ["REQUEST_METHOD"] == "HEAD")


MAX_WAITING = 1024  # connections taken from the kernel (10 us each) and not yet given a stream
START_BATCH = 16  # streams made per turn of the server's loop (`_start_some`)
# Connections the kernel holds for the server: accepted and not yet taken, and (with
# TCP_DEFER_ACCEPT) connected but silent. Beyond it, Linux answers with SYN cookies, and such a
# connection is handed over at once (to the caps and deadlines below). Capped by net.core.somaxconn.
BACKLOG = 4096


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
        self, listener: socket.socket, app: WsgiApp, *, stats: Stats, web_config: WebConfigSource, limits: Limits,
    ) -> None:  # fmt: skip
        self.listener, self.app, self.stats, self.web_config, self.limits = listener, app, stats, web_config, limits
        self.server_address = listener.getsockname()
        self.max_connections = limits.connections or default_connections()
        self._by_source: dict[str, list[_Conn]] = {}  # oldest first
        self._tasks: set[asyncio.Task[None]] = set()  # every connection's, closing ones included
        self._stopping = False
        self._open = 0
        # Accepted, not yet given a stream: by source, and the sources in turn (`_start_some`).
        self._waiting: dict[str, collections.deque[socket.socket]] = {}
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
            self.listener.setblocking(False)
            self._loop.add_reader(self.listener, self._accept)
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        self._loop.run_forever()

    def _accept(self) -> None:
        """The listener is readable: takes what the kernel has queued, which is cheap, and drops at
        once a connection the client closed before it sent a byte (with TCP_DEFER_ACCEPT those
        are the only ones without a request: a flood of silent connections reaches the server as
        a burst of them when the flood lets go). The rest wait, by source, for `_start_some`."""
        while self._waiting_count < MAX_WAITING:  # beyond, they wait in the kernel's queue
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of descriptors: pause a second, as asyncio's own server does, not spin
                log.warning("metrics: accept failed, pausing for a second: %s", exc)
                self._loop.remove_reader(self.listener)
                self._loop.call_later(1.0, self._loop.add_reader, self.listener, self._accept)
                break
            sock.setblocking(False)
            try:
                closed = sock.recv(1, socket.MSG_PEEK) == b""
            except BlockingIOError:  # nothing sent yet: a slow client, served under its deadlines
                closed = False
            except OSError:  # reset
                closed = True
            if closed:
                sock.close()
                continue
            source = str(address[0])
            if source not in self._waiting:
                self._turns.append(source)
            self._waiting.setdefault(source, collections.deque()).append(sock)
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
            sock = waiting.popleft()
            self._waiting_count -= 1
            if waiting:
                self._turns.append(source)
            else:
                del self._waiting[source]
            task = self._loop.create_task(self._accepted(sock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._starting = bool(self._turns)
        if self._starting:
            self._loop.call_soon(self._start_some)

    async def _accepted(self, sock: socket.socket) -> None:
        """A stream for `sock`, whose protocol starts `_connection` (as asyncio.start_server's
        does: a stream with a callback is the server side of a later start_tls)."""
        protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=self.limits.max_head), self._connection)
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, sock)
        except OSError:
            sock.close()

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
        self.listener.close()

    def server_close(self) -> None:
        self.listener.close()

    async def _stop(self) -> None:
        self._stopping = True
        self._loop.remove_reader(self.listener)
        for waiting in self._waiting.values():
            for sock in waiting:
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

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
                clean = await self._exchange(conn, reader, writer)
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

    async def _exchange(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """TLS handshake, request, answer, each under its deadline; True once the answer is out whole.
        A phase past its deadline raises TimeoutError (counted as `timeout`)."""
        # Per connection: a certificate, key, CA or users file changed on disk takes effect
        # with the next connection (webconfig.WebConfigSource looks every few seconds).
        context = self.web_config.current().ssl_context
        if context is not None and not await self._handshake(conn, writer, context):
            return False
        try:
            async with asyncio.timeout(self.limits.request_seconds):
                environ = await _read_request(reader, self.limits, conn.source)
            if environ is None:
                return False
            environ["wsgi.url_scheme"] = "https" if context is not None else "http"
            conn.reading = False
            response = await self._loop.run_in_executor(self._pool, answer, self.app, environ)
        except _Refusal as refusal:
            self.stats.refuse(refusal.reason)
            response = _response(refusal.status, [("Content-Type", "text/plain")], refusal.status.encode() + b"\n")
        async with asyncio.timeout(self.limits.write_seconds):
            writer.write(response)
            await writer.drain()
        return True

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
    settings: WebSettings, registry: CollectorRegistry, *, reload: Reload | None = None, ready: Readiness | None = None,
    web_config: WebConfigSource | None = None, limits: Limits | None = None,
) -> MetricsServer:  # fmt: skip
    """Start the metrics server in a daemon thread; returns it for shutdown(). `web_config`: TLS
    and basic auth (default: settings.config_file's; raises yamlfile.ConfigError when it is bad)."""
    if web_config is None:
        web_config = WebConfigSource(settings.config_file)
    host, port = settings.address()
    limits = limits or Limits()
    # Bound here, not in the server's thread: a taken port is the caller's OSError.
    listener = socket.create_server(
        (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=BACKLOG, reuse_port=False
    )
    # As nginx's `listen ... deferred`: the kernel holds a connection until its first byte (or
    # its close) arrives, so a client that connects and sends nothing costs the exporter nothing
    # for that long (its deadlines run from the hand-over), and a scrape is never accepted
    # behind a flood of them.
    try:
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, limits.defer_accept_seconds)
        stats = Stats(web_config)
        snapshot = Snapshot(registry, refresh=settings.refresh_seconds, stats=stats)
        app = make_app(snapshot, web_config, reload if settings.enable_lifecycle else None, ready)
        return MetricsServer(listener, app, stats=stats, web_config=web_config, limits=limits)
    except BaseException:
        listener.close()
        raise
