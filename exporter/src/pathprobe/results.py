"""Probe outcomes shared by the probes, the exporter and the command line."""

from __future__ import annotations

import errno
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# The `result` label of pathprobe_probe_runs_total; order is the documented one.
REASONS = ("ok", "busy", "timeout", "refused", "unreachable", "not_allowed", "error")
Reason = Literal["busy", "timeout", "refused", "unreachable", "not_allowed", "error"]


class ProbeFailure(Exception):
    """A probe that did not give a result, with the reason used as a metric label."""

    def __init__(self, reason: Reason, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason: Reason = reason
        self.detail = detail


def reason_of_oserror(exc: OSError) -> Reason:
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL):
        return "unreachable"
    return "error"


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Summary:
    """min/p50/mean/p99/max/stddev of a list of samples, in the samples' unit."""

    min: float
    p50: float
    mean: float
    p99: float
    max: float
    stddev: float

    @classmethod
    def of(cls, samples: list[float]) -> Summary | None:
        if not samples:
            return None
        s = sorted(samples)
        n = len(s)
        mean = sum(s) / n
        var = sum((x - mean) ** 2 for x in s) / n

        def q(p: float) -> float:
            # Linear interpolation between closest ranks.
            pos = p * (n - 1)
            lo = int(pos)
            hi = min(lo + 1, n - 1)
            return s[lo] + (s[hi] - s[lo]) * (pos - lo)

        return cls(s[0], q(0.5), mean, q(0.99), s[-1], var**0.5)


@dataclass
class RttReport:
    """What a one-shot RTT or UDP echo probe measured."""

    protocol: str
    interval_seconds: float
    size_bytes: int
    sent: int = 0
    received: int = 0
    lost: int = 0
    duplicates: int = 0
    reordered: int = 0
    late: int = 0
    jitter_seconds: float = 0.0
    rtts: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        summary = Summary.of(self.rtts)
        return {
            "protocol": self.protocol,
            "interval_seconds": self.interval_seconds,
            "size_bytes": self.size_bytes,
            "sent": self.sent,
            "received": self.received,
            "lost": self.lost,
            "loss_ratio": self.lost / self.sent if self.sent else None,
            "duplicates": self.duplicates,
            "reordered": self.reordered,
            "late": self.late,
            "jitter_seconds": self.jitter_seconds,
            "rtt_seconds": asdict(summary) if summary else None,
            "failures": self.failures,
        }


class ReportSink:
    """Collects one-shot probe outcomes into an RttReport (the exporter feeds metrics instead)."""

    def __init__(self, report: RttReport):
        self.r = report

    def rtt(self, seconds: float) -> None:
        self.r.sent += 1
        self.received(seconds)

    def sent(self, size: int) -> None:
        self.r.sent += 1

    def received(self, rtt: float) -> None:
        self.r.received += 1
        self.r.rtts.append(rtt)

    def lost(self) -> None:
        self.r.lost += 1

    def duplicate(self) -> None:
        self.r.duplicates += 1

    def reordered(self) -> None:
        self.r.reordered += 1

    def late(self) -> None:
        self.r.late += 1

    def jitter(self, seconds: float) -> None:
        self.r.jitter_seconds = seconds

    def failure(self, reason: str) -> None:
        self.r.failures[reason] = self.r.failures.get(reason, 0) + 1
        if self.r.protocol == "tcp":
            self.r.sent += 1
            self.r.lost += 1
