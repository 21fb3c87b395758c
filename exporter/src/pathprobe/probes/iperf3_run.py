"""One throughput test's iperf3 client processes as they run: started, their output read
(bounded), a steady-state test watched and stopped at its settled rate, all of them killed on a
timeout or a cancellation. A test of several streams may be split over several processes, each
with its share of the streams and a server of its own on the peer (iperf3 before 3.16 runs every
stream of a process on one thread: one process measures one core), and their figures summed."""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import signal
import time
from dataclasses import dataclass, replace

from .. import procs, sockdiag
from .base import ProbeFailure, Target
from .iperf3_test import INTERVAL_SECONDS, ThroughputResult, ThroughputTest
from .steady import (
    Interval,
    delivered_bytes,
    delivered_intervals,
    limited_shares,
    parse_interval,
    sender_rtt,
    wire_bytes,
)

# How often a steady-state test's delivered bytes are read: as often as iperf3 reports.
SAMPLE_SECONDS = INTERVAL_SECONDS
# iperf3 -J of a 60 s test with 128 streams is a few MB; a child printing more is broken.
MAX_OUTPUT_BYTES = 32 * 2**20
MAX_STDERR_BYTES = 64 * 2**10


@dataclass(frozen=True)
class Part:
    """One process of a test: the peer's server it tests, and its share of the streams."""

    target: Target
    test: ThroughputTest


def split(target: Target, test: ThroughputTest, ports: list[int]) -> list[Part]:
    """The test over one process per port (at most one per stream), the streams shared out evenly."""
    n = max(1, min(test.streams, len(ports)))
    shares = [test.streams // n + (1 if i < test.streams % n else 0) for i in range(n)]
    return [Part(replace(target, port=port), replace(test, streams=k)) for port, k in zip(ports, shares, strict=False)]


def combine(results: list[ThroughputResult]) -> ThroughputResult:
    """The results of one test's processes as one: rates, bytes, retransmits and datagrams added up,
    the worst jitter, the mean of the RTTs their streams saw."""
    if len(results) == 1:
        return results[0]

    def total(values: list[int | None]) -> int | None:
        return None if any(v is None for v in values) else sum(v or 0 for v in values)

    packets, lost = total([r.udp_packets for r in results]), total([r.udp_lost for r in results])
    jitters = [r.jitter_seconds for r in results if r.jitter_seconds is not None]
    rtts = [r.sender_rtt_seconds for r in results if r.sender_rtt_seconds is not None]
    return replace(
        results[0],
        streams=sum(r.streams for r in results),
        receiver_bytes_per_second=sum(r.receiver_bytes_per_second for r in results),
        sender_bytes_per_second=sum(r.sender_bytes_per_second for r in results),
        bytes_transferred=sum(r.bytes_transferred for r in results),
        retransmits=total([r.retransmits for r in results]),
        udp_packets=packets,
        udp_lost=lost,
        udp_loss_ratio=None if packets is None or lost is None else (lost / packets if packets else 0.0),
        jitter_seconds=max(jitters) if jitters else None,
        sender_rtt_seconds=sum(rtts) / len(rtts) if rtts else None,
        intervals=[{**i, "process": n} for n, r in enumerate(results) for i in r.intervals],
    )


async def read_bounded(stream: asyncio.StreamReader | None, limit: int, what: str) -> bytes:
    """All of a pipe, or ProbeFailure once it passes `limit` bytes (the pipe is never left unread)."""
    assert stream is not None
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(65536):
        size += len(chunk)
        if size > limit:
            raise ProbeFailure("error", f"iperf3 printed more than {limit} bytes on {what}")
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class Output:
    """What one process printed, and how it ended."""

    out: bytes
    err: bytes
    returncode: int | None


class Run:
    """A test's processes, from their start to their output: start() them, then finish()."""

    def __init__(self, parts: list[Part]):
        self.parts = parts
        self.test = parts[0].test
        self.procs: list[asyncio.subprocess.Process] = []
        self.steady: SteadyState | None = None

    async def start(self) -> list[int]:
        """Start every process; their pids. ProbeFailure for a binary that cannot run."""
        for part in self.parts:
            try:
                self.procs.append(
                    await procs.start(
                        part.test.command(part.target),
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        stdin=asyncio.subprocess.DEVNULL,
                        env=part.test.env(),
                    )
                )
            except OSError as exc:  # missing, not executable, or not a program
                await self._kill()
                raise ProbeFailure("error", f"cannot run iperf3 {part.test.binary!r}: {exc.strerror or exc}") from exc
        if self.test.steady:
            self.steady = SteadyState(self.parts, self.procs)
        return [p.pid for p in self.procs]

    async def finish(self) -> list[Output]:
        """Every process's output once all have ended; the whole of each process group is killed
        on a timeout (ProbeFailure) or a cancellation."""
        left = math.inf if self.test.kill_at is None else self.test.kill_at - time.monotonic()
        cut = left < self.test.max_seconds()  # by the turn's end, not by the test's own length
        limit = min(left, self.test.max_seconds())
        watch = self.steady
        sampler = asyncio.ensure_future(watch.sample()) if watch else None
        reads = [
            asyncio.ensure_future(
                watch.read(i, p.stdout) if watch else read_bounded(p.stdout, MAX_OUTPUT_BYTES, "stdout")
            )
            for i, p in enumerate(self.procs)
        ] + [asyncio.ensure_future(read_bounded(p.stderr, MAX_STDERR_BYTES, "stderr")) for p in self.procs]
        try:
            async with asyncio.timeout(limit):
                texts = await asyncio.gather(*reads)
                for p in self.procs:
                    await p.wait()
        except BaseException as exc:
            for r in reads:
                r.cancel()
            await asyncio.wait(reads)  # the pipes are read to their end below, by one reader
            await self._kill()
            if isinstance(exc, TimeoutError):
                why = "by its turn's end" if cut else f"within {limit:g} s"
                raise ProbeFailure("timeout", f"iperf3 did not finish {why}") from exc
            raise
        finally:
            if sampler is not None:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
        n = len(self.procs)
        return [Output(texts[i], texts[n + i], p.returncode) for i, p in enumerate(self.procs)]

    async def _kill(self) -> None:
        for p in self.procs:
            await procs.stop_group(p, first=signal.SIGKILL)


async def _ss_sockets(target: Target) -> list[sockdiag.SocketBytes] | None:
    """The sockets to the peer's iperf3 port as `ss -tin` shows them; None without `ss`."""
    ss = shutil.which("ss")
    if ss is None:
        return None
    peer = f"[{target.address}]" if ":" in target.address else target.address
    proc = await asyncio.create_subprocess_exec(
        ss,
        "-tinH",
        "state",
        "established",
        "dst",
        peer,
        "dport",
        f"= :{target.port}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        out, _ = await proc.communicate()
    except asyncio.CancelledError:  # the test ended: no ss left behind
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return sockdiag.parse_ss(out.decode(errors="replace"))


def summed_intervals(processes: list[list[Interval]]) -> list[Interval]:
    """The intervals of a test split over processes, each process's rates added up over the same
    stretch of the test's time, as far as every process has come. By time, not by count: iperf3's
    timer woken late on a busy host gives fewer, longer intervals (a split test summed by count
    ended 0.2 s short of its 2 s and failed as stopped early). A process's retransmits count in the
    stretch its interval ends in."""
    if len(processes) == 1:
        return processes[0]
    if not all(processes):
        return []
    until = min(p[-1].end for p in processes)
    edges = sorted({i.end for p in processes for i in p if i.end <= until})
    known = all(i.retransmits is not None for p in processes for i in p)
    at = [0] * len(processes)  # each process's interval that covers the stretch
    out, start = [], max(p[0].start for p in processes)
    for end in edges:
        if end <= start:
            continue
        rate, retransmits = 0.0, 0
        for n, p in enumerate(processes):
            while p[at[n]].end < end:
                at[n] += 1
            covering = p[at[n]]
            rate += covering.bits_per_second
            if covering.end == end:
                retransmits += covering.retransmits or 0
        out.append(Interval(start, end, rate, retransmits if known else None))
        start = end
    return out


class SteadyState:
    """A steady-state test as it runs: the bytes its sockets delivered (to every server of the
    test), read every SAMPLE_SECONDS, and each process's iperf3 intervals, read line by line;
    SIGINT to every process (iperf3 ends the test at once) when the detector says the rate has
    settled. The detector reads the delivered bytes, or iperf3's intervals summed over the
    processes where no socket shows them (probes/steady.py)."""

    def __init__(self, parts: list[Part], processes: list[asyncio.subprocess.Process]):
        self.parts, self.procs = parts, processes
        self.test = parts[0].test
        assert self.test.steady is not None
        self.detector = self.test.steady
        self.intervals: list[list[Interval]] = [[] for _ in parts]  # each process's
        self.samples: list[tuple[float, int]] = []  # (seconds, bytes delivered so far)
        self.wire = [0] * len(parts)  # each process's bytes on the wire so far (the most a sample read)
        self.limited: tuple[float, float] | None = None  # the last sample's limited_shares (send tests)
        self.rtts: list[float] = []  # each sample's sender_rtt (send tests)
        self.rate: float | None = None  # bits/s, once converged

    def delivered(self) -> list[Interval]:
        return delivered_intervals(self.samples)

    def summed(self) -> list[Interval]:
        """iperf3's intervals of the whole test: each process's added up, as far as all have come."""
        return summed_intervals(self.intervals)

    def _check(self, intervals: list[Interval]) -> None:
        if self.rate is None:
            self.rate = self.detector.rate(intervals, self.test.rtt_hint_seconds)
            if self.rate is not None:
                for p in self.procs:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGINT)  # iperf3 stops the test and exits

    async def _sockets(self, netlink: bool) -> list[list[sockdiag.SocketBytes]] | None:
        """The test's sockets now, each process's apart: from sock_diag (`netlink`), else `ss`; None
        where neither can say."""
        found: list[list[sockdiag.SocketBytes]] = []
        for part in self.parts:
            got = (
                sockdiag.tcp_sockets(part.target.address, part.target.port)
                if netlink
                else await _ss_sockets(part.target)
            )
            if got is None:
                return None
            found.append(got)
        return found

    async def sample(self) -> None:
        """Until cancelled: the bytes the test's sockets delivered (the connections to the peer's
        iperf3 ports), every SAMPLE_SECONDS: from the kernel's sock_diag in-process, or from
        `ss -tin` where netlink is refused. The delivered bytes end with the last sample at which
        every process still ran: once a process's streams close, its bytes leave the sockets' sum
        (a split test's other processes would read as a rate that fell, a closed test's as a rate
        of zero). What each process put on the wire is counted to its end."""
        started = time.monotonic()
        netlink = True
        most = [0] * len(self.parts)  # each process's most sockets seen at once
        ended = False  # a process's streams have closed: no more delivered samples
        while True:
            at = time.monotonic()
            groups = None
            if netlink:
                try:
                    groups = await self._sockets(netlink=True)
                except OSError:
                    netlink = False
            if groups is None:
                groups = await self._sockets(netlink=False)
                if groups is None:
                    return  # no `ss` either: iperf3's intervals decide
            self.wire = [max(w, wire_bytes(g, self.test.direction)) for g, w in zip(groups, self.wire, strict=True)]
            ended = ended or any(len(g) < m for g, m in zip(groups, most, strict=True))
            if ended:
                await asyncio.sleep(max(0.0, SAMPLE_SECONDS - (time.monotonic() - at)))
                continue
            most = [max(len(g), m) for g, m in zip(groups, most, strict=True)]
            sockets = [s for g in groups for s in g]
            self.samples.append((at - started, delivered_bytes(sockets, self.test.direction)))
            if self.test.direction == "send":  # this host's sockets send: their own chronographs
                self.limited = limited_shares(sockets) or self.limited
                rtt = sender_rtt(sockets)
                if rtt is not None:
                    self.rtts.append(rtt)
            delivered = self.delivered()
            if delivered:
                self._check(delivered)
            await asyncio.sleep(max(0.0, SAMPLE_SECONDS - (time.monotonic() - at)))

    async def read(self, index: int, stream: asyncio.StreamReader | None) -> bytes:
        """All of one process's stdout (bounded), watching its intervals go by."""
        assert stream is not None
        lines: list[bytes] = []
        size = 0
        streams = self.parts[index].test.streams
        while True:
            try:
                line = await stream.readline()
            except ValueError as exc:  # a line over the reader's 64 KiB: not iperf3's
                raise ProbeFailure("error", f"iperf3 printed a line too long to be its own: {exc}") from exc
            if not line:
                break
            size += len(line)
            if size > MAX_OUTPUT_BYTES:
                raise ProbeFailure("error", f"iperf3 printed more than {MAX_OUTPUT_BYTES} bytes on stdout")
            lines.append(line)
            interval = parse_interval(line.decode(errors="replace"), streams)
            if interval is None:
                continue
            self.intervals[index].append(interval)  # after convergence too: what the test moved until it stopped
            if not self.delivered():  # no socket shows its delivered bytes: iperf3's intervals decide
                self._check(self.summed())
        return b"".join(lines)

    def rate_of(self, ran: float) -> tuple[float, bool]:
        """The test's rate (bits/s) and whether it settled; ProbeFailure where the intervals give none."""
        converged = self.rate is not None
        final = self.delivered() or self.summed()
        rate = self.rate if converged else self.detector.rate(final, self.test.rtt_hint_seconds, final=True)
        if rate is None or not math.isfinite(rate):
            raise ProbeFailure("error", "iperf3's intervals give no rate")
        return rate, converged

    def sent_bytes(self) -> int:
        """What went on the wire, from the sockets (iperf3's intervals count what it wrote into its
        socket buffers, several seconds' worth at the start of a test with large buffers)."""
        return sum(self.wire) or int(sum(i.bits_per_second * i.seconds for each in self.intervals for i in each) / 8)

    def retransmits(self) -> int | None:
        counted = [i.retransmits for each in self.intervals for i in each if i.retransmits is not None]
        return sum(counted) if counted else None
