"""/metrics over HTTP(S), optionally with basic auth, served from a snapshot.

Rendering the registry costs time in proportion to peers (about 0.3 s for 500
peers with prometheus_client), and a scrape must never wait on that. So a scrape
gets the last snapshot at once and asks for a fresh one in the background
(stale-while-revalidate): what it reads is at most one scrape interval old, and
every result carries its own timestamp metric. A snapshot older than
`MAX_AGE` (nobody scraped for a while) is rendered in the request instead.
"""

from __future__ import annotations

import base64
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
MAX_AGE = 60.0

StartResponse = Callable[..., Any]


class Snapshot:
    def __init__(self, registry: CollectorRegistry, max_age: float = MAX_AGE):
        self.registry = registry
        self.max_age = max_age
        self._lock = threading.Lock()
        self._body = b""
        self._taken = 0.0
        self._render_seconds = 0.0
        self._refreshing = False

    def _render(self) -> None:
        start = time.monotonic()
        body = generate_latest(self.registry)
        with self._lock:
            self._body, self._taken = body, time.monotonic()
            self._render_seconds = self._taken - start
            self._refreshing = False

    def get(self) -> bytes:
        with self._lock:
            stale = not self._body or time.monotonic() - self._taken > self.max_age
            refresh = not stale and not self._refreshing
            if refresh:
                self._refreshing = True
        if stale:
            self._render()
        elif refresh:
            threading.Thread(target=self._render, name="render", daemon=True).start()
        with self._lock:
            age = time.monotonic() - self._taken
            return self._body + _trailer(age, self._render_seconds)


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
            body = snapshot.get()
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
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
