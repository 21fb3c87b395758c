"""Path MTU prober: does the path carry IP packets of each expected size?

A low-rate UDP echo (wire.py) with the Don't Fragment bit set, padded to exactly each
size (IP and UDP headers included), to the peer's echo responder. IP_PMTUDISC_PROBE sets
DF but ignores the size the kernel has learnt for the route, so that every probe goes out
at the full size: a path that carries it answers; a router that cannot carry it either
says so (ICMP "fragmentation needed": the reason `fragmentation_needed`) or drops it
silently, a black hole (the reason `timeout`). Either way the size is not carried.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Protocol

from .. import stamps, wire
from ..probe_settings import MtuSettings
from .base import BACKOFF_SECONDS, Reason, Target, reason_of_oserror

# Linux values; the socket module does not name them.
IP_MTU_DISCOVER, IPV6_MTU_DISCOVER, PMTUDISC_PROBE = 10, 23, 3
IPV4_UDP_HEADERS, IPV6_UDP_HEADERS = 28, 48


def _payload(size: int, family: socket.AddressFamily) -> int:
    return size - (IPV6_UDP_HEADERS if family == socket.AF_INET6 else IPV4_UDP_HEADERS)


class MtuSink(Protocol):
    """Outcomes of the path MTU prober, one probe of one size at a time."""

    def mtu(self, size: int, carried: bool, reason: Reason | None) -> None: ...


class MtuProber:
    """Probes each of `settings.sizes` (this path's, as the exporter resolves them)."""

    def __init__(self, target: Target, settings: MtuSettings, sink: MtuSink):
        self.target, self.settings, self.sink = target, settings, sink
        self.sizes = sorted(set(settings.sizes or ()))
        self._seq = 0

    async def run(self, rounds: int | None = None) -> None:
        """Probe every size once per interval, `rounds` times (forever when None). Never raises."""
        loop = asyncio.get_running_loop()
        done = 0
        due = loop.time()
        while rounds is None or done < rounds:
            await asyncio.sleep(max(0.0, due - loop.time()))
            due = max(due + self.settings.interval_seconds, loop.time() + BACKOFF_SECONDS)
            for size in self.sizes:
                carried, reason = await self.probe(size)
                self.sink.mtu(size, carried, reason)
            done += 1

    async def probe(self, size: int) -> tuple[bool, Reason | None]:
        """One DF-set echo of `size` bytes: (carried, reason when not)."""
        t = self.target
        family = wire.socket_family(t.address)
        loop = asyncio.get_running_loop()
        self._seq += 1
        try:
            sock = wire.probe_socket(t.address, socket.SOCK_DGRAM, t.source)
        except OSError as exc:  # e.g. out of file descriptors: reported, never raised
            return False, reason_of_oserror(exc)
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, PMTUDISC_PROBE)
            else:
                sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, PMTUDISC_PROBE)
            stamps.enable(sock)
            sock.connect((t.address, t.port))
            sock.send(wire.echo_packet(self._seq, _payload(size, family), time.time_ns()))
            async with asyncio.timeout(self.settings.timeout_seconds):
                while True:
                    data = await loop.sock_recv(sock, 65535)
                    if data[:4] == wire.ECHO_REFUSED:
                        return False, "not_allowed"
                    ours = data[:4] == wire.ECHO_MAGIC and len(data) >= wire.ECHO_HEADER.size
                    if ours and wire.ECHO_HEADER.unpack_from(data)[1] == self._seq:
                        return True, None
        except TimeoutError:
            return False, "timeout"
        except OSError as exc:
            return False, reason_of_oserror(exc)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
