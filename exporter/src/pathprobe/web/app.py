"""The /metrics app (WSGI): the snapshot at /metrics, the landing page, /-/healthy, /-/ready and
/-/reload, behind the web config's basic auth when it has users."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from typing import Any

from .. import __version__, build
from ..evidence import EvidenceStore
from ..webconfig import Passwords, RateLimit, RateLimiter, WebConfigSource
from . import formats
from .evidence import EvidenceRoutes, routed
from .snapshot import Snapshot

StartResponse = Callable[..., Any]


# An Authorization header longer than this is refused before any comparison.
MAX_AUTHORIZATION = 1024


# Answers a reload: None when the new config was applied, else what is wrong with it.
Reload = Callable[[], "str | None"]
# The store that /tests serves (web/evidence.py).
Evidence = EvidenceStore
# Answers /-/ready: None when ready, else why not.
Readiness = Callable[[], "str | None"]

# Answered without basic auth: health checks (the compose healthcheck, the Ansible role's wait
# for the start) need no scrape password, and what they tell (up; ready or why not) is no secret.
# TLS, and a client certificate where one is required, apply to them as to any connection.
OPEN_PATHS = ("/-/healthy", "/-/ready")
TEXT = [("Content-Type", "text/plain; charset=utf-8")]


def landing_page() -> bytes:
    """The page at /: the version and the endpoints, as the toolkit's exporters show them."""
    links = "".join(
        f'<li><a href="{href}">{href}</a>: {what}</li>'
        for href, what in (
            ("/metrics", "the metrics"),
            ("/-/healthy", "200 while the exporter serves"),
            ("/-/ready", "200 once it probes and answers peers, else 503 and why"),
            ("/tests", "the throughput tests' records (/tests/ID: one test's whole result)"),
        )
    )
    return (
        f"<!DOCTYPE html><html><head><title>pathprobe exporter</title></head><body><h1>pathprobe exporter</h1>"
        f"<p>Throughput, RTT and loss between regions. Version {html.escape(__version__)}, revision "
        f"{html.escape(build.revision())}.</p><ul>{links}</ul></body></html>\n"
    ).encode()


def _with_headers(start_response: StartResponse, extra: tuple[tuple[str, str], ...]) -> StartResponse:
    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return start_response(status, [*headers, *extra])

    return start


def make_app(
    snapshot: Snapshot,
    web_config: WebConfigSource | None = None,
    reload: Reload | None = None,
    ready: Readiness | None = None,
    evidence: EvidenceStore | None = None,
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    app = _App(snapshot, web_config or WebConfigSource(None), reload, ready)
    app.tests = EvidenceRoutes(evidence)
    return app


class _App:
    """The WSGI app: /metrics (the snapshot), /, /-/healthy, /-/ready and /-/reload, behind the
    web config's basic auth when it has users."""

    def __init__(self, snapshot: Snapshot, web_config: WebConfigSource, reload: Reload | None, ready: Readiness | None):
        self.snapshot, self.web_config, self.reload, self.ready = snapshot, web_config, reload, ready
        self.passwords = Passwords()
        self.limiter: RateLimiter | None = None
        self.landing = landing_page()
        self.tests = EvidenceRoutes(None)  # /tests and /tests/<id> (web/evidence.py)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        access = self.web_config.current()
        if access.headers:  # the web config's http_server_config.headers, on every answer (as the toolkit)
            start_response = _with_headers(start_response, access.headers)
        if access.rate_limit is not None and not self._limiter(access.rate_limit).allow():
            self._refuse("rate_limited")  # as the toolkit: before basic auth, on every path
            start_response("429 Too Many Requests", TEXT)
            return [b"Too Many Requests\n"]
        path = environ.get("PATH_INFO", "/")
        if path not in OPEN_PATHS:
            refused = self._unauthorized(environ, start_response)
            if refused is not None:
                return refused
        routes = {
            "/metrics": self._metrics,
            "/-/healthy": self._healthy,
            "/-/ready": self._ready,
            "/-/reload": self._lifecycle,
            "/": self._landing,
        }
        route = self.tests if routed(path) else routes.get(path)
        if route is None:
            start_response("404 Not Found", TEXT)
            return [b"Not found\n"]
        return route(environ, start_response)

    def _limiter(self, limit: RateLimit) -> RateLimiter:
        """The limiter of the rate limit in force (a new one when the file changed it)."""
        limiter = self.limiter
        if limiter is None or limiter.limit != limit:
            limiter = self.limiter = RateLimiter(limit)
        return limiter

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
        gz = formats.gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        body, content_type = self.snapshot.serve(
            environ.get("HTTP_ACCEPT", ""), gzipped=gz, source=environ.get("REMOTE_ADDR", "")
        )
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
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
