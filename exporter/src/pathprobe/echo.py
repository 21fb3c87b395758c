"""UDP echo probe: loss, duplicates, reordering, jitter and RTT from a low-rate stream.

Wire format: b"PPUE", sequence (u64), sender's wall clock (u64 ns), the responder's
hold time (u64 ns, zero in the request), zero padding to the configured size. The
responder returns the datagram with its hold time filled in (see stamps.py), or a short
b"PPUN" + sequence to a source it does not allow (never larger than the request,
so it cannot amplify). A packet counts as lost only when no echo came within the
timeout; an echo that arrives after that counts as late, a second echo of the
same packet as a duplicate, an echo older than the newest one seen as reordered.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from . import stamps
from .allow import AllowList
from .results import reason_of_oserror

HEADER = struct.Struct("!4sQQQ")
HOLD = struct.Struct("!Q")
HOLD_OFFSET = 20
MAGIC = b"PPUE"
REFUSED = b"PPUN"
REFUSAL = struct.Struct("!4sQ")
# Jitter gain of RFC 3550 (interarrival jitter), applied to successive RTTs.
JITTER_GAIN = 1 / 16
IP_PKTINFO = 8  # Linux; not exported by the socket module on every build


class EchoSink(Protocol):
    def sent(self, size: int) -> None: ...
    def received(self, rtt: float) -> None: ...
    def lost(self) -> None: ...
    def duplicate(self) -> None: ...
    def reordered(self) -> None: ...
    def late(self) -> None: ...
    def jitter(self, seconds: float) -> None: ...
    def failure(self, reason: str) -> None: ...


def packet(seq: int, size: int, clock_ns: int, hold_ns: int = 0) -> bytes:
    head = HEADER.pack(MAGIC, seq, clock_ns, hold_ns)
    return head + b"\x00" * max(0, size - len(head))


class EchoClient:
    def __init__(self, address: str, port: int, rate_pps: float, size: int, timeout: float, sink: EchoSink):
        self.address, self.port = address, port
        self.rate, self.size, self.timeout = rate_pps, size, timeout
        self.sink = sink
        self._seq = 0
        self._outstanding: OrderedDict[int, float] = OrderedDict()  # seq -> send time, in send order
        self._answered: OrderedDict[int, None] = OrderedDict()  # recent seqs, for duplicates
        self._expired: OrderedDict[int, None] = OrderedDict()  # recent lost seqs, for late echoes
        self._newest = -1
        self._last_rtt: float | None = None
        self._jitter = 0.0
        self._memory = max(1024, int(rate_pps * timeout * 4))

    # --- receiving
    def _read(self, sock: socket.socket) -> None:
        for _ in range(64):
            try:
                data, ancdata, _, addr = sock.recvmsg(2048, stamps.CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # ICMP errors on the connected socket (port or host unreachable)
                self.sink.failure(reason_of_oserror(exc))
                return
            self.datagram_received(data, addr, stamps.kernel_time(ancdata))

    def datagram_received(self, data: bytes, addr: tuple[str, int], arrived_ns: int | None = None) -> None:
        now = time.perf_counter()
        arrived_ns = arrived_ns or time.time_ns()
        if data[:4] == REFUSED and len(data) >= REFUSAL.size:
            _, seq = REFUSAL.unpack_from(data)
            if self._outstanding.pop(seq, None) is not None:
                self.sink.failure("not_allowed")
            return
        if data[:4] != MAGIC or len(data) < HEADER.size:
            return
        _, seq, sent_ns, hold_ns = HEADER.unpack_from(data)
        sent_at = self._outstanding.pop(seq, None)
        if sent_at is None:
            if seq in self._answered:
                self.sink.duplicate()
            elif seq in self._expired:
                self.sink.late()
            return
        rtt = stamps.network_rtt(sent_ns, arrived_ns, now - sent_at, hold_ns)
        if seq < self._newest:
            self.sink.reordered()
        self._newest = max(self._newest, seq)
        self._remember(self._answered, seq)
        if self._last_rtt is not None:
            self._jitter += (abs(rtt - self._last_rtt) - self._jitter) * JITTER_GAIN
            self.sink.jitter(self._jitter)
        self._last_rtt = rtt
        self.sink.received(rtt)

    # --- sending and expiry
    def _remember(self, table: OrderedDict[int, None], seq: int) -> None:
        table[seq] = None
        while len(table) > self._memory:
            table.popitem(last=False)

    def _expire(self, now: float, everything: bool = False) -> None:
        while self._outstanding:
            seq, sent_at = next(iter(self._outstanding.items()))
            if not everything and now - sent_at < self.timeout:
                break
            del self._outstanding[seq]
            self._remember(self._expired, seq)
            self.sink.lost()

    async def run(self, count: int | None = None) -> None:
        """Send `count` packets (forever when None) at the configured rate."""
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            stamps.enable(sock)
            sock.connect((self.address, self.port))
        except OSError as exc:
            sock.close()
            self.sink.failure(reason_of_oserror(exc))
            raise
        loop.add_reader(sock.fileno(), self._read, sock)
        try:
            interval = 1 / self.rate
            due = loop.time()
            while count is None or self._seq < count:
                await asyncio.sleep(max(0.0, due - loop.time()))
                due = max(due + interval, loop.time() - 1.0)  # catch up a little, never a burst
                now = time.perf_counter()
                self._expire(now)
                self._outstanding[self._seq] = now
                try:
                    sock.send(packet(self._seq, self.size, time.time_ns()))
                except BlockingIOError:
                    pass  # a full send buffer drops the packet: it counts as lost
                except OSError as exc:
                    self.sink.failure(reason_of_oserror(exc))
                self.sink.sent(self.size)
                self._seq += 1
            # One-shot: wait for the last echoes, then count what is missing as lost.
            deadline = loop.time() + self.timeout
            while self._outstanding and loop.time() < deadline:
                await asyncio.sleep(min(0.05, self.timeout))
            self._expire(time.perf_counter(), everything=True)
        finally:
            loop.remove_reader(sock.fileno())
            sock.close()


class _Sender(Protocol):
    def sendto(self, data: bytes, addr: tuple[str, int]) -> None: ...


class EchoResponder(asyncio.DatagramProtocol):
    """Echoes probe datagrams from allowed sources, at a capped rate per source."""

    def __init__(self, allow: AllowList, max_pps_per_source: float, count: Callable[[str], None]):
        self.allow = allow
        self.max_pps = max_pps_per_source
        self.count = count
        self._buckets: dict[str, tuple[float, float]] = {}  # source -> (tokens, last refill)
        self.transport: _Sender | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram transport has sendto

    def datagram_received(self, data: bytes, addr: tuple[str, int], arrived_ns: int | None = None) -> None:
        if self.transport is None:
            return
        if data[:4] != MAGIC or len(data) < HEADER.size:
            self.count("malformed")
            return
        source = addr[0]
        if not self.allow.allows(source):
            self.count("not_allowed")
            seq = HEADER.unpack_from(data)[1]
            self.transport.sendto(REFUSAL.pack(REFUSED, seq), addr)
            return
        if not self._take_token(source):
            self.count("rate_limited")
            return
        self.count("accepted")
        # Taken last, so that the hold covers everything but the send itself.
        hold = max(0, time.time_ns() - (arrived_ns or time.time_ns()))
        self.transport.sendto(data[:HOLD_OFFSET] + HOLD.pack(hold) + data[HOLD_OFFSET + HOLD.size :], addr)

    def _take_token(self, source: str) -> bool:
        now = time.monotonic()
        tokens, last = self._buckets.get(source, (self.max_pps, now))
        tokens = min(self.max_pps, tokens + (now - last) * self.max_pps)
        if len(self._buckets) > 10000:  # bounded memory under a spray of sources
            self._buckets.clear()
        if tokens < 1:
            self._buckets[source] = (tokens, now)
            return False
        self._buckets[source] = (tokens - 1, now)
        return True

    async def start(self, host: str, port: int) -> asyncio.DatagramTransport:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setblocking(False)
        if family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        else:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
        stamps.enable(sock)
        self.transport = _PktinfoTransport(sock)
        loop.add_reader(sock, self._read, sock)
        return self.transport  # type: ignore[return-value]

    def _read(self, sock: socket.socket) -> None:
        # Reply from the address the request was sent to: a host with several addresses
        # (or a responder bound to 0.0.0.0) would otherwise answer from another one, and
        # the prober's connected socket would drop the answer.
        for _ in range(64):
            try:
                data, ancdata, _, addr = sock.recvmsg(2048, socket.CMSG_SPACE(64) + stamps.CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue
            assert isinstance(self.transport, _PktinfoTransport)
            self.transport.pktinfo = [
                (lvl, kind, payload)
                for lvl, kind, payload in ancdata
                if (lvl, kind) in ((socket.IPPROTO_IP, IP_PKTINFO), (socket.IPPROTO_IPV6, socket.IPV6_PKTINFO))
            ]
            self.datagram_received(data, addr, stamps.kernel_time(ancdata))


class _PktinfoTransport:
    """Just what EchoResponder needs of a transport: sendto from the request's own address."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.pktinfo: list[tuple[int, int, bytes]] = []

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        with contextlib.suppress(OSError):  # a full buffer or a vanished route: the prober counts the loss
            self.sock.sendmsg([data], self.pktinfo, 0, addr)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock)
        self.sock.close()
