"""Kernel receive timestamps, and the network's part of a round trip.

Both probes take the RTT as TWAMP/STAMP reflectors make it: from just before the
request is sent to the kernel's receive timestamp of the answer, less how long the
responder held the request (which it reports). Waking a Python process takes
0.1-0.3 ms on a VM, twice per exchange; without this every RTT would include them.
"""

from __future__ import annotations

import socket
import struct

SO_TIMESTAMPNS = 35  # Linux (x86, arm); the socket module does not name it
TIMESPEC = struct.Struct("=qq")
CMSG_SPACE = socket.CMSG_SPACE(TIMESPEC.size)


def enable(sock: socket.socket) -> None:
    """Ask for a receive timestamp (CLOCK_REALTIME, ns) with every read."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def kernel_time(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The receive timestamp in a recvmsg()'s ancillary data, in ns, if there is one."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            sec, nsec = TIMESPEC.unpack_from(data)
            return int(sec * 1_000_000_000 + nsec)
    return None


def clock_offset(sent_ns: int, took_ns: int, answered_ns: int, back_ns: int) -> tuple[float, float]:
    """(the peer's clock minus this host's, the exchange's network delay), in seconds, from one
    exchange's four wall-clock stamps: sent here, taken and answered there, back here (NTP's
    on-wire method, RFC 5905 section 8). The offset is exact when both ways take as long; its
    error is at most half the delay, so the exchange with the least delay is the one to trust."""
    offset = ((took_ns - sent_ns) + (answered_ns - back_ns)) / 2e9
    delay = ((back_ns - sent_ns) - (answered_ns - took_ns)) / 1e9
    return offset, delay


def network_rtt(sent_ns: int, arrived_ns: int, elapsed: float, hold_ns: int) -> float:
    """Seconds on the network: wall-clock stamps, less the responder's hold.

    A wall-clock step between the two stamps shows as a time outside (0, elapsed],
    where `elapsed` is the monotonic interval (wake-up included); that is then used.
    """
    wire = (arrived_ns - sent_ns) / 1e9
    if not 0 < wire <= elapsed:
        wire = elapsed
    return wire - min(max(hold_ns / 1e9, 0.0), wire)
