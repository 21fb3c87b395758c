"""/metrics over HTTP(S), optionally with basic auth, served from a snapshot.

Rendering the registry costs time in proportion to peers (about 0.5 s for 500
peers with prometheus_client), and a scrape must never wait on that. So a
background thread renders a snapshot every `refresh` seconds (slower when
rendering is slow, so that it never takes more than 5% of a core) for as long as
scrapes keep coming, and a scrape returns the latest snapshot at once. Only the
very first scrape renders in the request. What a scrape reads is at most
`refresh` seconds old (it says how old in pathprobe_scrape_snapshot_age_seconds),
and every result carries its own timestamp metric.
"""

from __future__ import annotations

import base64
import gzip
import hmac
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .config import WebSettings

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]


class Snapshot:
    def __init__(self, registry: CollectorRegistry, refresh: float = 5.0, idle_after: float = 300.0):
        self.registry = registry
        self.refresh, self.idle_after = refresh, idle_after
        self._lock = threading.Lock()
        self._body = b""
        self._gzipped = b""
        self._taken = 0.0
        self._render_seconds = 0.0
        self._last_scrape = 0.0
        self._scraped = threading.Event()
        self._thread: threading.Thread | None = None

    def render(self) -> None:
        start = time.monotonic()
        body = generate_latest(self.registry)
        # Compressed once here rather than per scrape (Prometheus asks for gzip): a 500-peer
        # exposition is about 9 MB of text and 0.5 MB gzipped.
        gzipped = gzip.compress(body, compresslevel=1)
        with self._lock:
            self._body, self._gzipped, self._taken = body, gzipped, time.monotonic()
            self._render_seconds = self._taken - start

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
            first = not self._body
            if self._thread is None:
                self._thread = threading.Thread(target=self._refresh_loop, name="render", daemon=True)
                self._thread.start()
        if first:
            self.render()
        self._scraped.set()
        with self._lock:
            trailer = _trailer(time.monotonic() - self._taken, self._render_seconds)
            if gzipped:
                return self._gzipped + gzip.compress(trailer, compresslevel=1)
            return self._body + trailer


def _trailer(age: float, render_seconds: float) -> bytes:
    return (
        "# HELP pathprobe_scrape_snapshot_age_seconds Age of the metrics snapshot this scrape returned.\n"
        "# TYPE pathprobe_scrape_snapshot_age_seconds gauge\n"
        f"pathprobe_scrape_snapshot_age_seconds {age:.6f}\n"
        "# HELP pathprobe_scrape_render_seconds Time taken to render that snapshot.\n"
        "# TYPE pathprobe_scrape_render_seconds gauge\n"
        f"pathprobe_scrape_render_seconds {render_seconds:.6f}\n"
    ).encode()


LANDING = b"""<html><head><title>pathprobe</title></head><body><h1>pathprobe</h1>
<p><a href="/metrics">Metrics</a></p></body></html>"""


def make_app(
    snapshot: Snapshot, basic_auth: tuple[str, str] | None
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    expected = None
    if basic_auth:
        expected = b"Basic " + base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode())

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if expected is not None:
            given = environ.get("HTTP_AUTHORIZATION", "").encode()
            if not hmac.compare_digest(given, expected):
                start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="pathprobe"')])
                return [b"Unauthorized\n"]
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            gz = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
            body = snapshot.get(gzipped=gz)
            headers = [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))]
            if gz:
                headers.append(("Content-Encoding", "gzip"))
            start_response("200 OK", headers)
            return [body]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html")])
            return [LANDING]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"Not found\n"]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug(format, *args)


def serve(settings: WebSettings, registry: CollectorRegistry) -> WSGIServer:
    """Start the metrics server in a daemon thread; returns it for shutdown()."""
    auth = None
    if settings.basic_auth:
        auth = (settings.basic_auth.username, settings.basic_auth.password_file.read_text().strip())
    host, port = settings.address()
    server_class = _Server6 if ":" in host else _Server
    server = make_server(host, port, make_app(Snapshot(registry), auth), server_class, _QuietHandler)
    if settings.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(settings.tls.cert_file), str(settings.tls.key_file))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
