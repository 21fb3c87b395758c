"""The throughput room: the last result of every test, what it should reach, the ENA
allowance counters that rose during it, and the tests skipped."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, MutableMapping
from typing import Any, NamedTuple

from prometheus_client.core import Metric

from .. import ena
from ..config import Config
from ..limits import Expected
from ..probes import Reason, ThroughputResult
from .common import TEST, Room, Scope, TestKey, counter, gauge
from .outcomes import Ledger

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
}  # fmt: skip


def _values(r: ThroughputResult) -> tuple[float | None, ...]:
    """The result's value for each of RESULT_FAMILIES, in order (None: the test does not measure it)."""
    converged = None if r.converged is None else float(r.converged)
    return (r.receiver_bytes_per_second, r.sender_bytes_per_second, r.retransmits, r.udp_loss_ratio,
            r.jitter_seconds, r.timestamp, r.duration_seconds + r.omit_seconds, converged,
            r.receive_window_limited_ratio, r.send_buffer_limited_ratio, r.sender_rtt_seconds)  # fmt: skip


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
        self.skipped: Counter[SkipKey] = Counter()

    def tables(self) -> list[MutableMapping[Any, Any]]:
        return [self.results, self.previous, self.expected, self.allowance_rises, self.skipped]

    # --- writers
    def record(self, key: TestKey, result: ThroughputResult) -> None:
        if self.admits(key.peer):
            if key in self.results:
                self.previous[key] = self.results[key].receiver_bytes_per_second
            self.results[key] = result
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

    def skip(self, peer: str, reason: str) -> None:
        if self.admits(peer):
            self.skipped[SkipKey(peer, reason)] += 1

    def has_result(self, key: TestKey) -> bool:
        return key in self.results

    # --- metrics
    def collect(self) -> Iterator[Metric]:
        scope = self.scope
        yield from self._results(scope)
        yield from self._expected(scope)
        yield self._rises(scope)
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
