"""What the responders share: how they count requests and how they fail to start."""

from __future__ import annotations

import errno
from collections.abc import Callable

# (responder, result, how many): accepted, not_allowed, revoked, rate_limited, malformed, dropped_queue_full
Count = Callable[[str, str, int], None]


class ResponderError(Exception):
    """A responder that cannot start (e.g. its port is taken)."""


def listen_error(what: str, host: str, port: int, exc: OSError) -> ResponderError:
    hint = " (another pathprobe, or another program, holds it)" if exc.errno == errno.EADDRINUSE else ""
    return ResponderError(f"{what}: cannot listen on {host}:{port}: {exc.strerror or exc}{hint}")
