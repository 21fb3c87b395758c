"""What each throughput test should reach (limits.py's model applied to this host's
peers), and the RTT window that feeds the buffer bounds of that model."""

from __future__ import annotations

import statistics
from collections import deque

from .config import Config, Peer
from .keys import TestKey
from .limits import Expected, host_buffer_max, window_share
from .limits import expected as expected_of
from .metrics.throughput import ThroughputRoom
from .probe_settings import TestSpec
from .probes import Reason, ThroughputResult
from .probes.base import Rejection

# The buffer bounds use the median of the last WINDOW RTT samples, once there are MIN_SAMPLES.
WINDOW, MIN_SAMPLES = 256, 10


class RttWindow:
    """The last RTT samples of one peer (an RttSink: the exporter tees the RTT prober into it)."""

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=WINDOW)

    def rtt(self, seconds: float, age: float = 0.0) -> None:
        self.samples.append(seconds)

    def failure(self, reason: Reason) -> None:
        pass

    def flows_failing(self, count: int) -> None:
        pass

    def rejected(self, reason: Rejection) -> None:
        pass

    def median(self) -> float | None:
        return statistics.median(self.samples) if len(self.samples) >= MIN_SAMPLES else None


class ExpectedTracker:
    """Keeps the throughput room's expected values up to date: for every test at the start of each turn, and for
    a test again when its result is recorded. The buffer bounds take the median RTT of
    the window (the path's RTT just before the test) or, before the window has enough
    samples (a test in an exporter's first seconds), the RTT the test's senders saw: a
    result is never rated without an RTT when one was measured.

    A test's result and its expected value change together, so the ratio of the two on
    /metrics always compares one test with its own expectation."""

    def __init__(self, cfg: Config, room: ThroughputRoom):
        self.cfg, self.room = cfg, room
        self.rmem_max = cfg.tcp_rmem_max_bytes or host_buffer_max("rmem")
        self.wmem_max = cfg.tcp_wmem_max_bytes or host_buffer_max("wmem")
        self.share = cfg.tcp_window_share or window_share()
        self.windows = {p.name: RttWindow() for p in cfg.probed_peers}  # not one per member of a large mesh

    def rtt_median(self, peer: str) -> float | None:
        """The median of `peer`'s RTT window; None also for a peer this config does not probe (a turn
        of the schedule in force until a new member list's epoch can still name it)."""
        window = self.windows.get(peer)
        return window.median() if window is not None else None

    def rate_all(self, peer: Peer, keys: list[TestSpec]) -> None:
        """Expected values of tests that have no result yet, from the RTT window."""
        for key in keys:
            self.room.expect_unmeasured(TestKey.of(peer.name, key), self._expected(peer, key, None))

    def rate(self, peer: Peer, key: TestSpec, result: ThroughputResult | None) -> Expected:
        """The test's expected value, with its result (or without one), into the room; returned."""
        expected = self._expected(peer, key, result)
        self.room.expect(TestKey.of(peer.name, key), expected)
        return expected

    def _expected(self, peer: Peer, key: TestSpec, result: ThroughputResult | None) -> Expected:
        protocol, streams, direction = key
        rtt = self.rtt_median(peer.name) or (result.sender_rtt_seconds if result else None)
        if direction == "send":
            rmem, wmem = peer.tcp_rmem_max_bytes or self.rmem_max, self.wmem_max
        else:
            rmem, wmem = self.rmem_max, peer.tcp_wmem_max_bytes or self.wmem_max
        settings = self.cfg.throughput_for(peer)
        return expected_of(
            peer,
            self.cfg.host.instance_type,
            protocol,
            int(streams),
            rmem,
            rtt,
            settings.udp_bitrate,
            sender_wmem_max=wmem,
            share=self.share,
        )
