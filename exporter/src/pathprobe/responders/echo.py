"""UDP echo responder: echoes probe datagrams (wire.py) from allowed sources, at a capped
rate per source, from the address each request was sent to."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections import OrderedDict
from collections.abc import Callable

from .. import stamps, wire
from ..allow import AllowList
from .base import listen_error

# Flows whose received counts are kept (the oldest is forgotten first).
MAX_FLOWS = 65536
# Room for bursts from many peers in the one kernel queue (capped by net.core.rmem_max).
RECEIVE_BUFFER_BYTES = 4 * 2**20
# Linux: each datagram carries the count of datagrams the socket's full queue dropped so far.
SO_RXQ_OVFL = 40
# Answers whose transmit stamp is still awaited (it comes within the send itself unless queued).
STAMPS_AWAITED = 1024
# A flow: the prober's address and source port.
Flow = tuple[str, int]


class EchoResponder:
    def __init__(
        self,
        allow: AllowList,
        max_pps_per_source: float,
        count: Callable[..., None],
        bound: Callable[[], float | None] = lambda: None,
    ):
        """`count(result, n=1)`: outcomes of datagrams, including those the kernel dropped
        because the socket's queue was full (SO_RXQ_OVFL): the responder was overloaded, which
        the prober would otherwise read as path loss. `bound()`: this host's clock error bound
        (seconds, None: unknown), sent with every answer that has room for it."""
        self.allow, self.bound = allow, bound
        self._queue_drops = 0  # the kernel's cumulative count, as last seen
        self.max_pps = max_pps_per_source
        self.count = count
        self._buckets: dict[str, tuple[float, float]] = {}  # source -> (tokens, last refill)
        self._received: OrderedDict[Flow, int] = OrderedDict()  # flow -> requests received
        self._sock: socket.socket | None = None
        self._pktinfo: list[tuple[int, int, bytes]] = []
        # Two-step answers (wire.ECHO_FOLLOW_UP): the answers awaiting their transmit stamp, as
        # (flow, seq, clock read), and each flow's last stamped answer.
        self._stamping = False
        self._awaited: stamps.AwaitedStamps[tuple[Flow, int, int]] = stamps.AwaitedStamps(STAMPS_AWAITED)
        self._follow_ups: dict[Flow, tuple[int, int]] = {}  # flow -> (seq, stretch in ns)

    def datagram_received(
        self, data: bytes, addr: tuple[str, int], arrived_ns: int | None = None, tos: int | None = None
    ) -> None:
        took_ns = time.time_ns()
        if data[:4] != wire.ECHO_MAGIC or len(data) < wire.ECHO_HEADER.size:
            self.count("malformed")
            return
        source = addr[0]
        if not self.allow.allows(source):
            self.count("not_allowed")
            seq = wire.ECHO_HEADER.unpack_from(data)[1]
            self.sendto(wire.ECHO_REFUSAL.pack(wire.ECHO_REFUSED, seq), addr)
            return
        if not self._take_token(source):
            self.count("rate_limited")
            return
        self.count("accepted")
        flow = (addr[0], addr[1])
        received = self._received.pop(flow, 0) + 1
        self._received[flow] = received  # most recent last: the oldest flow goes first when full
        if len(self._received) > MAX_FLOWS:
            self._follow_ups.pop(self._received.popitem(last=False)[0], None)
        answer, size = bytearray(data), len(data)
        seq = wire.ECHO_HEADER.unpack_from(data)[1]
        # Everything that does not need the answer's clock read first: the read ends the hold.
        follows_up = self._stamping and size >= wire.ECHO_FOLLOW_UP_OFFSET + wire.ECHO_FOLLOW_UP.size
        if follows_up:
            previous, stretch = self._follow_ups.get(flow, (-1, -1))
            wire.ECHO_FOLLOW_UP.pack_into(answer, wire.ECHO_FOLLOW_UP_OFFSET, previous + 1, stretch + 1)
        if size >= wire.ECHO_BOUND_OFFSET + wire.ECHO_BOUND.size:
            bound = self.bound()
            wire.ECHO_BOUND.pack_into(answer, wire.ECHO_BOUND_OFFSET, round(bound * 1e9) if bound else 0)
        # The mark the request arrived with, reflected: in the answer, and on it.
        ancillary = []
        if tos is not None and size >= wire.ECHO_MARK_OFFSET + wire.ECHO_MARK.size:
            wire.ECHO_MARK.pack_into(answer, wire.ECHO_MARK_OFFSET, 1, tos)
            ancillary.append(wire.tos_cmsg(addr[0], tos))
        # The time from this read to the packet leaving (two packs, the send: 13 us at p50, 26 us at
        # p99 on a quiet host, 120 us at p99 under the lab's load: bench/responder_stretch.py) is
        # not in the hold: this flow's next answer follows this one up with it, from the stamp.
        answered_ns = time.time_ns()
        wire.ECHO_REFLECTED.pack_into(
            answer, wire.ECHO_HOLD_OFFSET, max(0, answered_ns - (arrived_ns or answered_ns)), received
        )
        if size >= wire.ECHO_CLOCKS_OFFSET + wire.ECHO_CLOCKS.size:
            wire.ECHO_CLOCKS.pack_into(answer, wire.ECHO_CLOCKS_OFFSET, took_ns, answered_ns)
        self.sendto(answer, addr, ancillary, (flow, seq, answered_ns) if follows_up else None)

    def sendto(
        self,
        data: bytes | bytearray,
        addr: Flow,
        ancillary: list[tuple[int, int, bytes]] | None = None,
        answer: tuple[Flow, int, int] | None = None,
    ) -> None:
        """Reply from the address the request was sent to (IP_PKTINFO): a host with several
        addresses (or a responder bound to 0.0.0.0) would otherwise answer from another one,
        and the prober's connected socket would drop the answer. `ancillary`: more, e.g. its TOS.
        `answer`: (flow, seq, clock read) of an answer whose transmit stamp its flow's next answer
        follows up with."""
        if self._sock is None:
            return
        try:
            self._sock.sendmsg([data], self._pktinfo + (ancillary or []), 0, addr)
        except OSError:  # a full buffer or a vanished route: the prober counts the loss
            if self._stamping:  # the send may have taken a stamp key or not: count the keys from 0 again
                stamps.enable_sent(self._sock, restart=True)
                self._awaited.restart()
            return
        if self._stamping:
            self._awaited.sent(answer)
            # Stamped within sendmsg() unless queued: taken now, it wakes no one.
            self._take_stamps(self._sock, most=1)

    def _take_stamps(self, sock: socket.socket, most: int = 256) -> None:
        """Each awaited answer's stretch from its clock read to its transmit stamp, as its flow's
        next follow-up (a stamp that does not fit its answer's read belongs to another send)."""
        for key, sent_ns in stamps.sent_times(sock, most):
            awaited = self._awaited.stamped(key)
            if awaited is not None and 0 <= sent_ns - awaited[2] < wire.MAX_STRETCH_NS:
                flow, seq, read_ns = awaited
                if flow in self._received:
                    self._follow_ups[flow] = (seq, sent_ns - read_ns)

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

    async def start(self, host: str, port: int) -> None:
        family = wire.socket_family(host)
        sock = socket.socket(family, socket.SOCK_DGRAM)
        # No SO_REUSEADDR: with it any local process could bind the same UDP port and
        # take the probes; a second exporter on the port must fail instead.
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise listen_error("udp echo responder", host, port, exc) from exc
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        if family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_IP, wire.IP_PKTINFO, 1)
        else:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        wire.receive_tos(sock, host)
        stamps.enable(sock)
        self._stamping = stamps.enable_sent(sock)
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock, self._read, sock)

    def _read(self, sock: socket.socket) -> None:
        self._take_stamps(sock)  # while stamps wait on its error queue, the socket polls readable
        for _ in range(64):
            try:
                data, ancdata, _, addr = sock.recvmsg(
                    65535, socket.CMSG_SPACE(64) + 2 * socket.CMSG_SPACE(4) + stamps.CMSG_SPACE
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue
            self._pktinfo = [
                (lvl, kind, payload)
                for lvl, kind, payload in ancdata
                if (lvl, kind) in ((socket.IPPROTO_IP, wire.IP_PKTINFO), (socket.IPPROTO_IPV6, socket.IPV6_PKTINFO))
            ]
            for lvl, kind, payload in ancdata:
                if (lvl, kind) == (socket.SOL_SOCKET, SO_RXQ_OVFL) and len(payload) >= 4:
                    dropped = int.from_bytes(payload[:4], sys.byteorder)
                    if dropped > self._queue_drops:
                        self.count("dropped_queue_full", dropped - self._queue_drops)
                    self._queue_drops = dropped
            self.datagram_received(data, addr, stamps.kernel_time(ancdata), wire.received_tos(ancdata))

    def close(self) -> None:
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock)
            self._sock.close()
            self._sock = None

    def sockname(self) -> tuple[str, int]:
        """The address and port it listens on (port 0 asks the kernel for one)."""
        assert self._sock is not None
        name: tuple[str, int] = self._sock.getsockname()[:2]
        return name
