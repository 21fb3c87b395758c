"""TCP request/response RTT prober, as netperf TCP_RR with an interval (wire format: wire.py).

Timeouts use asyncio.timeout(), not wait_for(): on Python 3.11 wait_for() can swallow
a cancellation that arrives as the read completes, and a probe loop would then
outlive the exporter's shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Protocol

from .. import stamps, wire
from ..probe_settings import RttSettings
from .base import BACKOFF_SECONDS, ProbeFailure, Reason, Rejection, Target, reason_of_oserror
from .flows import FlowHealth
from .pacer import PACE_SECONDS, Pacer, sleep_until


class RttSink(Protocol):
    """Outcomes of the TCP request/response prober."""

    # age: seconds since the answer came (a two-step responder's follow-up comes with the next one)
    def rtt(self, seconds: float, age: float = 0.0) -> None: ...
    def failure(self, reason: Reason) -> None: ...
    def flows_failing(self, count: int) -> None: ...
    # A field of an answer not taken (probes.base.REJECTIONS): no sample from it, or the sample without it.
    def rejected(self, reason: Rejection) -> None: ...


class RttTee:
    """Hands every RTT outcome to several sinks (e.g. the RTT room and an RTT window)."""

    def __init__(self, *sinks: RttSink):
        self.sinks = sinks

    def rtt(self, seconds: float, age: float = 0.0) -> None:
        for s in self.sinks:
            s.rtt(seconds, age)

    def failure(self, reason: Reason) -> None:
        for s in self.sinks:
            s.failure(reason)

    def flows_failing(self, count: int) -> None:
        for s in self.sinks:
            s.flows_failing(count)

    def rejected(self, reason: Rejection) -> None:
        for s in self.sinks:
            s.rejected(reason)


class RttProber:
    def __init__(self, target: Target, settings: RttSettings, sink: RttSink):
        self.target, self.settings, self.sink = target, settings, sink
        self._payload = b"\x00" * settings.size_bytes
        # Two-step (wire.RR_FOLLOW_UP): each connection's last RTT and when its answer came
        # (perf_counter) wait for the connection's next answer, which says the responder's stretch
        # from its clock read to its send; without it by then (or with the connection gone), as it is.
        self._two_step = settings.size_bytes >= wire.RR_FOLLOW_UP.size
        self._held: list[tuple[float, float] | None] = [None] * settings.flows
        self._follow_up_wait = settings.timeout_seconds + 2 * settings.flows * settings.interval_seconds

    def _release(self, flow: int, stretch: float = 0.0) -> None:
        """The flow's held RTT to the sink, less `stretch` (seconds; its follow-up's): a stretch that
        is not a part of that round trip is the responder's error, not taken."""
        held = self._held[flow]
        if held is not None:
            self._held[flow] = None
            rtt, arrived = held
            if not 0 <= stretch < rtt:
                self.sink.rejected("follow_up_out_of_bounds")
                stretch = 0.0
            self.sink.rtt(rtt - stretch, time.perf_counter() - arrived)

    def _release_overdue(self) -> None:
        now = time.perf_counter()
        for flow, held in enumerate(self._held):
            if held is not None and now - held[1] > self._follow_up_wait:
                self._release(flow)

    def _measured(self, flow: int, rtt: float, follow_up: int) -> None:
        """An exchange's RTT, and the follow-up its answer carries of the flow's previous one."""
        self._release(flow, (follow_up - 1) / 1e9 if follow_up else 0.0)
        if self._two_step:
            self._held[flow] = (rtt, time.perf_counter())
        else:
            self.sink.rtt(rtt)

    async def run(self, count: int | None = None) -> None:
        """Probe `count` times (forever when None) at the configured interval, over
        `flows` persistent connections in turn (each its own source port, so that
        the probes cross every member of an ECMP group). Never raises: every failure
        goes to the sink, and that connection backs off before it is tried again."""
        loop = asyncio.get_running_loop()
        interval = self.settings.interval_seconds
        flows = self.settings.flows
        conns: list[wire.Connection | None] = [None] * flows
        health = [FlowHealth() for _ in range(flows)]
        retry_at = [0.0] * flows
        done = turn = 0
        failing = [False] * flows
        due = loop.time()
        try:
            while count is None or done < count:
                await sleep_until(due, interval)
                # Keep a fixed cadence; after a stall, skip ahead instead of bursting.
                due = max(due + interval, loop.time())
                ready = [f for f in range(flows) if retry_at[f] <= loop.time()]
                if not ready:
                    due = max(due, min(retry_at))
                    continue
                flow = min(ready, key=lambda f: (f - turn) % flows)  # the next in turn that may go
                turn = flow + 1
                try:
                    if conns[flow] is None:
                        conns[flow] = await self._connect()
                    conn = conns[flow]
                    assert conn is not None
                    rtt, follow_up = await self._exchange(conn)
                    if rtt is None:  # answered, with a hold beyond the round trip: no sample
                        self._release(flow)
                        self.sink.rejected("hold_beyond_rtt")
                    else:
                        self._measured(flow, rtt, follow_up)
                    health[flow].record(lost=False)
                except ProbeFailure as exc:
                    self._release(flow)  # its connection ends: nothing follows it up
                    self.sink.failure(exc.reason)
                    health[flow].record(lost=True)
                    _close(conns[flow])
                    conns[flow] = None
                    retry_at[flow] = loop.time() + BACKOFF_SECONDS
                if health[flow].failing() != failing[flow]:
                    failing[flow] = not failing[flow]
                    self.sink.flows_failing(sum(failing))
                done += 1
                self._release_overdue()
        finally:
            for flow in range(flows):
                self._release(flow)
            for conn in conns:
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
            sock = wire.probe_socket(t.address, socket.SOCK_STREAM, t.source)
            wire.mark(sock, t.address, self.settings.dscp)  # the SYN too
        try:
            with self._failures("hello"):
                async with asyncio.timeout(self.settings.timeout_seconds):
                    await loop.sock_connect(sock, (t.address, t.port))
                    wire.tune(sock)
                    # Answers read on the pacer's grid, as the echoes are, not a wake-up of the loop
                    # each: bench/exporter_bench.py's 50 peers answered 1-150 ms late cost 2.36% of a
                    # core so (14 runs; at most 2.53%), 2.59% with a wake-up each (at most 3.07%). Not
                    # for a prober that sends more often than the grid's step: its exchanges would
                    # wait for passes.
                    grid = Pacer.of(loop) if self.settings.interval_seconds >= PACE_SECONDS else None
                    conn = wire.Connection(sock, stamp_sends=True, grid=grid)
                    await conn.write(wire.RR_HELLO.pack(wire.RR_MAGIC, wire.RR_VERSION, self.settings.size_bytes))
                    answer, _ = await conn.read(1)
        except BaseException:
            _close(conn)
            sock.close()
            raise
        if answer != b"Y":
            conn.close()
            if answer != b"N":
                raise ProbeFailure(
                    "error", f"{t.address}:{t.port} is not a pathprobe rr responder (it answered {answer!r})"
                )
            raise ProbeFailure("not_allowed", f"{t.address}:{t.port} refused this host")
        return conn

    async def _exchange(self, conn: wire.Connection) -> tuple[float | None, int]:
        """(the RTT, None where the responder's hold is not possible; the answer's follow-up of the
        connection's previous one: wire.RR_FOLLOW_UP)."""
        size, timeout = self.settings.size_bytes, self.settings.timeout_seconds
        with self._failures("response"):
            sent_ns, start = time.time_ns(), time.perf_counter()
            try:
                # An answer read on the grid waits up to a step after it came: the wait is two steps
                # longer (one would end on the very pass that reads it), and the answer's own stamps
                # say whether it came within the timeout.
                async with asyncio.timeout(timeout + 2 * PACE_SECONDS):
                    await conn.write(self._payload)
                    answer, arrived_ns = await conn.read(size + wire.HOLD.size)
            except TimeoutError:
                # After a stall of this process (a large reload beside it, a busy host) the timer can
                # run before the pass that reads an answer which came in time: its stamps decide.
                came = conn.read_now(size + wire.HOLD.size)
                if came is None and conn.delivered():
                    # The peer's host took the request (its kernel acknowledged it) and its responder
                    # has not answered yet: a busy host, not the path. Its hold, stamped from the
                    # request's arrival, is kept out of the RTT; a timeout more is waited for it.
                    async with asyncio.timeout(timeout):
                        came = await conn.read(size + wire.HOLD.size)
                if came is None:
                    raise
                answer, arrived_ns = came
            elapsed = time.perf_counter() - start
            sent_ns = stamps.sent_time(sent_ns, conn.sent_ns, arrived_ns)
            rtt = stamps.network_rtt(sent_ns, arrived_ns, elapsed, wire.HOLD.unpack_from(answer, size)[0])
            if rtt is not None and rtt > timeout:
                raise TimeoutError  # it came, after the timeout
        return rtt, wire.RR_FOLLOW_UP.unpack_from(answer)[0] if self._two_step else 0


def _close(conn: wire.Connection | None) -> None:
    if conn is not None:
        conn.close()
