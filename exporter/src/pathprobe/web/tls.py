"""TLS for /metrics' server, as Go's crypto/tls and net/http end the cases Python's asyncio would
end otherwise: a refused handshake sends its alert (protocol_version, handshake_failure,
certificate_required, unknown_ca) before the close, and a plain HTTP request on the TLS port is
answered with Go's 400 rather than a close. A connection's context is the web config's at its
start (`webconfig.WebConfigSource.current`), so that a changed certificate or policy applies to
the next connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from asyncio import sslproto
from typing import Any

log = logging.getLogger(__package__)  # one logger for /metrics: pathprobe.web

# asyncio gives every TLS connection a 256 KiB read buffer, filled on allocation: 64 idle TLS
# connections held 16 MiB, 4,096 would hold 1 GiB. One read never yields more than a TLS record
# (16 KiB); nothing else in the exporter speaks TLS through asyncio.
sslproto.SSLProtocol.max_size = 16 * 1024

_handshake_complete = sslproto.SSLProtocol._on_handshake_complete


def _send_alert_first(self: Any, handshake_exc: BaseException | None) -> None:
    """asyncio drops what OpenSSL wrote after a failed handshake (its alert) and aborts the
    connection: the client sees a close, not why. The alert goes out first, as Go's server sends it."""
    if handshake_exc is not None and self._transport is not None:
        alert = self._outgoing.read()
        if alert:
            self._transport.write(alert)
    _handshake_complete(self, handshake_exc)


sslproto.SSLProtocol._on_handshake_complete = _send_alert_first  # type: ignore[method-assign]

# What Go's net/http answers an HTTP request on its TLS port with (server.go), recognised, as Go
# does, by a record header that reads as an HTTP method.
HTTP_ON_TLS = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
_HTTP_STARTS = (b"GET /", b"HEAD ", b"POST ", b"PUT /", b"OPTIO")


def looks_like_http(first: bytes) -> bool:
    """Whether the first bytes a client sent to the TLS port are an HTTP request's (5 of them)."""
    return first[:5] in _HTTP_STARTS


async def answer_http_on_tls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_head: int) -> None:
    """Go's answer to a plain HTTP request on the TLS port, and the end of the stream; the
    request is read (up to `max_head`, for a second at most) so that the close is not a reset,
    which would take the answer with it."""
    writer.write(HTTP_ON_TLS)
    writer.write_eof()
    await writer.drain()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(1.0):
            await reader.read(max_head)
