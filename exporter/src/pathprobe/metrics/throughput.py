"""The throughput room: the last result of every test, what it should reach, the ENA
allowance counters that rose during it, and the tests skipped."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Iterator, MutableMapping
from typing import Any, NamedTuple

from prometheus_client.core import Metric

from .. import ena, ends
from ..config import Config
from ..keys import TestKey
from ..limits import Expected
from ..probes import Reason, ThroughputResult
from .common import TEST, Room, Scope, counter, gauge
from .outcomes import Ledger

log = logging.getLogger(__name__)

CACHED = "Results are cached from the last completed test; see the matching _timestamp_seconds."


# The metrics of the last result of each test, by name: their help text.
RESULT_FAMILIES = {
    "pathprobe_throughput_bytes_per_second":
        "Receiver-side throughput (payload, after headers) of the last completed iperf3 test. " + CACHED,
    "pathprobe_throughput_sender_bytes_per_second":
        "Sender-side throughput of the last completed iperf3 test. " + CACHED,
    "pathprobe_throughput_retransmits": "TCP retransmits during the last completed test (sender side). " + CACHED,
    "pathprobe_throughput_udp_loss_ratio":
        "Share of UDP datagrams lost in the last UDP throughput test (0-1); measures the receiver as much as the "
        "path at high rates. " + CACHED,
    "pathprobe_throughput_udp_jitter_seconds": "Receiver-side jitter of the last UDP throughput test. " + CACHED,
    "pathprobe_throughput_last_test_timestamp_seconds": "Unix time at which the last completed throughput test ended.",
    "pathprobe_throughput_test_duration_seconds":
        "How long the last completed test ran (omitted seconds included): a steady-state test stops once its rate "
        "has settled.",
    "pathprobe_throughput_converged":
        "1 when the last steady-state test stopped at a settled rate, 0 when it ran to its maximum (its rate is then "
        "that of its last seconds). Absent for fixed-length tests.",
    "pathprobe_throughput_receive_window_limited_ratio":
        "Share of the last send test's sending time (tcp_info busy time) with the receiver's advertised window "
        "full (0-1). Steady-state TCP send tests only. " + CACHED,
    "pathprobe_throughput_send_buffer_limited_ratio":
        "Share of the last send test's sending time with this host's send buffer full, the sender waiting to "
        "write (0-1). Steady-state TCP send tests only. " + CACHED,
    "pathprobe_throughput_sender_rtt_seconds":
        "Mean over the last TCP test of its sending streams' smoothed RTT (tcp_info; iperf3's mean_rtt for a "
        "fixed-length test): the path's RTT with the test's own queue in it; the rate times it is what the test kept "
        "in flight. Absent where not reported (a steady-state receive test). " + CACHED,
    "pathprobe_throughput_udp_receiver_dropped_datagrams":
        "Datagrams the receiving host dropped for a full UDP socket buffer during the last UDP test (its "
        "RcvbufErrors): loss of the receiver, not of the path. Absent where the receiver's end is not known. " + CACHED,
    "pathprobe_throughput_udp_path_loss_ratio":
        "The last UDP test's loss less what the receiving host dropped itself (0-1): the path's share. Absent where "
        "the receiver's drops are not known. " + CACHED,
}  # fmt: skip
END = [*TEST, "end"]
# Each end's figures (ends.EndFigures) by metric name: their help text.
END_FAMILIES = {
    "pathprobe_throughput_end_runnable_ratio":
        "Share of its busiest second that the busiest thread of this end's iperf3 was on a CPU or waiting for one "
        "(schedstat), in the last test: at 0.9 and above the CPU bound the test (one core's worth of work, a "
        "cgroup quota, or other load), not the path. " + CACHED,
    "pathprobe_throughput_end_wait_ratio":
        "Share of its busiest second that the busiest thread of this end's iperf3 waited on a run queue for a CPU "
        "(schedstat), in the last test: at 0.5 and above the CPU held the test back (a cgroup quota, other load), "
        "though the thread slept between. " + CACHED,
    "pathprobe_throughput_end_cpu_ratio":
        "CPU time of this end's iperf3 in its busiest second of the last test, over what it could use "
        "(pathprobe_throughput_end_usable_cpus). " + CACHED,
    "pathprobe_throughput_end_usable_cpus":
        "CPUs this end's iperf3 could use in the last test: its stream threads (one per process before iperf3 "
        "3.16, one per stream from 3.16), the CPUs it may run on and its cgroup's quota, the fewest. " + CACHED,
    "pathprobe_throughput_end_softirq_ratio":
        "Share of its busiest second that this end's busiest core spent in softirq (the kernel's packet processing) "
        "during the last test: at 0.9 and above it bound the test. " + CACHED,
    "pathprobe_throughput_end_steal_ratio":
        "Share of this end's host's CPU time its hypervisor took (steal, /proc/stat) over the last test: at 0.1 "
        "and above the host, not the path, bound the test. " + CACHED,
}  # fmt: skip


def _end_values(e: ends.EndFigures) -> tuple[float | None, ...]:
    """An end's value for each of END_FAMILIES, in order (None: not known)."""
    return (e.runnable_ratio, e.wait_ratio, e.cpu_ratio, e.usable_cpus, e.softirq_ratio, e.steal_ratio)


def _values(r: ThroughputResult) -> tuple[float | None, ...]:
    """The result's value for each of RESULT_FAMILIES, in order (None: the test does not measure it)."""
    converged = None if r.converged is None else float(r.converged)
    return (
        r.receiver_bytes_per_second,
        r.sender_bytes_per_second,
        r.retransmits,
        r.udp_loss_ratio,
        r.jitter_seconds,
        r.timestamp,
        r.duration_seconds + r.omit_seconds,
        converged,
        r.receive_window_limited_ratio,
        r.send_buffer_limited_ratio,
        r.sender_rtt_seconds,
        r.udp_receiver_drops() if r.protocol == "udp" else None,
        r.udp_path_loss_ratio(),
    )


class SkipKey(NamedTuple):
    peer: str
    reason: str  # budget, slot_over


class ThroughputRoom(Room):
    def __init__(self, cfg: Config, ledger: Ledger):
        super().__init__(cfg)
        self.ledger = ledger
        self.results: dict[TestKey, ThroughputResult] = {}
        # The receiver-side rate of the result before each test's last: the alerts want two tests in a row.
        self.previous: dict[TestKey, float] = {}
        self.expected: dict[TestKey, Expected] = {}
        # ENA allowance counters that rose during each test's last run (empty: none rose); absent
        # for tests run where the counters do not exist.
        self.allowance_rises: dict[TestKey, dict[str, int]] = {}
        # The share of the SRD-eligible packets that went over SRD during each test's last run
        # (ENA Express); absent where the driver has no ENA Express counters.
        self.srd_shares: dict[TestKey, float] = {}
        self.skipped: Counter[SkipKey] = Counter()

    def tables(self) -> list[MutableMapping[Any, Any]]:
        return [self.results, self.previous, self.expected, self.allowance_rises, self.srd_shares, self.skipped]

    # --- writers
    def record(self, key: TestKey, result: ThroughputResult) -> None:
        if self.admits(key.peer):
            if key in self.results:
                self.previous[key] = self.results[key].receiver_bytes_per_second
            # Without iperf3's intervals: they are the evidence store's (evidence.py), not /metrics'.
            self.results[key] = dataclasses.replace(result, intervals=[])
            self.ledger.moved(key.peer, result.moved_bytes())
            self.ledger.success(key.peer)

    def failed(self, peer: str, reason: Reason) -> None:
        self.ledger.failure(peer, reason)

    def expect(self, key: TestKey, expected: Expected) -> None:
        if self.admits(key.peer):
            self.expected[key] = expected

    def allowances_rose(self, key: TestKey, rises: dict[str, int]) -> None:
        if self.admits(key.peer):
            self.allowance_rises[key] = rises

    def srd_share(self, key: TestKey, share: float) -> None:
        if self.admits(key.peer):
            self.srd_shares[key] = share

    def skip(self, peer: str, reason: str) -> None:
        if self.admits(peer):
            self.skipped[SkipKey(peer, reason)] += 1

    def expect_unmeasured(self, key: TestKey, expected: Expected) -> None:
        """An expected value from the RTT window alone, for a test without a result yet: a test's
        result keeps the value rated with it, so that their ratio compares the test with its own."""
        if key not in self.results:
            self.expect(key, expected)

    # --- metrics
    def collect(self) -> Iterator[Metric]:
        scope = self.scope
        yield from self._results(scope)
        yield from self._ends(scope)
        yield from self._expected(scope)
        yield self._rises(scope)
        srd = gauge(
            "pathprobe_throughput_srd_share_during_last_test",
            "Share of the packets eligible for ENA Express's SRD that went over it during the last run of the test "
            "(0-1, ethtool -S ena_srd_tx_pkts over ena_srd_eligible_tx_pkts; the whole interface's): below 1 on a path "
            "expected at ENA Express's 25 Gbit/s per flow, SRD fell back to ENA's 5. Absent without the counters.",
            TEST,
        )
        for labels, key, share in scope.entries(self.srd_shares):
            srd.add_metric([*labels, *key.spec], share)
        yield srd
        skipped = counter(
            "pathprobe_throughput_skipped", "Scheduled throughput tests not run, by reason.", ["peer", "reason"]
        )
        for (peer, reason), n in dict(self.skipped).items():
            skipped.add_metric([peer, reason], n)
        yield skipped

    def _results(self, scope: Scope) -> Iterator[Metric]:
        families = [gauge(name, doc, TEST) for name, doc in RESULT_FAMILIES.items()]
        for peer, key, result in scope.entries(self.results):
            for family, value in zip(families, _values(result), strict=True):
                if value is not None:
                    family.add_metric([*peer, *key.spec], value)
        previous = gauge(
            "pathprobe_throughput_previous_bytes_per_second",
            "Receiver-side throughput of the test before the last completed one (absent until a test's second "
            "result): with pathprobe_throughput_bytes_per_second, two tests in a row. " + CACHED,
            TEST,
        )
        for peer, key, rate in scope.entries(self.previous):
            previous.add_metric([*peer, *key.spec], rate)
        yield from [*families, previous]

    def _ends(self, scope: Scope) -> Iterator[Metric]:
        families = [gauge(name, doc, END) for name, doc in END_FAMILIES.items()]
        info = gauge(
            "pathprobe_throughput_end_info",
            "Each end of the last test: its iperf3's version and how many iperf3 processes carried the test "
            "(value 1; absent for an end that reported nothing).",
            [*END, "iperf3_version", "processes"],
        )
        bound = gauge(
            "pathprobe_throughput_host_bound_info",
            "What of its own ends bound the last test (value 1): receiver_drops, receiver_cpu or sender_cpu (it "
            "measured a host, not the path: the path alerts leave it out; `remedy` says what would lift it), none "
            "(both ends had headroom), unknown (an end's figures are missing: an older peer).",
            [*TEST, "limit", "remedy"],
        )
        for peer, key, result in scope.entries(self.results):
            labels = [*peer, *key.spec]
            bound.add_metric([*labels, result.bound, result.remedy], 1)
            for end_name, end in (("sender", result.sender_end), ("receiver", result.receiver_end)):
                if end is None:
                    continue
                info.add_metric([*labels, end_name, end.iperf3_version or "", str(end.processes)], 1)
                for family, value in zip(families, _end_values(end), strict=True):
                    if value is not None:
                        family.add_metric([*labels, end_name], value)
        yield from [*families, info, bound]

    def _expected(self, scope: Scope) -> Iterator[Metric]:
        expected = gauge(
            "pathprobe_throughput_expected_bytes_per_second",
            "Throughput (payload, after headers, as measured) the path should reach: the smallest applicable "
            "limit; `limit` names the one that binds.",
            [*TEST, "limit"],
        )
        peak = gauge(
            "pathprobe_throughput_expected_peak_bytes_per_second",
            "What the test may reach while the instances' network I/O credits last: the same limits with each "
            "instance's peak bandwidth instead of its baseline (context; alerts compare with the expected floor). "
            "`limit` names the one that binds.",
            [*TEST, "limit"],
        )
        window = gauge(
            "pathprobe_throughput_receive_window_bound_bytes_per_second",
            "Receive-window bound: the receiver's tcp_rmem max times the share TCP keeps in flight, over the RTT "
            "(median of the last 256 samples), times streams.",
            TEST,
        )
        for peer, key, e in scope.entries(self.expected):
            labels = [*peer, *key.spec]
            expected.add_metric([*labels, e.limit], e.bits_per_second / 8)
            peak.add_metric([*labels, e.peak_limit], e.peak_bits_per_second / 8)
            if "receive_window" in e.candidates:
                window.add_metric(labels, e.candidates["receive_window"] / 8)
        yield from (expected, peak, window)

    def _rises(self, scope: Scope) -> Metric:
        rises = gauge(
            "pathprobe_throughput_allowance_exceeded_during_last_test",
            "How much each ENA allowance counter (ethtool -S) rose during the last run of the test: above 0, the "
            "instance's allowance limited it, not the path. Absent where the counters do not exist.",
            [*TEST, "counter"],
        )
        for peer, key, rose in scope.entries(self.allowance_rises):
            for name in ena.ALLOWANCES:
                rises.add_metric([*peer, *key.spec, name], rose.get(name, 0))
        return rises


class TestRecorder:
    """Where one scheduled test's outcome goes (probes.throughput.ThroughputSink): the throughput
    room, and the log for a test that gave no result."""

    def __init__(self, room: ThroughputRoom, key: TestKey):
        self.room, self.key = room, key

    def result(self, result: ThroughputResult) -> None:
        self.room.record(self.key, result)
        if result.peer_report_rejected is not None:
            self.room.ledger.reject(self.key.peer, "report_rejected", result.peer_report_rejected)

    def failure(self, reason: Reason, detail: str) -> None:
        self.room.failed(self.key.peer, reason)
        log.info("throughput %s %s: %s: %s", self.key.peer, "/".join(self.key.spec), reason, detail)
