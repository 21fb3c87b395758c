"""Every result and count of one exporter, in one place. The probers and the throughput
turns write here (through the sinks below); the collector (collector.py) reads it at
scrape time. Writes happen on the event loop; reads on the render thread copy each
dict first (one C-level copy under the GIL, so never a dict changed during iteration)."""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddsketch import DDSketch

from .limits import Expected
from .probes import Reason, ThroughputResult

# RTT quantiles: exact to RELATIVE_ACCURACY of the value (DDSketch), over a window that
# slides in steps of WINDOW_SECONDS / WINDOW_STEPS.
QUANTILES = (0.5, 0.9, 0.99)
RELATIVE_ACCURACY = 0.002
WINDOW_SECONDS, WINDOW_STEPS = 300.0, 10
STATES = ("idle", "loaded")  # loaded: this host or the peer may be in a throughput test

UDP_COUNTS = ("sent", "received", "lost", "duplicate", "reordered", "late")

TestKey = tuple[str, str, str, str]  # peer, protocol, streams, direction


class WindowedQuantiles:
    """RTT samples of one path: quantiles over the last WINDOW_SECONDS (a ring of DDSketch
    sketches, one per step, merged at scrape time), and the cumulative count and sum."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # observe() on the event loop, quantiles() on the render thread
        self.steps: dict[int, DDSketch] = {}  # step number (time // step length) -> sketch
        self.count = 0
        self.total = 0.0

    def observe(self, value: float, now: float) -> None:
        step = int(now // (WINDOW_SECONDS / WINDOW_STEPS))
        with self._lock:
            sketch = self.steps.get(step)
            if sketch is None:
                sketch = self.steps[step] = DDSketch(relative_accuracy=RELATIVE_ACCURACY)
                for old in [k for k in self.steps if k <= step - WINDOW_STEPS]:
                    del self.steps[old]
            sketch.add(value)
            self.count += 1
            self.total += value

    def quantiles(self, now: float) -> dict[float, float]:
        """Each of QUANTILES over the window ending now; empty when the window has no sample."""
        step = int(now // (WINDOW_SECONDS / WINDOW_STEPS))
        window = DDSketch(relative_accuracy=RELATIVE_ACCURACY)
        with self._lock:
            for k, sketch in self.steps.items():
                if step - WINDOW_STEPS < k <= step:
                    window.merge(sketch)
        if window.count == 0:
            return {}
        return _quantiles(window, QUANTILES)


def _quantiles(sketch: DDSketch, qs: tuple[float, ...]) -> dict[float, float]:
    """Quantiles as the probes' own summary (probes/report.py) takes them: linear
    interpolation between the two closest ranks, each read from the sketch's bins.

    One pass over the bins for all of them (DDSketch's own lookup walks the bins in
    Python once per call). It reads the sketch's store and mapping, which are private:
    the ddsketch version is pinned for that reason."""
    store, mapping = sketch._store, sketch._mapping
    below = sketch._zero_count + sketch._negative_store.count  # RTTs are positive: both 0
    running = list(itertools.accumulate(store.bins))

    def at(rank: int) -> float:  # the sample of this rank: in the first bin whose running count exceeds it
        i = min(bisect.bisect_right(running, rank - below), len(running) - 1)
        return float(mapping.value(i + store.offset))

    last = int(sketch.count) - 1
    out = {}
    for q in qs:
        rank = q * last
        lo, hi = math.floor(rank), math.ceil(rank)
        low = at(lo)
        out[q] = low if hi == lo else low + (at(hi) - low) * (rank - lo)
    return out


@dataclass
class Store:
    clock: Callable[[], float] = time.time
    throughput: dict[TestKey, ThroughputResult] = field(default_factory=dict)
    expected: dict[TestKey, Expected] = field(default_factory=dict)
    runs: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # probe, peer, result
    last_success: dict[tuple[str, str], float] = field(default_factory=dict)  # probe, peer
    bytes_sent: Counter[tuple[str, str]] = field(default_factory=Counter)  # probe, peer
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)  # peer, reason
    rtt: dict[tuple[str, str, str], WindowedQuantiles] = field(default_factory=dict)  # peer, protocol, state
    # "idle" or "loaded" for a peer at a time: whether this host or the peer may be in a
    # throughput test (set by the exporter from the schedule; see Schedule.busy).
    load_state: Callable[[str, float], str] = lambda peer, now: "idle"
    # peer, state ("idle"/"loaded" when the packet was counted) -> UDP_COUNTS
    udp: dict[tuple[str, str], Counter[str]] = field(default_factory=dict)
    udp_jitter: dict[str, float] = field(default_factory=dict)
    flows_failing: dict[tuple[str, str], int] = field(default_factory=dict)  # peer, protocol
    worst_flow_loss: dict[str, float] = field(default_factory=dict)  # peer (udp)
    lost_by_direction: dict[str, tuple[int, int]] = field(default_factory=dict)  # peer -> forward, reverse
    # peer, IP size -> (carried by the last probe, when a probe of it was last carried)
    mtu: dict[tuple[str, int], tuple[bool, float | None]] = field(default_factory=dict)
    responder_requests: Counter[tuple[str, str]] = field(default_factory=Counter)  # responder, result
    schedule_turns: int = 0
    # When the last turn began (the exporter's start until the first): None when this host runs no throughput tests.
    last_turn: float | None = None
    turn_errors: Counter[str] = field(default_factory=Counter)  # reason
    # ENA allowance counters that rose during each test's last run (empty: none rose); absent
    # for tests run where the counters do not exist.
    allowance_rises: dict[TestKey, dict[str, int]] = field(default_factory=dict)
    iperf3_server_up: bool = False
    iperf3_server_restarts: int = 0
    reloads: Counter[str] = field(default_factory=Counter)  # success, failure
    last_reload_ok: bool = True

    def forget(self, peers: set[str]) -> None:
        """Drop what was measured for peers no longer probed (a reload), so that /metrics stops
        showing them."""
        tables: list[tuple[dict[Any, Any], Callable[[Any], str]]] = [
            *((t, lambda key: key[0]) for t in (self.throughput, self.expected, self.skipped, self.rtt, self.udp,
                                                 self.flows_failing, self.mtu, self.allowance_rises)),
            *((t, lambda key: key) for t in (self.udp_jitter, self.worst_flow_loss, self.lost_by_direction)),
            *((t, lambda key: key[1]) for t in (self.runs, self.last_success, self.bytes_sent)),  # (probe, peer, ...)
        ]  # fmt: skip
        for table, peer_of in tables:
            for key in [k for k in table if peer_of(k) not in peers]:
                del table[key]

    # --- writers
    def success(self, probe: str, peer: str) -> None:
        self.runs[probe, peer, "ok"] += 1
        self.last_success[probe, peer] = self.clock()

    def failure(self, probe: str, peer: str, reason: Reason) -> None:
        self.runs[probe, peer, reason] += 1

    def observe_rtt(self, peer: str, protocol: str, seconds: float) -> None:
        now = self.clock()
        key = (peer, protocol, self.load_state(peer, now))
        window = self.rtt.get(key)
        if window is None:
            window = self.rtt[key] = WindowedQuantiles()
        window.observe(seconds, now)

    def record_throughput(self, key: TestKey, result: ThroughputResult) -> None:
        self.throughput[key] = result
        self.bytes_sent["throughput", key[0]] += result.moved_bytes()
        self.success("throughput", key[0])

    def count_request(self, responder: str, result: str, n: int = 1) -> None:
        self.responder_requests[responder, result] += n

    def set_iperf3_up(self, up: bool) -> None:
        self.iperf3_server_up = up

    def iperf3_restarted(self) -> None:
        self.iperf3_server_restarts += 1

    def rtt_sink(self, peer: str, size: int) -> RttSink:
        return RttSink(self, peer, size)

    def echo_sink(self, peer: str) -> EchoSink:
        return EchoSink(self, peer)

    def mtu_sink(self, peer: str) -> MtuSink:
        return MtuSink(self, peer)


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

    def flows_failing(self, count: int) -> None:
        self.store.flows_failing[self.peer, "tcp"] = count


class EchoSink:
    """UDP echo outcomes of one peer (probes.base.EchoSink)."""

    def __init__(self, store: Store, peer: str):
        self.store, self.peer = store, peer

    def _count(self, what: str, age: float = 0.0) -> None:
        # Loss under this host's or the peer's own throughput test is self-inflicted: kept apart,
        # by when the packet was sent (`age` seconds ago), not when its timeout ran out.
        state = self.store.load_state(self.peer, self.store.clock() - age)
        self.store.udp.setdefault((self.peer, state), Counter())[what] += 1

    def sent(self, size: int) -> None:
        self._count("sent")
        self.store.bytes_sent["loss", self.peer] += size

    def received(self, rtt: float) -> None:
        self._count("received")
        self.store.observe_rtt(self.peer, "udp", rtt)
        self.store.success("loss", self.peer)

    def lost(self, age: float) -> None:
        self._count("lost", age)
        self.store.failure("loss", self.peer, "timeout")

    def duplicate(self) -> None:
        self._count("duplicate")

    def reordered(self) -> None:
        self._count("reordered")

    def late(self) -> None:
        self._count("late")

    def jitter(self, seconds: float) -> None:
        self.store.udp_jitter[self.peer] = seconds

    def failure(self, reason: Reason) -> None:
        self.store.failure("loss", self.peer, reason)

    def flows_failing(self, count: int, worst_loss_ratio: float) -> None:
        self.store.flows_failing[self.peer, "udp"] = count
        self.store.worst_flow_loss[self.peer] = worst_loss_ratio

    def lost_by_direction(self, forward: int, reverse: int) -> None:
        self.store.lost_by_direction[self.peer] = (forward, reverse)


class MtuSink:
    """Path MTU outcomes of one peer (probes.base.MtuSink)."""

    def __init__(self, store: Store, peer: str):
        self.store, self.peer = store, peer

    def mtu(self, size: int, carried: bool, reason: Reason | None) -> None:
        _, last = self.store.mtu.get((self.peer, size), (False, None))
        if carried:
            self.store.success("mtu", self.peer)
            last = self.store.clock()
        else:
            self.store.failure("mtu", self.peer, reason or "error")
        self.store.mtu[self.peer, size] = (carried, last)
