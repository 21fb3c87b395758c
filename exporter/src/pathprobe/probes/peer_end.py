"""The peer's end of a throughput test, as its responder reports it (wire.py's served-test report):
its iperf3 version and server ports, and what its iperf3 and its host used during the test
(ends.EndFigures). A report is the peer's word, checked field by field before it is used: one
that is malformed, or whose figures are not physically possible, is set aside with the reason."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import Any

from .. import ends, wire
from .base import Target

# The report's request and answer take at most this long beyond the wait for the test's end.
REPORT_TIMEOUT_SECONDS = 3.0
# How long the prober lets the peer's server take to notice its test ended (the client's end comes
# first: the server reads the end from the control connection, within a round trip).
REPORT_WAIT_SECONDS = 2.0
MAX_PORTS = 64


@dataclass(frozen=True)
class PeerEnd:
    """What the peer reported: `end` None when it reported no figures (an older responder, a test it
    did not watch) or when they were set aside (`rejected` says why)."""

    version: str | None = None
    ports: tuple[int, ...] = ()
    end: ends.EndFigures | None = None
    rejected: str | None = None
    reported: bool = False  # whether the responder answered the request at all


def parse(body: bytes, test_seconds: float) -> PeerEnd:
    """A report's JSON; `test_seconds`: how long ago this host's test started (a report of a test
    that ended before it is another test's)."""
    try:
        doc, version, ports = _served(body)
    except ValueError as exc:
        return PeerEnd(reported=True, rejected=str(exc))
    try:
        end = _end(doc, test_seconds)
    except ValueError as exc:
        return PeerEnd(version, ports, reported=True, rejected=str(exc))
    return PeerEnd(version, ports, end, reported=True)


def _served(body: bytes) -> tuple[dict[str, Any], str | None, tuple[int, ...]]:
    """The report as an object, and its iperf3's version and ports; ValueError for a bad one."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    served = doc.get("iperf3")
    version: Any = served.get("version") if isinstance(served, dict) else None
    ports: Any = served.get("ports", []) if isinstance(served, dict) else []
    if version is not None and (not isinstance(version, str) or not ends.valid_version(version)):
        raise ValueError(f"iperf3.version: not a version: {version!r}")
    if (
        not isinstance(ports, list)
        or len(ports) > MAX_PORTS
        or not all(isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports)
    ):
        raise ValueError(f"iperf3.ports: not a list of ports: {ports!r}")
    return doc, version, tuple(ports)


def _end(doc: dict[str, Any], test_seconds: float) -> ends.EndFigures | None:
    """The report's end of the test (None: it has none); ValueError for one that cannot be this test's."""
    if doc.get("end") is None:
        return None
    ago = doc.get("ended_seconds_ago")
    if isinstance(ago, bool) or not isinstance(ago, int | float) or not math.isfinite(ago) or ago < 0:
        raise ValueError(f"ended_seconds_ago: not a number of seconds: {ago!r}")
    if ago > test_seconds:
        raise ValueError(f"its last test ended {ago:.1f} s ago, before this one began")
    try:
        return ends.from_json(doc["end"])
    except ValueError as exc:
        raise ValueError(f"end: {exc}") from exc


async def report(target: Target, test_seconds: float, wait: float = REPORT_WAIT_SECONDS) -> PeerEnd:
    """Ask the peer's rr responder at `target` for its end of this host's last test, started
    `test_seconds` ago. Never raises: a peer that does not answer reported nothing."""
    try:
        async with asyncio.timeout(wait + REPORT_TIMEOUT_SECONDS):
            local = (target.source, 0) if target.source else None
            reader, writer = await asyncio.open_connection(target.address, target.port, local_addr=local)
            try:
                writer.write(wire.RR_HELLO.pack(wire.REPORT_MAGIC, wire.REPORT_VERSION, int(wait * 1000)))
                await writer.drain()
                if await reader.readexactly(1) != b"Y":
                    return PeerEnd()
                (length,) = wire.REPORT_LENGTH.unpack(await reader.readexactly(wire.REPORT_LENGTH.size))
                if length > wire.REPORT_MAX_BYTES:
                    return PeerEnd(reported=True, rejected=f"{length} bytes, more than {wire.REPORT_MAX_BYTES}")
                return parse(await reader.readexactly(length), test_seconds)
            finally:
                writer.close()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return PeerEnd()
