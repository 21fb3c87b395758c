"""TCP request/response RTT prober, as netperf TCP_RR with an interval (wire format: wire.py).

Timeouts use asyncio.timeout(), not wait_for(): on Python 3.11 wait_for() can swallow
a cancellation that arrives as the read completes, and a probe loop would then
outlive the exporter's shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from .. import stamps, wire
from ..config import RttSettings
from .base import BACKOFF_SECONDS, ProbeFailure, RttSink, Target, reason_of_oserror


class RttProber:
    def __init__(self, target: Target, settings: RttSettings, sink: RttSink):
        self.target, self.settings, self.sink = target, settings, sink
        self._payload = b"\x00" * settings.size_bytes

    async def run(self, count: int | None = None) -> None:
        """Probe `count` times (forever when None), keeping one connection open.
        Never raises: every failure goes to the sink, then the prober backs off."""
        loop = asyncio.get_running_loop()
        interval = self.settings.interval_seconds
        done = 0
        due = loop.time()
        conn: wire.Connection | None = None
        try:
            while count is None or done < count:
                await asyncio.sleep(max(0.0, due - loop.time()))
                # Keep a fixed cadence; after a stall, skip ahead instead of bursting.
                due = max(due + interval, loop.time())
                try:
                    if conn is None:
                        conn = await self._connect()
                    self.sink.rtt(await self._exchange(conn))
                except ProbeFailure as exc:
                    self.sink.failure(exc.reason)
                    _close(conn)
                    conn = None
                    due = max(due, loop.time() + BACKOFF_SECONDS)
                done += 1
        finally:
            _close(conn)

    @contextlib.contextmanager
    def _failures(self, what: str) -> Iterator[None]:
        """Socket and stream errors as ProbeFailure with their metric reason."""
        t = self.target
        try:
            yield
        except TimeoutError as exc:
            raise ProbeFailure(
                "timeout", f"no {what} from {t.address}:{t.port} in {self.settings.timeout_seconds:g} s"
            ) from exc
        except asyncio.IncompleteReadError as exc:
            raise ProbeFailure("error", f"responder closed the connection before the {what}") from exc
        except OSError as exc:
            raise ProbeFailure(reason_of_oserror(exc), str(exc)) from exc

    async def _connect(self) -> wire.Connection:
        loop = asyncio.get_running_loop()
        t = self.target
        conn: wire.Connection | None = None
        with self._failures("hello"):
            sock = wire.stream_socket(t.address)
        try:
            with self._failures("hello"):
                async with asyncio.timeout(self.settings.timeout_seconds):
                    await loop.sock_connect(sock, (t.address, t.port))
                    wire.tune(sock)
                    conn = wire.Connection(sock)
                    await conn.write(wire.RR_HELLO.pack(wire.RR_MAGIC, wire.RR_VERSION, self.settings.size_bytes))
                    answer, _ = await conn.read(1)
        except BaseException:
            _close(conn)
            sock.close()
            raise
        if answer != b"Y":
            conn.close()
            raise ProbeFailure("not_allowed", f"{t.address}:{t.port} refused this host")
        return conn

    async def _exchange(self, conn: wire.Connection) -> float:
        size = self.settings.size_bytes
        with self._failures("response"):
            async with asyncio.timeout(self.settings.timeout_seconds):
                sent_ns, start = time.time_ns(), time.perf_counter()
                await conn.write(self._payload)
                answer, arrived_ns = await conn.read(size + wire.HOLD.size)
                elapsed = time.perf_counter() - start
        return stamps.network_rtt(sent_ns, arrived_ns, elapsed, wire.HOLD.unpack_from(answer, size)[0])


def _close(conn: wire.Connection | None) -> None:
    if conn is not None:
        conn.close()
