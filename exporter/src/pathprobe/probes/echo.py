"""UDP echo prober: loss, duplicates, reordering, jitter and RTT from a low-rate stream
(wire format: wire.py).

A packet counts as lost only when no echo came within the timeout; an echo that
arrives after that counts as late, a second echo of the same packet as a duplicate,
an echo older than the newest one seen as reordered. A packet answered by an ICMP
error (port or host unreachable) counts as a failure with that reason, not as lost.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import OrderedDict

from .. import stamps, wire
from ..config import LossSettings
from .base import BACKOFF_SECONDS, EchoSink, Target, reason_of_oserror

# Jitter gain of RFC 3550 (interarrival jitter), applied to successive RTTs.
JITTER_GAIN = 1 / 16


class EchoProber:
    def __init__(self, target: Target, settings: LossSettings, sink: EchoSink):
        self.target, self.settings, self.sink = target, settings, sink
        self._seq = 0
        self._outstanding: OrderedDict[int, float] = OrderedDict()  # seq -> send time, in send order
        self._answered: OrderedDict[int, None] = OrderedDict()  # recent seqs, for duplicates
        self._expired: OrderedDict[int, None] = OrderedDict()  # recent lost seqs, for late echoes
        self._newest = -1
        self._last_rtt: float | None = None
        self._jitter = 0.0
        self._memory = max(1024, int(settings.rate_pps * settings.timeout_seconds * 4))

    # --- receiving
    def _read(self, sock: socket.socket) -> None:
        for _ in range(64):
            try:
                data, ancdata, _, addr = sock.recvmsg(2048, stamps.CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # an ICMP error on the connected socket: it answers the oldest packet
                if self._outstanding:
                    self._outstanding.popitem(last=False)
                self.sink.failure(reason_of_oserror(exc))
                return
            self.datagram_received(data, addr, stamps.kernel_time(ancdata))

    def datagram_received(self, data: bytes, addr: tuple[str, int], arrived_ns: int | None = None) -> None:
        now = time.perf_counter()
        arrived_ns = arrived_ns or time.time_ns()
        if data[:4] == wire.ECHO_REFUSED and len(data) >= wire.ECHO_REFUSAL.size:
            _, seq = wire.ECHO_REFUSAL.unpack_from(data)
            if self._outstanding.pop(seq, None) is not None:
                self.sink.failure("not_allowed")
            return
        if data[:4] != wire.ECHO_MAGIC or len(data) < wire.ECHO_HEADER.size:
            return
        _, seq, sent_ns, hold_ns = wire.ECHO_HEADER.unpack_from(data)
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
            if not everything and now - sent_at < self.settings.timeout_seconds:
                break
            del self._outstanding[seq]
            self._remember(self._expired, seq)
            self.sink.lost()

    def _open(self) -> socket.socket | None:
        t = self.target
        sock = socket.socket(wire.socket_family(t.address), socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            stamps.enable(sock)
            sock.connect((t.address, t.port))
        except OSError as exc:
            sock.close()
            self.sink.failure(reason_of_oserror(exc))
            return None
        return sock

    async def run(self, count: int | None = None) -> None:
        """Send `count` packets (forever when None) at the configured rate. Never raises:
        a socket that cannot be opened (e.g. no route yet) is reported, then retried
        after a back-off; a one-shot run (`count`) then ends."""
        loop = asyncio.get_running_loop()
        while (sock := self._open()) is None:
            if count is not None:
                return
            await asyncio.sleep(BACKOFF_SECONDS)
        loop.add_reader(sock.fileno(), self._read, sock)
        size = self.settings.size_bytes
        try:
            interval = 1 / self.settings.rate_pps
            due = loop.time()
            while count is None or self._seq < count:
                await asyncio.sleep(max(0.0, due - loop.time()))
                due = max(due + interval, loop.time() - 1.0)  # catch up a little, never a burst
                now = time.perf_counter()
                self._expire(now)
                self._outstanding[self._seq] = now
                try:
                    sock.send(wire.echo_packet(self._seq, size, time.time_ns()))
                except BlockingIOError:
                    pass  # a full send buffer drops the packet: it counts as lost
                except OSError as exc:
                    self._outstanding.pop(self._seq, None)
                    self.sink.failure(reason_of_oserror(exc))
                self.sink.sent(size)
                self._seq += 1
            # One-shot: wait for the last echoes, then count what is missing as lost.
            deadline = loop.time() + self.settings.timeout_seconds
            while self._outstanding and loop.time() < deadline:
                await asyncio.sleep(min(0.05, self.settings.timeout_seconds))
            self._expire(time.perf_counter(), everything=True)
        finally:
            loop.remove_reader(sock.fileno())
            sock.close()
