"""TCP request/response RTT probe, as netperf TCP_RR with an interval.

Timeouts use asyncio.timeout(), not wait_for(): on Python 3.11 wait_for() can swallow
a cancellation that arrives as the read completes, and a probe loop would then
outlive the exporter's shutdown.

Wire protocol (pathprobe's own, so that the responder can refuse strangers, cap sizes
and report its own delay): the client sends a 9-byte hello, b"PPRR", version 2, and the
request size as a big-endian u32; the responder answers b"Y" (go on) or b"N" (refused),
then answers every `size`-byte request on the same connection with the same bytes
followed by a big-endian u64: how long, in nanoseconds, the request sat in the
responder (from the kernel's receive timestamp to just before the answer is sent).
The RTT is the network's part (see stamps.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol

from . import stamps
from .allow import AllowList
from .results import ProbeFailure, reason_of_oserror

log = logging.getLogger(__name__)

HELLO = struct.Struct("!4sBI")
HOLD = struct.Struct("!Q")
MAGIC = b"PPRR"
VERSION = 2
MAX_SIZE = 65536
HELLO_TIMEOUT = 5.0
IDLE_TIMEOUT = 120.0
READ_SIZE = 65536
MAX_BUFFERED = 4 * MAX_SIZE


class RttSink(Protocol):
    def rtt(self, seconds: float) -> None: ...
    def failure(self, reason: str) -> None: ...


class Connection:
    """A non-blocking TCP socket read through one persistent reader callback.

    asyncio's streams drop the kernel's receive timestamp; reading with recvmsg() keeps
    it. The callback stays registered (no epoll_ctl per message) and pauses only while
    MAX_BUFFERED bytes wait unread (a peer that sends without reading answers) and no
    read is waiting for more.
    """

    def __init__(self, sock: socket.socket):
        self.sock = sock
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
            self._loop.add_reader(self.sock.fileno(), self._on_readable)
            self._reading = True

    def _pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self.sock.fileno())
            self._reading = False

    def _on_readable(self) -> None:
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
                await self._waiter
            finally:
                self._waiter = None
                self._want = 0
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        if len(self._buffer) < MAX_BUFFERED:
            self._resume()
        return data, self._stamp

    async def write(self, data: bytes) -> None:
        try:  # small messages: one send() without going through the event loop
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(data):
            await self._loop.sock_sendall(self.sock, data[sent:])

    def close(self) -> None:
        self._pause()
        self.sock.close()


def _stream_socket(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


def _tune(sock: socket.socket) -> None:
    """A connected socket: no Nagle delay, and a receive timestamp with every read."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stamps.enable(sock)


class RrClient:
    def __init__(self, address: str, port: int, interval: float, size: int, timeout: float, sink: RttSink):
        self.address, self.port = address, port
        self.interval, self.size, self.timeout = interval, size, timeout
        self.sink = sink
        self._payload = b"\x00" * size

    async def run(self, count: int | None = None) -> None:
        """Probe `count` times (forever when None), keeping one connection open."""
        loop = asyncio.get_running_loop()
        done = 0
        due = loop.time()
        conn: Connection | None = None
        try:
            while count is None or done < count:
                await asyncio.sleep(max(0.0, due - loop.time()))
                # Keep a fixed cadence; after a stall, skip ahead instead of bursting.
                due = max(due + self.interval, loop.time())
                try:
                    if conn is None:
                        conn = await self._connect()
                    self.sink.rtt(await self._exchange(conn))
                except ProbeFailure as exc:
                    self.sink.failure(exc.reason)
                    _close(conn)
                    conn = None
                    # Do not hammer a failing peer faster than once a second.
                    due = max(due, loop.time() + 1.0)
                done += 1
        finally:
            _close(conn)

    @contextlib.contextmanager
    def _failures(self, what: str) -> Iterator[None]:
        """Socket and stream errors as ProbeFailure with their metric reason."""
        try:
            yield
        except TimeoutError as exc:
            raise ProbeFailure("timeout", f"no {what} from {self.address}:{self.port} in {self.timeout:g} s") from exc
        except asyncio.IncompleteReadError as exc:
            raise ProbeFailure("error", f"responder closed the connection before the {what}") from exc
        except OSError as exc:
            raise ProbeFailure(reason_of_oserror(exc), str(exc)) from exc

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        sock = _stream_socket(self.address)
        conn: Connection | None = None
        try:
            with self._failures("hello"):
                async with asyncio.timeout(self.timeout):
                    await loop.sock_connect(sock, (self.address, self.port))
                    _tune(sock)
                    conn = Connection(sock)
                    await conn.write(HELLO.pack(MAGIC, VERSION, self.size))
                    answer, _ = await conn.read(1)
        except BaseException:
            _close(conn)
            sock.close()
            raise
        if answer != b"Y":
            conn.close()
            raise ProbeFailure("not_allowed", f"{self.address}:{self.port} refused this host")
        return conn

    async def _exchange(self, conn: Connection) -> float:
        with self._failures("response"):
            async with asyncio.timeout(self.timeout):
                sent_ns, start = time.time_ns(), time.perf_counter()
                await conn.write(self._payload)
                answer, arrived_ns = await conn.read(self.size + HOLD.size)
                elapsed = time.perf_counter() - start
        return stamps.network_rtt(sent_ns, arrived_ns, elapsed, HOLD.unpack_from(answer, self.size)[0])


def _close(conn: Connection | None) -> None:
    if conn is not None:
        conn.close()


class RrResponder:
    """Answers request/response probes from allowed sources only."""

    def __init__(self, allow: AllowList, max_connections_per_source: int, count: Callable[[str], None]):
        self.allow = allow
        self.max_per_source = max_connections_per_source
        self.count = count  # called with accepted / not_allowed / rate_limited / malformed
        self._open: Counter[str] = Counter()

    async def start(self, host: str, port: int) -> RrServer:
        listener = _stream_socket(host)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        return RrServer(listener, self._handle)

    async def _handle(self, sock: socket.socket, source: str) -> None:
        try:
            _tune(sock)
            conn = Connection(sock)
        except OSError:
            sock.close()
            return
        try:
            if not self.allow.allows(source):
                self.count("not_allowed")
                await conn.write(b"N")
                return
            if self._open[source] >= self.max_per_source:
                self.count("rate_limited")
                await conn.write(b"N")
                return
            self._open[source] += 1
            try:
                await self._serve(conn)
            finally:
                self._open[source] -= 1
                if not self._open[source]:
                    del self._open[source]
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            conn.close()

    async def _serve(self, conn: Connection) -> None:
        async with asyncio.timeout(HELLO_TIMEOUT):
            hello, _ = await conn.read(HELLO.size)
        magic, version, size = HELLO.unpack(hello)
        if magic != MAGIC or version != VERSION or not 1 <= size <= MAX_SIZE:
            self.count("malformed")
            await conn.write(b"N")
            return
        self.count("accepted")
        await conn.write(b"Y")
        while True:
            async with asyncio.timeout(IDLE_TIMEOUT):
                request, arrived_ns = await conn.read(size)
            # Taken last, so that the hold covers everything but the send itself.
            hold = max(0, time.time_ns() - arrived_ns)
            await conn.write(request + HOLD.pack(hold))


class RrServer:
    """The responder's listening socket and its connections; close() ends them all."""

    def __init__(self, listener: socket.socket, handle: Callable[[socket.socket, str], Coroutine[Any, Any, None]]):
        self.listener = listener
        self._handle = handle
        self._connections: set[asyncio.Task[None]] = set()
        self._accepting = asyncio.create_task(self._accept(), name="rr-accept")

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(self.listener)
            except OSError as exc:  # e.g. out of file descriptors: keep serving the others
                log.warning("tcp rr responder: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.create_task(self._handle(sock, peer[0]), name=f"rr-{peer[0]}")
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    def close(self) -> None:
        self._accepting.cancel()
        for task in list(self._connections):
            task.cancel()
        self.listener.close()
