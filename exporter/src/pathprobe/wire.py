"""The wire formats of pathprobe's own probes, shared by the probers and the responders.

TCP request/response (rr): the client sends a 9-byte hello, b"PPRR", version 2, and
the request size as a big-endian u32; the responder answers b"Y" (go on) or b"N"
(refused), then answers every `size`-byte request on the same connection with the
same bytes followed by a big-endian u64: how long, in nanoseconds, the request sat
in the responder (from the kernel's receive timestamp to just before the answer is
sent). The RTT is the network's part (see stamps.py). With requests of 8 bytes or more, the
responder overwrites the first 8 of the bytes it returns with a follow-up (two-step, as the UDP
echo's): the nanoseconds from the clock read that ended the previous answer's hold on this
connection to the kernel's transmit stamp of that answer's last byte, plus one (zero: none; an
older responder returns the request's zeros).

UDP echo: b"PPUE", sequence (u64), sender's wall clock (u64 ns), the responder's
hold time (u64 ns, zero in the request), the responder's count of requests received
from this flow (source address and port) so far, this one included (u64, zero in the
request; as STAMP's reflector counters, it splits loss by direction without clock
sync), zero padding to the configured size. The responder returns the datagram with
hold time and count filled in, or a short b"PPUN" + sequence to a source it does not
allow (never larger than the request, so it cannot amplify). A responder that leaves
the count at zero (an older version) only loses the per-direction split. When the
request has room (52 bytes or more), the responder also writes its wall clock (u64 ns)
as it took the request and as it answered into the padding's first 16 bytes: the
prober's offset to the responder's clock (NTP's on-wire method, RFC 5905 section 8);
an older responder leaves them zero. With room for 8 more (60 bytes or more), it writes its
clock error bound (u64 ns, zero when it knows none: clock.py) after them. With the prober's own
kernel stamps, each echo gives the one-way delay of each direction: out, from the send to the
answer's stamp less the hold (the request's kernel arrival); back, from that stamp to the
answer's arrival. With room for 2 more (62 bytes or more), it writes 1 and the TOS byte the
request arrived with (zeros where its socket did not say), and sends the answer with that TOS:
the prober learns whether its DSCP mark arrived, and whether the answer's came back. With room
for 16 more at offset 64 (80 bytes or more), a follow-up (two-step, as PTP's): of the previous
answer on this flow, its sequence plus one (zero: none yet) and the nanoseconds from the clock read
that ended its hold to the kernel's transmit stamp of it, plus one (zero: no stamp). The prober
adds that stretch to that answer's hold, so the responder's own send is not counted as network.

A served test's report (on the rr port, beside the rr hello): the client sends b"PPTR", version 1,
and the milliseconds it waits for a test of its own that still runs on the responder's iperf3
server to end (RR_HELLO's layout); the responder answers b"Y", a big-endian u32 length and that
many bytes of JSON: its iperf3 (version, the ports of its servers) and its end of the last test
that client's address ran against them (ends.EndFigures, or null), or b"N" (a source it does not
allow; an older responder answers b"N" to any hello but its own). At most REPORT_MAX_BYTES.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import sys
import termios
import time
from collections.abc import Callable
from typing import Protocol

from . import stamps

# --- TCP request/response
RR_HELLO = struct.Struct("!4sBI")
RR_MAGIC = b"PPRR"
RR_VERSION = 2
RR_MAX_SIZE = 65536
HOLD = struct.Struct("!Q")
RR_FOLLOW_UP = struct.Struct("!Q")  # at the answer's start: the previous answer's stretch in ns + 1 (0: none)
# A transmit stamp further from its answer's clock read than this belongs to another send.
MAX_STRETCH_NS = 1_000_000_000

# --- a served test's report
REPORT_MAGIC = b"PPTR"
REPORT_VERSION = 1
REPORT_LENGTH = struct.Struct("!I")
REPORT_MAX_BYTES = 16384

# --- UDP echo
ECHO_HEADER = struct.Struct("!4sQQQQ")
ECHO_HOLD_OFFSET = 20
ECHO_REFLECTED = struct.Struct("!QQ")  # hold time, received count: what the responder fills in
ECHO_CLOCKS = struct.Struct("!QQ")  # the responder's wall clock as it took the request, as it answered
ECHO_CLOCKS_OFFSET = ECHO_HEADER.size
ECHO_BOUND = struct.Struct("!Q")  # the responder's clock error bound, ns (0: unknown)
ECHO_BOUND_OFFSET = ECHO_CLOCKS_OFFSET + ECHO_CLOCKS.size
ECHO_MARK = struct.Struct("!BB")  # 1 when the responder read the request's TOS, and that TOS
ECHO_MARK_OFFSET = ECHO_BOUND_OFFSET + ECHO_BOUND.size
# Of this flow's previous answer: its sequence + 1, and its stretch from the clock read to the
# kernel's transmit stamp in ns + 1 (zero: none).
ECHO_FOLLOW_UP = struct.Struct("!QQ")
ECHO_FOLLOW_UP_OFFSET = 64
ECHO_MAGIC = b"PPUE"
ECHO_REFUSED = b"PPUN"
ECHO_REFUSAL = struct.Struct("!4sQ")
ECHO_MAX_SIZE = 1400
IP_PKTINFO = 8  # Linux; not exported by the socket module on every build

READ_SIZE = 65536
MAX_BUFFERED = 4 * RR_MAX_SIZE


def socket_family(address: str) -> socket.AddressFamily:
    """THE choice of address family: IPv6 for an address with a colon, else IPv4."""
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def stream_socket(address: str) -> socket.socket:
    sock = socket.socket(socket_family(address), socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


def mark(sock: socket.socket, address: str, dscp: int) -> None:
    """Mark what `sock` sends with this DSCP (the TOS byte's, or traffic class's, six high bits)."""
    if socket_family(address) == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    else:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, dscp << 2)


def receive_tos(sock: socket.socket, address: str) -> None:
    """Ask for each datagram's TOS byte (traffic class) as ancillary data (received_tos)."""
    if socket_family(address) == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    else:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)


def received_tos(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The TOS byte (or traffic class) of a datagram, from its ancillary data."""
    for level, kind, data in ancdata:
        if (level, kind) == (socket.IPPROTO_IP, socket.IP_TOS) and data:
            return data[0]
        if (level, kind) == (socket.IPPROTO_IPV6, socket.IPV6_TCLASS) and len(data) >= 4:
            return int.from_bytes(data[:4], sys.byteorder)
    return None


def tos_cmsg(address: str, tos: int) -> tuple[int, int, bytes]:
    """Ancillary data that sends one datagram with this TOS byte (traffic class)."""
    if socket_family(address) == socket.AF_INET:
        return (socket.IPPROTO_IP, socket.IP_TOS, bytes([tos]))
    return (socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos.to_bytes(4, sys.byteorder))


def probe_socket(address: str, kind: socket.SocketKind, source: str | None) -> socket.socket:
    """A prober's non-blocking socket towards `address`, bound to `source` when given: peers
    admit a host by the address they know it by, which on a multi-homed host need not be the
    one the route would pick."""
    sock = socket.socket(socket_family(address), kind)
    try:
        sock.setblocking(False)
        if source is not None:
            sock.bind((source, 0))
    except OSError:
        sock.close()
        raise
    return sock


def sendable_from(address: str) -> bool:
    """Whether this host holds `address` (a socket can be bound to it). A host known to its
    peers by an address it does not hold (a NAT's, an Elastic IP's) sends from the route's."""
    with socket.socket(socket_family(address), socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


def tune(sock: socket.socket) -> None:
    """A connected socket: no Nagle delay, and a receive timestamp with every read."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stamps.enable(sock)


def echo_packet(seq: int, size: int, clock_ns: int, hold_ns: int = 0, received: int = 0) -> bytes:
    head = ECHO_HEADER.pack(ECHO_MAGIC, seq, clock_ns, hold_ns, received)
    return head + b"\x00" * max(0, size - len(head))


class Grid(Protocol):
    """Reads made on a shared grid's passes instead of a wake-up of the event loop each
    (probes.pacer.Pacer)."""

    def read_on_grid(self, sock: socket.socket, read: Callable[[], None]) -> None: ...
    def stop_reading(self, sock: socket.socket) -> None: ...
    def awaiting(self) -> contextlib.AbstractContextManager[None]: ...


class Connection:
    """A non-blocking TCP socket read through one persistent reader callback.

    asyncio's streams drop the kernel's receive timestamp; reading with recvmsg() keeps
    it. The callback stays registered (no epoll_ctl per message) and pauses only while
    MAX_BUFFERED bytes wait unread (a peer that sends without reading answers) and no
    read is waiting for more. With a `grid`, the callback runs on the grid's passes, not as
    the event loop's reader: the kernel's receive stamp is the arrival, whenever it is read.

    With `stamp_sends` (a connected socket, nothing written yet), `sent_ns` is the kernel's
    transmit timestamp of the last send's last byte once it is known (take_sent_stamps()), else
    None.
    """

    def __init__(self, sock: socket.socket, stamp_sends: bool = False, grid: Grid | None = None):
        self.sock = sock
        self._grid = grid
        self.sent_ns: int | None = None
        self._stamping = stamp_sends and stamps.enable_sent(sock)
        self._written = 0  # bytes, for the transmit stamps' keys (the offset of a write's last byte)
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._stamp = 0
        self._eof = False
        self._error: OSError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._want = 0
        self._reading = False
        self._resume()

    def _resume(self) -> None:
        if not self._reading and not self._eof and self._error is None:
            if self._grid is not None:
                self._grid.read_on_grid(self.sock, self._on_readable)
            else:
                self._loop.add_reader(self.sock.fileno(), self._on_readable)
            self._reading = True

    def _pause(self) -> None:
        if self._reading:
            if self._grid is not None:
                self._grid.stop_reading(self.sock)
            else:
                self._loop.remove_reader(self.sock.fileno())
            self._reading = False

    def take_sent_stamps(self, most: int = 256) -> None:
        """Transmit stamps from the error queue (up to `most`); the last write's last byte's is sent_ns."""
        if self._stamping:
            for key, when in stamps.sent_times(self.sock, most):
                if key == (self._written - 1) % 2**32:
                    self.sent_ns = when

    def _on_readable(self) -> None:
        self.take_sent_stamps()
        try:
            data, ancdata, _, _ = self.sock.recvmsg(READ_SIZE, stamps.CMSG_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._error = exc
        else:
            if data:
                self._buffer += data
                self._stamp = stamps.kernel_time(ancdata) or time.time_ns()
            else:
                self._eof = True
        ended = self._eof or self._error is not None
        if ended or len(self._buffer) >= max(MAX_BUFFERED, self._want):
            self._pause()
        waiter = self._waiter
        if waiter is not None and not waiter.done() and (ended or len(self._buffer) >= self._want):
            waiter.set_result(None)

    async def read(self, n: int) -> tuple[bytes, int]:
        """`n` bytes, and when the last of them arrived: the kernel's receive timestamp
        (ns, CLOCK_REALTIME), or the read's time without one."""
        while len(self._buffer) < n:
            if self._error is not None:
                raise self._error
            if self._eof:
                raise asyncio.IncompleteReadError(bytes(self._buffer), n)
            self._want = n
            self._resume()
            self._waiter = self._loop.create_future()
            try:
                with self._grid.awaiting() if self._grid is not None else contextlib.nullcontext():
                    await self._waiter
            finally:
                self._waiter = None
                self._want = 0
        return self._take(n)

    def read_now(self, n: int) -> tuple[bytes, int] | None:
        """`n` bytes as read() gives them if they have come (read or waiting in the socket), without
        waiting; else None: an answer that came while this process was too busy to read it. A
        connection that ended before them raises as read() would."""
        while len(self._buffer) < n:
            if self._error is not None:
                raise self._error
            if self._eof:
                raise asyncio.IncompleteReadError(bytes(self._buffer), n)
            held = len(self._buffer)
            self._on_readable()
            if len(self._buffer) == held and not self._eof and self._error is None:
                return None
        return self._take(n)

    def _take(self, n: int) -> tuple[bytes, int]:
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        if len(self._buffer) < MAX_BUFFERED:
            self._resume()
        return data, self._stamp

    def delivered(self) -> bool:
        """Whether the peer's kernel acknowledged every byte written (SIOCOUTQ, tcp(7): bytes
        written and not yet acknowledged): a request that reached the peer's host."""
        queued = fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, bytes(4))
        unacknowledged: int = struct.unpack("i", queued)[0]
        return unacknowledged == 0

    def send_now(self, data: bytes | bytearray) -> int:
        """As much of `data` as the socket takes without waiting (bytes sent)."""
        self.sent_ns = None
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        self._written += sent
        return sent

    async def write(self, data: bytes | bytearray) -> None:
        sent = self.send_now(data)  # small messages: one send() without going through the event loop
        if sent < len(data):
            await self._loop.sock_sendall(self.sock, data[sent:])
            self._written += len(data) - sent
        # An unqueued send is stamped within send() itself: taking its stamp now spares the event
        # loop the wake-up its arrival on the error queue would cost (the socket polls as readable).
        # One read: a small write is one segment, one stamp.
        self.take_sent_stamps(most=1)

    def close(self) -> None:
        self._pause()
        self.sock.close()
