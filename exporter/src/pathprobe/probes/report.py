"""What a one-shot RTT or UDP echo probe measured (`pathprobe probe rtt|loss`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..clock import one_way_untrusted
from ..config import ClockSettings
from ..strict import default
from ..units import format_seconds
from .base import Reason, Rejection
from .echo import OneWay

# Why a run's one-way delays are withheld (clock.one_way_untrusted), for a reader.
ONE_WAY_UNTRUSTED = {
    "no_bound": "an end states no clock error bound (chronyd or ClockBound on both hosts, or --clock-error-bound "
    "here and on the responder)",
    "clocks_disagree": "the echoes put the clocks further apart than their bounds, or a delay came out negative",
    "bound_too_wide": "the two bounds added exceed the share of a direction's delay that clock.max_error_share allows",
}


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
    """Outcomes of a one-shot run (filled by ReportSink)."""

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
    flows_failing: int = 0
    worst_flow_loss_ratio: float = 0.0
    lost_forward: int = 0
    lost_reverse: int = 0
    rtts: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)  # fields of answers not taken (base.REJECTIONS)
    # UDP: the echoes' one-way delays, and what judging them takes (clock.one_way_untrusted).
    forward: list[float] = field(default_factory=list)
    reverse: list[float] = field(default_factory=list)
    own_bound: float | None = None  # this host's clock error bound, as the caller read it
    max_error_share: float = default(ClockSettings, "max_error_share")
    peer_bound: float | None = None  # the responder's, as its answers state it
    clocks_apart: float = 0.0
    negative: bool = False

    def one_way(self) -> dict[str, Any] | None:
        """The one-way delays (p50 etc. each way) with their error bound, or why they are withheld
        (`untrusted`); None for a TCP run."""
        if self.protocol != "udp":
            return None
        error = None if self.own_bound is None or self.peer_bound is None else self.own_bound + self.peer_bound
        forward, reverse = Summary.of(self.forward), Summary.of(self.reverse)
        medians = [s.p50 for s in (forward, reverse) if s]
        reason = one_way_untrusted(error, self.clocks_apart, self.negative, medians, self.max_error_share)
        trusted = not reason and forward is not None and reverse is not None
        return {
            "error_bound_seconds": error,
            "untrusted": reason or None,
            "forward_seconds": asdict(forward) if trusted and forward else None,
            "reverse_seconds": asdict(reverse) if trusted and reverse else None,
        }

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
            "flows_failing": self.flows_failing,
            "worst_flow_loss_ratio": self.worst_flow_loss_ratio,
            "lost_forward": self.lost_forward,
            "lost_reverse": self.lost_reverse,
            "rtt_seconds": asdict(summary) if summary else None,
            "failures": self.failures,
            "rejected": self.rejected,
            "one_way": self.one_way(),
        }


class ReportSink:
    """The sink (RttSink and EchoSink) of a one-shot run: collects outcomes into an RttReport."""

    def __init__(self, report: RttReport):
        self.r = report

    def rtt(self, seconds: float, age: float = 0.0) -> None:
        self.r.sent += 1
        self.received(seconds)

    def sent(self, size: int) -> None:
        self.r.sent += 1

    def received(
        self, rtt: float, age: float = 0.0, jitter: float | None = None, one_way: OneWay | None = None
    ) -> None:
        self.r.received += 1
        self.r.rtts.append(rtt)
        if jitter is not None:
            self.r.jitter_seconds = jitter
        if one_way is not None:
            self.r.peer_bound, self.r.clocks_apart = one_way.peer_bound, one_way.clocks_apart
            if one_way.forward < 0 or one_way.reverse < 0:
                self.r.negative = True
            else:
                self.r.forward.append(one_way.forward)
                self.r.reverse.append(one_way.reverse)

    def lost(self, age: float) -> None:
        self.r.lost += 1

    def duplicate(self) -> None:
        self.r.duplicates += 1

    def reordered(self) -> None:
        self.r.reordered += 1

    def late(self) -> None:
        self.r.late += 1

    def flows_failing(self, count: int, worst_loss_ratio: float = 0.0) -> None:
        self.r.flows_failing, self.r.worst_flow_loss_ratio = count, worst_loss_ratio

    def clock_offset(self, seconds: float) -> None:
        pass

    def marks(self, sent: int, forward: int, reverse: int | None) -> None:
        pass  # the exporter reports marks (pathprobe_dscp_received_info)

    def lost_by_direction(self, forward: int, reverse: int) -> None:
        self.r.lost_forward, self.r.lost_reverse = forward, reverse

    def clocks(self, peer_bound: float | None, clocks_apart: float) -> None:
        self.r.peer_bound, self.r.clocks_apart = peer_bound, clocks_apart

    def rejected(self, reason: Rejection, answered: bool = False) -> None:
        self.r.rejected[reason] = self.r.rejected.get(reason, 0) + 1
        if answered:  # an echo that came back: no loss, and no figure from it
            self.r.received += 1

    def failure(self, reason: Reason) -> None:
        self.r.failures[reason] = self.r.failures.get(reason, 0) + 1
        if self.r.protocol == "tcp":
            self.r.sent += 1
            self.r.lost += 1


def describe_one_way(one_way: dict[str, Any] | None) -> str:
    """A run's one-way delays (RttReport.one_way) in a line."""
    if not one_way:
        return "one-way delays: none (a TCP run)"
    if one_way["untrusted"]:
        return f"one-way delays withheld ({one_way['untrusted']}): {ONE_WAY_UNTRUSTED[one_way['untrusted']]}"
    f, fwd, rev = format_seconds, one_way["forward_seconds"], one_way["reverse_seconds"]
    return (
        f"one-way p50 forward {f(fwd['p50'])}, reverse {f(rev['p50'])} (p99 {f(fwd['p99'])}, {f(rev['p99'])}); "
        f"each within {f(one_way['error_bound_seconds'])}, both clocks' error bounds"
    )
