"""TCP request/response RTT probe, as netperf TCP_RR with an interval.

Timeouts use asyncio.timeout(), not wait_for(): on Python 3.11 wait_for() can swallow
a cancellation that arrives as the read completes, and a probe loop would then
outlive the exporter's shutdown.

Wire protocol (pathprobe's own, so that the responder can refuse strangers and
cap sizes): the client sends a 9-byte hello, b"PPRR", version 1, and the request
size as a big-endian u32; the responder answers b"Y" (go on) or b"N" (refused),
then echoes every `size`-byte request back on the same connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Protocol

from .allow import AllowList
from .results import ProbeFailure, reason_of_oserror

log = logging.getLogger(__name__)

HELLO = struct.Struct("!4sBI")
MAGIC = b"PPRR"
VERSION = 1
MAX_SIZE = 65536
HELLO_TIMEOUT = 5.0
IDLE_TIMEOUT = 120.0


class RttSink(Protocol):
    def rtt(self, seconds: float) -> None: ...
    def failure(self, reason: str) -> None: ...


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
        writer: asyncio.StreamWriter | None = None
        reader: asyncio.StreamReader | None = None
        try:
            while count is None or done < count:
                await asyncio.sleep(max(0.0, due - loop.time()))
                # Keep a fixed cadence; after a stall, skip ahead instead of bursting.
                due = max(due + self.interval, loop.time())
                try:
                    if writer is None:
                        reader, writer = await self._connect()
                    assert reader is not None
                    self.sink.rtt(await self._exchange(reader, writer))
                except ProbeFailure as exc:
                    self.sink.failure(exc.reason)
                    _close(writer)
                    writer = reader = None
                    # Do not hammer a failing peer faster than once a second.
                    due = max(due, loop.time() + 1.0)
                done += 1
        finally:
            _close(writer)

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

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        with self._failures("hello"):
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(self.address, self.port)
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            writer.write(HELLO.pack(MAGIC, VERSION, self.size))
            async with asyncio.timeout(self.timeout):
                answer = await reader.readexactly(1)
        if answer != b"Y":
            _close(writer)
            raise ProbeFailure("not_allowed", f"{self.address}:{self.port} refused this host")
        return reader, writer

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> float:
        with self._failures("response"):
            start = time.perf_counter()
            writer.write(self._payload)
            async with asyncio.timeout(self.timeout):
                await reader.readexactly(self.size)
            return time.perf_counter() - start


def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None:
        writer.close()


class RrResponder:
    """Answers request/response probes from allowed sources only."""

    def __init__(self, allow: AllowList, max_connections_per_source: int, count: Callable[[str], None]):
        self.allow = allow
        self.max_per_source = max_connections_per_source
        self.count = count  # called with accepted / not_allowed / rate_limited / malformed
        self._open: Counter[str] = Counter()

    async def start(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(self._handle, host, port, reuse_address=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        source = writer.get_extra_info("peername")[0]
        try:
            if not self.allow.allows(source):
                self.count("not_allowed")
                writer.write(b"N")
                return
            if self._open[source] >= self.max_per_source:
                self.count("rate_limited")
                writer.write(b"N")
                return
            self._open[source] += 1
            try:
                await self._serve(reader, writer)
            finally:
                self._open[source] -= 1
                if not self._open[source]:
                    del self._open[source]
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except asyncio.CancelledError:
            pass  # the exporter is stopping: this connection ends with it
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(HELLO_TIMEOUT):
            magic, version, size = HELLO.unpack(await reader.readexactly(HELLO.size))
        if magic != MAGIC or version != VERSION or not 1 <= size <= MAX_SIZE:
            self.count("malformed")
            writer.write(b"N")
            return
        self.count("accepted")
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.write(b"Y")
        while True:
            async with asyncio.timeout(IDLE_TIMEOUT):
                data = await reader.readexactly(size)
            writer.write(data)
            await writer.drain()
