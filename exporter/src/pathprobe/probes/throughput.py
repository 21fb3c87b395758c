"""Throughput prober: one iperf3 client test, its command line, and parsing of `-J`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import iperf3, procs, sockdiag
from ..config import Iperf3Settings, ThroughputSettings, default
from .base import ProbeFailure, Reason, Target, ThroughputSink
from .steady import (
    Detector,
    Interval,
    delivered_bytes,
    delivered_intervals,
    limited_shares,
    parse_interval,
    sender_rtt,
    wire_bytes,
)

# iperf3's reporting interval for a steady-state test, and how often its delivered bytes are read.
INTERVAL_SECONDS = SAMPLE_SECONDS = 0.1

# Substrings of iperf3's "error" field, first match wins.
_ERROR_REASONS: tuple[tuple[str, Reason], ...] = (
    ("busy", "busy"),
    # iperf3 3.12's server re-opens its listening socket after each test: a client that connects
    # in that moment (the next test of a turn, right after the last at a long RTT) is reset.
    ("unable to receive control message: connection reset", "busy"),
    # The control connection was accepted and the server was gone when the data stream connected:
    # cut by the peer's admission (below), before "connection refused" reads as no server at all.
    ("unable to connect stream: connection refused", "out_of_turn"),
    ("connection refused", "refused"),
    ("no route to host", "unreachable"),
    ("network is unreachable", "unreachable"),
    ("host is unreachable", "unreachable"),
    ("timed out", "timeout"),
    ("timeout", "timeout"),
    ("authentication failed", "not_allowed"),
    ("authorization failed", "not_allowed"),
    # A peer's admission cuts a test it refuses by killing its server as the test connects
    # (responders/iperf3.py): out of turn by the peer's clock. (A host the peer does not admit
    # at all is cut the same way; its RTT and loss probes then read not_allowed too.)
    # Seen as any of these, by how far the test had got (iperf3 3.12 on loopback):
    ("control socket has closed unexpectedly", "out_of_turn"),
    ("unable to write to stream socket", "out_of_turn"),  # connection reset, or broken pipe
    ("unable to initialize stream", "out_of_turn"),  # transport endpoint is not connected
)
# Reasons that only a test cut in its first second can have: later, the same message is a failure.
# The peer's admission kills its server as the test connects: 24-86 ms into the test on this
# project's idle loopback mesh, over 100 ms on a loaded machine. A fixed-length test has not reported
# its first (1 s) interval by then, but a steady-state test reports every 0.1 s: the test's own
# time decides, not its interval count.
_AT_START_ONLY: tuple[Reason, ...] = ("out_of_turn",)
AT_START_SECONDS = 1.0
# iperf3 -J of a 60 s test with 128 streams is a few MB; a child printing more is broken.
MAX_OUTPUT_BYTES = 32 * 2**20
MAX_STDERR_BYTES = 64 * 2**10


@dataclass(frozen=True)
class ThroughputTest:
    """The settings of one iperf3 client test (the throughput prober's settings model)."""

    protocol: str = "tcp"
    streams: int = 1
    direction: str = "send"  # send: this host -> peer; receive: peer -> this host (-R)
    duration_seconds: float = default(ThroughputSettings, "duration_seconds")
    omit_seconds: float = default(ThroughputSettings, "omit_seconds")
    congestion: str | None = None
    udp_bitrate: float = default(ThroughputSettings, "udp_bitrate")
    window_bytes: int | None = None
    connect_timeout_seconds: float = 3
    # RSA authentication (client side).
    username: str | None = None
    password_file: Path | None = None
    public_key_file: Path | None = None
    legacy_rsa_padding: bool = False
    # Stop a TCP test at its steady state (probes/steady.py); duration_seconds is then its most.
    steady_state: Detector | None = None
    rtt_hint_seconds: float | None = None  # the path's RTT, for the detector's window
    binary: str = default(Iperf3Settings, "binary")
    # Time a test may overrun duration + omit before it is killed (connecting included).
    margin_seconds: float = 5.0
    dscp: int = 0  # iperf3 --dscp: the mark of the test's packets (the data connections')

    @property
    def steady(self) -> Detector | None:
        """The detector, for a test that stops at its steady state (TCP only)."""
        return self.steady_state if self.protocol == "tcp" else None

    def command(self, target: Target) -> list[str]:
        # A steady-state test reads intervals live: text (-J prints only at the end), fixed units.
        output = ["-i", f"{INTERVAL_SECONDS:g}", "--forceflush", "-f", "k"] if self.steady else ["-J"]
        omit = 0 if self.steady else self.omit_seconds
        cmd = [
            self.binary, "-c", target.address, "-p", str(target.port), *output,
            "-t", f"{self.duration_seconds:g}", "-O", f"{omit:g}",
            "-P", str(self.streams),
            "--connect-timeout", str(int(self.connect_timeout_seconds * 1000)),
        ]  # fmt: skip
        if target.source is not None:
            cmd += ["-B", target.source]
        if self.protocol == "udp":
            # -b is per stream in iperf3; the configured rate is the total.
            cmd += ["-u", "-b", f"{self.udp_bitrate / self.streams:.0f}"]
        if self.direction == "receive":
            cmd.append("-R")
        if self.congestion and self.protocol == "tcp":
            cmd += ["-C", self.congestion]
        if self.window_bytes:
            cmd += ["-w", str(self.window_bytes)]
        if self.dscp:
            cmd += ["--dscp", str(self.dscp)]
        if self.username and self.public_key_file:
            cmd += ["--username", self.username, "--rsa-public-key-path", str(self.public_key_file),
                    *iperf3.client_options(self.binary, self.legacy_rsa_padding)]  # fmt: skip
        return cmd

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.password_file:
            env["IPERF3_PASSWORD"] = self.password_file.read_text().strip()
        return env

    def max_seconds(self) -> float:
        """The longest a test may take before it is killed (connecting included in the margin)."""
        return (0 if self.steady else self.omit_seconds) + self.duration_seconds + self.margin_seconds


@dataclass
class ThroughputResult:
    # Settings the result was measured with: two numbers are never compared blind.
    protocol: str
    streams: int
    direction: str
    duration_seconds: float
    omit_seconds: float
    congestion: str | None
    target_bits_per_second: float | None
    # Measurements.
    receiver_bytes_per_second: float
    sender_bytes_per_second: float
    bytes_transferred: int
    retransmits: int | None = None
    udp_packets: int | None = None
    udp_lost: int | None = None
    udp_loss_ratio: float | None = None
    jitter_seconds: float | None = None
    timestamp: float = 0.0
    iperf3_version: str = ""
    # A steady-state test: whether it converged (False: it ran to duration_seconds), and how
    # long it ran (duration_seconds is then the time it took); None for a fixed-length test.
    converged: bool | None = None
    # A steady-state send test read through the sockets: the shares of its sending time with the
    # receiver's window full and with the send buffer full (steady.limited_shares); None otherwise.
    receive_window_limited_ratio: float | None = None
    send_buffer_limited_ratio: float | None = None
    # A TCP test: the mean over the test of its sending streams' smoothed RTT (the sender's kernel),
    # where reported: from the sockets (steady.sender_rtt) or iperf3's report (a fixed-length test).
    sender_rtt_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def moved_bytes(self) -> int:
        """Bytes the test put on the wire: iperf3 leaves the omitted seconds out of its count."""
        return int(self.bytes_transferred * (self.duration_seconds + self.omit_seconds) / self.duration_seconds)


def classify_error(message: str, ran_seconds: float = 0.0) -> Reason:
    """The reason for iperf3's error `message`, `ran_seconds` into the test (its last interval's end)."""
    low = message.lower()
    for needle, reason in _ERROR_REASONS:
        if needle in low:
            return "error" if ran_seconds >= AT_START_SECONDS and reason in _AT_START_ONLY else reason
    return "error"


def parse(output: str | bytes, test: ThroughputTest, now: float | None = None) -> ThroughputResult:
    """Parse iperf3 -J output; raise ProbeFailure for an error report or garbage."""
    try:
        doc = json.loads(output)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        snippet = (output[:80] if isinstance(output, str) else output[:80].decode(errors="replace")).strip()
        raise ProbeFailure("error", f"iperf3 output is not JSON ({exc}): {snippet!r}") from exc
    if not isinstance(doc, dict):
        raise ProbeFailure("error", "iperf3 output is not a JSON object")
    if doc.get("error"):
        message = str(doc["error"])
        raise ProbeFailure(classify_error(message, _ran_seconds(doc.get("intervals"))), message)
    try:
        result = _result(doc, test, now)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise ProbeFailure("error", f"iperf3 JSON lacks an expected field or has a bad value: {exc!r}") from exc
    rates = (result.receiver_bytes_per_second, result.sender_bytes_per_second)
    if not all(math.isfinite(r) and r >= 0 for r in rates):
        raise ProbeFailure("error", f"iperf3 reported an impossible rate: {rates}")
    return result


def _ran_seconds(intervals: Any) -> float:
    """The end of the last interval of iperf3 -J's `intervals`: 0 for none; AT_START_SECONDS for
    intervals of a shape not iperf3's (the test had started)."""
    try:
        return float(intervals[-1]["sum"]["end"]) if intervals else 0.0
    except (LookupError, TypeError, ValueError):
        return AT_START_SECONDS  # an interval of unknown length: the test had started


def _stream_rtt(end: dict[str, Any]) -> float | None:
    rtts = [s["sender"].get("mean_rtt", 0) for s in end.get("streams", []) if "sender" in s]
    rtts = [float(r) for r in rtts if r and float(r) > 0]
    return sum(rtts) / len(rtts) / 1e6 if rtts else None  # iperf3 reports microseconds


def _result(doc: dict[str, Any], test: ThroughputTest, now: float | None) -> ThroughputResult:
    end = doc["end"]
    start = doc.get("start", {})
    sent = end["sum_sent"]
    common: dict[str, Any] = {
        "protocol": test.protocol,
        "streams": test.streams,
        "direction": test.direction,
        "duration_seconds": test.duration_seconds,
        "omit_seconds": test.omit_seconds,
        "congestion": test.congestion,
        "target_bits_per_second": test.udp_bitrate if test.protocol == "udp" else None,
        "sender_bytes_per_second": float(sent["bits_per_second"]) / 8,
        "bytes_transferred": int(sent["bytes"]),
        "timestamp": now if now is not None else time.time(),
        "iperf3_version": str(start.get("version", "")),
    }
    if test.protocol == "udp":
        # iperf3 >= 3.7 has the receiver's view in sum_received; older ones only in sum.
        recv = end["sum_received"] if "lost_packets" in end.get("sum_received", {}) else end["sum"]
        packets = int(recv["packets"])
        lost = int(recv["lost_packets"])
        return ThroughputResult(
            **common,
            receiver_bytes_per_second=float(recv["bits_per_second"]) / 8,
            udp_packets=packets,
            udp_lost=lost,
            udp_loss_ratio=lost / packets if packets else 0.0,
            jitter_seconds=float(recv.get("jitter_ms", 0.0)) / 1000,
        )
    return ThroughputResult(
        **common,
        receiver_bytes_per_second=float(end["sum_received"]["bits_per_second"]) / 8,
        retransmits=int(sent["retransmits"]) if "retransmits" in sent else None,
        sender_rtt_seconds=_stream_rtt(end),
    )


async def _read_bounded(stream: asyncio.StreamReader | None, limit: int, what: str) -> bytes:
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


class ThroughputProber:
    """One iperf3 client test against `target`: `run()` reports its outcome to the sink (the
    scheduled turns), `measure()` returns the result or raises ProbeFailure (the CLI)."""

    def __init__(self, target: Target, settings: ThroughputTest, sink: ThroughputSink | None = None):
        self.target, self.test, self.sink = target, settings, sink

    async def run(self) -> ThroughputResult | Reason:
        """Run the test and report its outcome: the result, or the reason it gave none."""
        try:
            result = await self.measure()
        except ProbeFailure as exc:
            if self.sink is not None:
                self.sink.failure(exc.reason, exc.detail)
            return exc.reason
        if self.sink is not None:
            self.sink.result(result)
        return result

    async def measure(self) -> ThroughputResult:
        """Run the test; its whole process group is killed on timeout or cancellation."""
        test = self.test
        try:
            proc = await procs.start(
                test.command(self.target),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL,
                env=test.env(),
            )
        except OSError as exc:  # missing, not executable, or not a program
            raise ProbeFailure("error", f"cannot run iperf3 {test.binary!r}: {exc.strerror or exc}") from exc
        limit = test.max_seconds()
        watch = _SteadyState(self.target, test, proc) if test.steady else None
        sampler = asyncio.ensure_future(watch.sample()) if watch else None
        reads = [
            asyncio.ensure_future(
                watch.read(proc.stdout) if watch else _read_bounded(proc.stdout, MAX_OUTPUT_BYTES, "stdout")
            ),
            asyncio.ensure_future(_read_bounded(proc.stderr, MAX_STDERR_BYTES, "stderr")),
        ]
        try:
            async with asyncio.timeout(limit):
                out, err = await asyncio.gather(*reads)
                await proc.wait()
        except BaseException as exc:
            for r in reads:
                r.cancel()
            await asyncio.wait(reads)  # the pipes are read to their end below, by one reader
            await procs.stop_group(proc, first=signal.SIGKILL)
            if isinstance(exc, TimeoutError):
                raise ProbeFailure("timeout", f"iperf3 did not finish within {limit:g} s") from exc
            raise
        finally:
            if sampler is not None:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
        if watch is not None:
            return watch.result(out, err)
        if not out.strip():
            raise ProbeFailure(
                "error", f"iperf3 exited {proc.returncode} with no output: {err.decode(errors='replace')[:200]}"
            )
        return parse(out, test)


async def _ss_sockets(target: Target) -> list[sockdiag.SocketBytes] | None:
    """The sockets to the peer's iperf3 port as `ss -tin` shows them; None without `ss`."""
    ss = shutil.which("ss")
    if ss is None:
        return None
    peer = f"[{target.address}]" if ":" in target.address else target.address
    proc = await asyncio.create_subprocess_exec(ss, "-tinH", "state", "established", "dst", peer, "dport",
                                                f"= :{target.port}", stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
    try:
        out, _ = await proc.communicate()
    except asyncio.CancelledError:  # the test ended: no ss left behind
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return sockdiag.parse_ss(out.decode(errors="replace"))


class _SteadyState:
    """A steady-state test as it runs: the bytes its sockets delivered, read every 0.1 s, and
    iperf3's intervals, read line by line; SIGINT to iperf3 (which ends the test at once) when
    the detector says the rate has settled. The detector reads the delivered bytes, or
    iperf3's intervals where no socket shows them (probes/steady.py)."""

    def __init__(self, target: Target, test: ThroughputTest, proc: asyncio.subprocess.Process):
        assert test.steady is not None
        self.target, self.test, self.proc, self.detector = target, test, proc, test.steady
        self.intervals: list[Interval] = []  # iperf3's
        self.samples: list[tuple[float, int]] = []  # (seconds, bytes delivered so far)
        self.wire = 0  # bytes on the wire so far (the last sample's)
        self.limited: tuple[float, float] | None = None  # the last sample's limited_shares (send tests)
        self.rtts: list[float] = []  # each sample's sender_rtt (send tests)
        self.rate: float | None = None  # bits/s, once converged

    def delivered(self) -> list[Interval]:
        return delivered_intervals(self.samples)

    def _check(self, intervals: list[Interval]) -> None:
        if self.rate is None:
            self.rate = self.detector.rate(intervals, self.test.rtt_hint_seconds)
            if self.rate is not None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGINT)  # iperf3 stops the test and exits

    async def sample(self) -> None:
        """Until cancelled: the bytes the test's sockets delivered (the connections to the peer's
        iperf3 port), every SAMPLE_SECONDS: from the kernel's sock_diag in-process, or from
        `ss -tin` where netlink is refused."""
        started = time.monotonic()
        netlink = True
        while True:
            at = time.monotonic()
            sockets = None
            if netlink:
                try:
                    sockets = sockdiag.tcp_sockets(self.target.address, self.target.port)
                except OSError:
                    netlink = False
            if sockets is None:
                sockets = await _ss_sockets(self.target)
                if sockets is None:
                    return  # no `ss` either: iperf3's intervals decide
            self.samples.append((at - started, delivered_bytes(sockets, self.test.direction)))
            self.wire = max(self.wire, wire_bytes(sockets, self.test.direction))
            if self.test.direction == "send":  # this host's sockets send: their own chronographs
                self.limited = limited_shares(sockets) or self.limited
                rtt = sender_rtt(sockets)
                if rtt is not None:
                    self.rtts.append(rtt)
            delivered = self.delivered()
            if delivered:
                self._check(delivered)
            await asyncio.sleep(max(0.0, SAMPLE_SECONDS - (time.monotonic() - at)))

    async def read(self, stream: asyncio.StreamReader | None) -> bytes:
        """All of stdout (bounded), watching the intervals go by."""
        assert stream is not None
        lines: list[bytes] = []
        size = 0
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
            interval = parse_interval(line.decode(errors="replace"), self.test.streams)
            if interval is None:
                continue
            self.intervals.append(interval)  # after convergence too: what the test moved until it stopped
            if not self.delivered():  # no socket shows its delivered bytes: iperf3's intervals decide
                self._check(self.intervals)
        return b"".join(lines)

    def result(self, out: bytes, err: bytes) -> ThroughputResult:
        """The converged result; or, for a test that ran to its maximum, the rate of its last
        windows with converged=False; ProbeFailure for one that stopped before either."""
        test, intervals = self.test, self.intervals
        converged = self.rate is not None
        ran = intervals[-1].end if intervals else 0.0
        if not converged and ran < test.duration_seconds - INTERVAL_SECONDS:
            message = (err or out).decode(errors="replace").strip().splitlines()
            detail = message[-1][:200] if message else f"exit {self.proc.returncode}"
            reason = classify_error(detail, ran)
            raise ProbeFailure(reason, f"iperf3 stopped after {ran:g} of {test.duration_seconds:g} s "
                                       f"without a steady rate: {detail}")  # fmt: skip
        delivered = self.delivered()
        final = delivered or intervals
        rate = self.rate if converged else self.detector.rate(final, test.rtt_hint_seconds, final=True)
        if rate is None or not math.isfinite(rate):
            raise ProbeFailure("error", "iperf3's intervals give no rate")
        # What went on the wire, from the sockets (iperf3's intervals count what it wrote into its
        # socket buffers, several seconds' worth at the start of a test with large buffers).
        sent = self.wire or int(sum(i.bits_per_second * i.seconds for i in intervals) / 8)
        retransmits = [i.retransmits for i in intervals if i.retransmits is not None]
        return ThroughputResult(
            protocol=test.protocol, streams=test.streams, direction=test.direction,
            duration_seconds=ran, omit_seconds=0, congestion=test.congestion, target_bits_per_second=None,
            # What the peer acknowledged ("send") or this host received (-R): the receiver's side
            # (iperf3's own intervals where no socket showed it; at a steady rate the same).
            receiver_bytes_per_second=rate / 8, sender_bytes_per_second=rate / 8,
            bytes_transferred=sent, retransmits=sum(retransmits) if retransmits else None,
            timestamp=time.time(), iperf3_version="", converged=converged,
            receive_window_limited_ratio=self.limited[0] if self.limited else None,
            send_buffer_limited_ratio=self.limited[1] if self.limited else None,
            sender_rtt_seconds=sum(self.rtts) / len(self.rtts) if self.rtts else None,
        )  # fmt: skip
