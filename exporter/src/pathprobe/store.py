"""Every result and count of one exporter, in one place. The probers and the throughput
turns write here (through the sinks below); the collector (collector.py) reads it at
scrape time. Writes happen on the event loop; reads on the render thread copy each
dict first (one C-level copy under the GIL, so never a dict changed during iteration)."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from .limits import Expected
from .probes import Reason, ThroughputResult

# From tens of microseconds (same zone) to seconds (a path in trouble), denser
# where inter-region RTTs live (1-100 ms: steps of 20-30%). Every bucket costs
# a series per peer and protocol, so this is a compromise with scrape size.
RTT_BUCKETS = (
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.010, 0.0125, 0.015,
    0.020, 0.025, 0.030, 0.040, 0.050, 0.060, 0.080, 0.100, 0.150, 0.200,
    0.300, 0.500, 1.0, 2.5, 5.0,
)  # fmt: skip

UDP_COUNTS = ("sent", "received", "lost", "duplicate", "reordered", "late")

TestKey = tuple[str, str, str, str]  # peer, protocol, streams, direction


@dataclass
class Histogram:
    """Counts per RTT_BUCKETS bucket (not cumulative; the last one is +Inf) and the sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(RTT_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(RTT_BUCKETS, value)] += 1
        self.total += value


@dataclass
class Store:
    clock: Callable[[], float] = time.time
    throughput: dict[TestKey, ThroughputResult] = field(default_factory=dict)
    expected: dict[TestKey, Expected] = field(default_factory=dict)
    runs: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # probe, peer, result
    last_success: dict[tuple[str, str], float] = field(default_factory=dict)  # probe, peer
    bytes_sent: Counter[tuple[str, str]] = field(default_factory=Counter)  # probe, peer
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)  # peer, reason
    rtt: dict[tuple[str, str], Histogram] = field(default_factory=dict)  # peer, protocol
    udp: dict[str, Counter[str]] = field(default_factory=dict)  # peer -> UDP_COUNTS
    udp_jitter: dict[str, float] = field(default_factory=dict)
    responder_requests: Counter[tuple[str, str]] = field(default_factory=Counter)  # responder, result
    schedule_turns: int = 0
    turn_errors: Counter[str] = field(default_factory=Counter)  # reason
    iperf3_server_up: bool = False
    iperf3_server_restarts: int = 0

    # --- writers
    def success(self, probe: str, peer: str) -> None:
        self.runs[probe, peer, "ok"] += 1
        self.last_success[probe, peer] = self.clock()

    def failure(self, probe: str, peer: str, reason: Reason) -> None:
        self.runs[probe, peer, reason] += 1

    def observe_rtt(self, peer: str, protocol: str, seconds: float) -> None:
        hist = self.rtt.get((peer, protocol))
        if hist is None:
            hist = self.rtt[peer, protocol] = Histogram()
        hist.observe(seconds)

    def record_throughput(self, key: TestKey, result: ThroughputResult) -> None:
        self.throughput[key] = result
        self.bytes_sent["throughput", key[0]] += result.moved_bytes()
        self.success("throughput", key[0])

    def count_request(self, responder: str, result: str) -> None:
        self.responder_requests[responder, result] += 1

    def set_iperf3_up(self, up: bool) -> None:
        self.iperf3_server_up = up

    def iperf3_restarted(self) -> None:
        self.iperf3_server_restarts += 1

    def rtt_sink(self, peer: str, size: int) -> RttSink:
        return RttSink(self, peer, size)

    def echo_sink(self, peer: str) -> EchoSink:
        return EchoSink(self, peer)


class RttSink:
    """TCP request/response outcomes of one peer (probes.base.RttSink)."""

    def __init__(self, store: Store, peer: str, size: int):
        self.store, self.peer, self.size = store, peer, size

    def rtt(self, seconds: float) -> None:
        self.store.observe_rtt(self.peer, "tcp", seconds)
        self.store.bytes_sent["rtt", self.peer] += self.size
        self.store.success("rtt", self.peer)

    def failure(self, reason: Reason) -> None:
        self.store.failure("rtt", self.peer, reason)


class EchoSink:
    """UDP echo outcomes of one peer (probes.base.EchoSink)."""

    def __init__(self, store: Store, peer: str):
        self.store, self.peer = store, peer
        self.counts = store.udp.setdefault(peer, Counter())

    def sent(self, size: int) -> None:
        self.counts["sent"] += 1
        self.store.bytes_sent["loss", self.peer] += size

    def received(self, rtt: float) -> None:
        self.counts["received"] += 1
        self.store.observe_rtt(self.peer, "udp", rtt)
        self.store.success("loss", self.peer)

    def lost(self) -> None:
        self.counts["lost"] += 1
        self.store.failure("loss", self.peer, "timeout")

    def duplicate(self) -> None:
        self.counts["duplicate"] += 1

    def reordered(self) -> None:
        self.counts["reordered"] += 1

    def late(self) -> None:
        self.counts["late"] += 1

    def jitter(self, seconds: float) -> None:
        self.store.udp_jitter[self.peer] = seconds

    def failure(self, reason: Reason) -> None:
        self.store.failure("loss", self.peer, reason)
