"""HTTP/1.1 for /metrics' server: a request read from a stream into a WSGI environ, and an
answer as the bytes on the wire. The connection is kept open for the next request, as Go's
net/http keeps it (a scrape of a TLS exporter then costs no handshake), unless the client asks
for a close or speaks HTTP/1.0, or the request was refused before the app (its stream may be
out of step)."""

from __future__ import annotations

import io
import logging
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .app import StartResponse

log = logging.getLogger(__package__)  # one logger for /metrics: pathprobe.web

WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

# The first byte of a TLS record carrying a handshake (a ClientHello): a TLS client on the plain port.
TLS_HANDSHAKE = 0x16


class Refusal(Exception):
    """A request refused before the app: counted under `reason`, answered with `status`."""

    def __init__(self, reason: str, status: str):
        super().__init__(status)
        self.reason, self.status = reason, status


@dataclass(frozen=True)
class Answer:
    """An answer on the wire, and whether the connection closes after it."""

    data: bytes
    close: bool


def response(
    status: str, headers: list[tuple[str, str]], body: bytes, *, head_only: bool = False, close: bool = True
) -> bytes:
    names = {name.lower() for name, _ in headers}
    extra = [] if "content-length" in names else [("Content-Length", str(len(body)))]
    if close:
        extra.append(("Connection", "close"))
    lines = [f"HTTP/1.1 {status}", *(f"{n}: {v}" for n, v in [*headers, *extra]), "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head_only else body)


def refused(refusal: Refusal) -> bytes:
    return response(refusal.status, [("Content-Type", "text/plain")], refusal.status.encode() + b"\n")


def parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    """Method, target, version and headers of a request head (ending in CRLF CRLF)."""
    lines = head.decode("latin-1").split("\r\n")[:-2]
    parts = lines[0].split(" ") if lines else []
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        raise Refusal("bad_request", "400 Bad Request")
    if len(lines) > 101:  # http.server's limit of 100 headers
        raise Refusal("header_too_large", "431 Request Header Fields Too Large")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():  # no folded or malformed lines
            raise Refusal("bad_request", "400 Bad Request")
        headers.append((name, value.strip()))
    return parts[0], parts[1], parts[2], headers


def environ_of(head: bytes, source: str, max_body: int) -> dict[str, Any]:
    """The WSGI environ of a request head, its body still to read (`CONTENT_LENGTH` bytes)."""
    method, target, version, headers = parse_head(head)
    path, _, query = target.partition("?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "PATH_INFO": urllib.parse.unquote(path, "latin-1"),
        "QUERY_STRING": query,
        "SERVER_PROTOCOL": version,
        "REMOTE_ADDR": source,
        "wsgi.url_scheme": "http",
    }
    for name, value in headers:
        key = name.upper().replace("-", "_")
        key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + key
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    if "HTTP_TRANSFER_ENCODING" in environ:  # nothing here takes a chunked body
        raise Refusal("bad_request", "411 Length Required")
    length = environ.get("CONTENT_LENGTH", "0")
    if not length.isdigit() or int(length) > max_body:
        raise Refusal("bad_request", "413 Content Too Large")
    environ["wsgi.input"] = io.BytesIO()
    return environ


def keeps_open(environ: dict[str, Any]) -> bool:
    """Whether the connection stays open for another request (RFC 9112 9.3): HTTP/1.1 unless the
    client asks for a close; an HTTP/1.0 client's is closed after the answer."""
    tokens = {t.strip().lower() for t in environ.get("HTTP_CONNECTION", "").split(",")}
    return environ["SERVER_PROTOCOL"] == "HTTP/1.1" and "close" not in tokens


def answer(app: WsgiApp, environ: dict[str, Any], keep: bool) -> Answer:
    """The app's whole response to one request, as bytes on the wire (in a worker thread);
    `keep`: whether the connection may stay open after it."""
    started: list[Any] = []
    head_only = environ["REQUEST_METHOD"] == "HEAD"
    try:
        body = b"".join(app(environ, lambda status, headers, exc_info=None: started.extend((status, headers))))
    except Exception:
        log.exception("metrics: answering %s %s failed", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))
        error = response("500 Internal Server Error", [("Content-Type", "text/plain")], b"Internal error\n")
        return Answer(error, close=True)
    return Answer(response(started[0], list(started[1]), body, head_only=head_only, close=not keep), close=not keep)
