"""Steady state of a throughput test: what the test delivers, read while it runs, and the
point from which more seconds would only confirm the rate.

What is read: the bytes the receiver acknowledged (sent with "send") or this host received
(with -R), summed over the test's sockets, from the kernel's TCP info (tcpi_bytes_acked,
tcpi_bytes_received: sockdiag.py) every 0.1 s; where no socket shows them, iperf3's own
interval reports. Measured in the lab (bench/steady_acked.py): iperf3's
sender-side intervals count what iperf3 writes into a large socket buffer, in bursts with
several streams, and stopped tests 3-12% off their steady state on 9 of 16 paths; the
acknowledged bytes stopped every one of the 16 within 1% (1-150 ms, 200-500 Mbit/s, 1 and 4
streams), with 10-14% of a 10 s test's bytes.

A TCP test starts in slow start; once the congestion window (or a buffer, or a shaper)
holds the rate, every further second moves bytes, billed per GB between regions, to
measure the same number. The detector compares the mean rate of the last two windows of
intervals; each window spans several RTTs (a rate is only stable over more than the
sawtooth of one RTT) and at least `min_window_seconds`. When the two agree within the
tolerance, after at least `min_seconds`, the test has converged: its rate is the mean
of those two windows. A test that never converges ends at its maximum duration and
says so (`converged=False`), with the mean of its last two windows.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..probe_settings import SteadyStateSettings
from ..sockdiag import SocketBytes

# iperf3's interval line, as printed with -f k: "[SUM]   0.30-0.40   sec  5.62 MBytes  47185 Kbits/sec ..."
# (one stream: "[  5]" instead of "[SUM]"). The rate is exact to 1 kbit/s; the transfer
# column is rounded to 3 digits, so bytes are the rate times the interval.
_INTERVAL = re.compile(
    r"^\[\s*(?P<id>SUM|\d+)\]\s+(?P<start>\d+\.\d+)-(?P<end>\d+\.\d+)\s+sec\s+[\d.]+\s+\w?Bytes\s+"
    r"(?P<rate>[\d.]+)\s+(?P<unit>[KMGT]?)bits/sec(?P<rest>.*)$"
)
_UNITS = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    bits_per_second: float
    retransmits: int | None = None  # the sender's, where iperf3 shows them (not with -R)

    @property
    def seconds(self) -> float:
        return self.end - self.start


def parse_interval(line: str, streams: int) -> Interval | None:
    """One interval of the whole test from iperf3's text output: the [SUM] line with
    several streams, the stream's own line with one; None for any other line (headers,
    per-stream lines of a multi-stream test, the final sender/receiver summary)."""
    m = _INTERVAL.match(line.strip())
    if m is None or (m["id"] == "SUM") != (streams > 1):
        return None
    rest = m["rest"]
    if "sender" in rest or "receiver" in rest:
        return None
    start, end = float(m["start"]), float(m["end"])
    if end <= start:
        return None
    first = rest.split()[:1]
    retransmits = int(first[0]) if first and first[0].isdigit() else None
    return Interval(start, end, float(m["rate"]) * _UNITS[m["unit"]], retransmits)


@dataclass(frozen=True)
class Detector:
    tolerance: float = 0.02
    window_rtts: float = 4.0
    min_window_seconds: float = 0.5
    min_seconds: float = 1.0

    @classmethod
    def of(cls, s: SteadyStateSettings) -> Detector:
        return cls(s.tolerance, s.window_rtts, s.min_window_seconds, s.min_seconds)

    def window(self, rtt_seconds: float | None) -> float:
        return max(self.min_window_seconds, self.window_rtts * (rtt_seconds or 0.0))

    def rate(self, intervals: list[Interval], rtt_seconds: float | None, final: bool = False) -> float | None:
        """The converged rate (bits/s) of a test so far, or None while it has not converged.
        With `final`, the test has ended: the mean of its last two windows, converged or not."""
        if not intervals:
            return None
        w = self.window(rtt_seconds)
        end = intervals[-1].end
        if end < max(self.min_seconds, 2 * w) and not final:
            return None
        recent = mean_rate(intervals, end - w, end)
        earlier = mean_rate(intervals, end - 2 * w, end - w)
        if recent is None or earlier is None:
            return recent if final else None
        if final:
            return (recent + earlier) / 2
        # Nothing moving is no steady rate: a test whose data has not started (its server still busy
        # with another client: only the control connection's few bytes delivered) runs on to its end.
        if min(recent, earlier) > 0 and abs(recent - earlier) <= self.tolerance * max(recent, earlier):
            return (recent + earlier) / 2
        return None

    def replay(self, intervals: list[Interval], rtt_seconds: float | None) -> tuple[float, float] | None:
        """(seconds, rate) at which a test with these intervals would have been stopped, or
        None if it never converges: the prober's decision, replayed on a recorded trace."""
        for n in range(1, len(intervals) + 1):
            rate = self.rate(intervals[:n], rtt_seconds)
            if rate is not None:
                return intervals[n - 1].end, rate
        return None


def mean_rate(intervals: list[Interval], start: float, end: float) -> float | None:
    """Time-weighted mean rate of the intervals (or their parts) between start and end;
    None when they cover less than half of it."""
    bits = seconds = 0.0
    for i in intervals:
        overlap = min(i.end, end) - max(i.start, start)
        if overlap > 0:
            bits += i.bits_per_second * overlap
            seconds += overlap
    return bits / seconds if seconds > 0.5 * (end - start) else None


def delivered_bytes(sockets: Iterable[SocketBytes], direction: str) -> int:
    """Bytes the test's sockets delivered so far: acknowledged by the peer ("send"), or
    received from it ("receive")."""
    return sum(s.acked if direction == "send" else s.received for s in sockets)


def wire_bytes(sockets: Iterable[SocketBytes], direction: str) -> int:
    """Bytes the test's sockets put on the wire so far (retransmissions included), or received."""
    return sum(s.sent if direction == "send" else s.received for s in sockets)


def limited_shares(sockets: Iterable[SocketBytes]) -> tuple[float, float] | None:
    """What held the test's senders back so far: the shares of their sending time (tcpi_busy_time)
    with the receiver's advertised window full (tcpi_rwnd_limited), and with the send buffer full
    and the sender waiting to write (tcpi_sndbuf_limited); None before any sending. In the default
    lab's demo, the one-stream tests on the 74 ms paths (bound by a 4 MiB send buffer) read 8-10%
    of send buffer and no receive window, and every other test 0 of both."""
    sockets = list(sockets)
    busy = sum(s.busy_us for s in sockets)
    if busy <= 0:
        return None
    return sum(s.rwnd_limited_us for s in sockets) / busy, sum(s.sndbuf_limited_us for s in sockets) / busy


# A socket that moved less than this is the test's control connection, not one of its streams.
STREAM_BYTES = 1 << 16


def sender_rtt(sockets: Iterable[SocketBytes]) -> float | None:
    """The mean smoothed RTT (seconds) the test's sending streams see now (tcpi_rtt): the path's
    RTT with the test's own queue in it; None before a stream has sent. A rate below a window's
    bound comes from less in flight or from a longer RTT: rate x RTT tells which."""
    rtts = [s.rtt_us for s in sockets if s.acked >= STREAM_BYTES and s.rtt_us > 0]
    return sum(rtts) / len(rtts) / 1e6 if rtts else None


def delivered_intervals(samples: list[tuple[float, int]]) -> list[Interval]:
    """Intervals between successive (seconds, bytes delivered) samples, from the last sample
    before the first delivered byte (the test's start)."""
    first = next((k for k, (_, n) in enumerate(samples) if n > 0), len(samples))
    kept = samples[max(0, first - 1) :]
    if len(kept) < 2:
        return []
    t0 = kept[0][0]
    return [
        Interval(ta - t0, tb - t0, (b - a) * 8 / (tb - ta))
        for (ta, a), (tb, b) in itertools.pairwise(kept)
        if tb > ta and b >= a
    ]
