"""The host room: the exporter itself. Its byte budget, the schedule in force and its
turns, reloads, the responders and the iperf3 server, and the instance's ENA allowance
counters (read in the background: `ethtool -S` may take seconds, never in a scrape)."""

from __future__ import annotations

import bisect
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from .. import ena
from ..budget import Budget
from ..config import Config
from ..responders.iperf3 import RESTART_REASONS
from ..schedule import Timetable
from .common import counter, gauge, one

IPERF3_ADMISSIONS = ("ok", "not_allowed", "out_of_turn")  # responders/iperf3.py: every outcome from zero
# The event loop's lateness (seconds): a few milliseconds on a quiet host. Its peers wait a
# timeout more (RTT: 1 s) for an answer this host's kernel acknowledged, then count a timeout.
LATENESS_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5)


class HostRoom:
    def __init__(self, cfg: Config, timetable: Timetable, budget: Budget, clock: Callable[[], float] = time.time):
        self.budget, self.clock = budget, clock
        self.view = (cfg, timetable)  # one object: a render reads one config and its timetable
        # The ENA allowance counters and the interface they were read on; None: none on this host.
        self.allowances: tuple[str | None, dict[str, int]] | None = None
        self.reloads: Counter[str] = Counter()  # success, failure
        self.last_reload_ok = True
        self.reloads_dropping_most = 0  # reloads that left fewer than half the probed peers
        self.schedule_turns = 0
        # When the last turn began (the exporter's start until the first): None when this host runs no tests.
        self.last_turn: float | None = None
        self.turn_errors: Counter[str] = Counter()  # exception type
        self.responder_requests: Counter[tuple[str, str]] = Counter()  # responder, result
        self.iperf3_server_up = False
        self.iperf3_server_restarts: Counter[str] = Counter()  # by reason (responders.iperf3.RESTART_REASONS)
        self.passes_late = [0] * (len(LATENESS_BUCKETS) + 1)  # the pacer's passes by lateness bucket (+Inf last)
        self.passes_late_seconds = 0.0

    def use(self, cfg: Config, timetable: Timetable) -> None:
        self.view = (cfg, timetable)

    def describe(self) -> list[Metric]:
        return []

    # --- writers
    def read_allowances(self, interface: str | None, counters: dict[str, int] | None) -> None:
        self.allowances = None if counters is None else (interface, counters)

    def pass_late(self, seconds: float) -> None:
        self.passes_late[bisect.bisect_left(LATENESS_BUCKETS, seconds)] += 1
        self.passes_late_seconds += seconds

    def reloaded(self, ok: bool) -> None:
        self.reloads["success" if ok else "failure"] += 1
        self.last_reload_ok = ok

    def reload_dropped_most(self) -> None:
        self.reloads_dropping_most += 1

    def turns_expected(self) -> None:
        """This host has throughput tests to take: its last turn counts from now until the first."""
        if self.last_turn is None:
            self.last_turn = self.clock()

    def turn_taken(self) -> None:
        self.schedule_turns += 1
        self.last_turn = self.clock()

    def turn_failed(self, error: str) -> None:
        self.turn_errors[error] += 1

    def count_request(self, responder: str, result: str, n: int = 1) -> None:
        self.responder_requests[responder, result] += n

    def set_iperf3_up(self, up: bool) -> None:
        self.iperf3_server_up = up

    def iperf3_restarted(self, reason: str) -> None:
        self.iperf3_server_restarts[reason] += 1

    # --- metrics
    def collect(self) -> Iterator[Metric]:
        cfg, timetable = self.view
        yield from self._allowances()
        yield from self._budget(cfg)
        # The schedule in force; before the epoch of a fresh start, the one to come.
        sched = timetable.at(self.clock()) or timetable.current
        info = gauge(
            "pathprobe_schedule_info",
            "The mesh schedule this host derives (value 1); every host of a "
            "consistent mesh shows the same fingerprint.",
            ["fingerprint"],
        )
        info.add_metric([sched.fingerprint], 1)
        yield info
        yield one(
            GaugeMetricFamily,
            "pathprobe_schedule_epoch_timestamp_seconds",
            "When the newest member list's schedule takes (or took) effect: mesh.epoch, or the time of the "
            "reload that loaded it (0: at start).",
            timetable.epoch,
        )
        yield from self._reloads()
        yield one(
            GaugeMetricFamily, "pathprobe_schedule_members", "Hosts in the throughput schedule.", len(sched.members)
        )
        yield one(
            GaugeMetricFamily, "pathprobe_schedule_slot_seconds", "Length of one schedule slot.", sched.slot_seconds
        )
        yield one(
            GaugeMetricFamily,
            "pathprobe_schedule_rotation_seconds",
            "Time for every pair of hosts to meet once.",
            sched.rotation_seconds,
        )
        yield from self._turns()
        yield from self._responders(cfg)
        yield self._lateness()

    def _lateness(self) -> Metric:
        counts, total = list(self.passes_late), self.passes_late_seconds  # one copy: the loop goes on counting
        bounds = [*(f"{le:g}" for le in LATENESS_BUCKETS), "+Inf"]
        return HistogramMetricFamily(
            "pathprobe_event_loop_lateness_seconds",
            "How late the exporter's event loop ran the probes' timer passes; its responders answer as late: "
            "a busy host, not its paths.",
            buckets=list(zip(bounds, itertools.accumulate(counts), strict=True)),
            sum_value=total,
        )

    def _allowances(self) -> Iterator[Metric]:
        read = self.allowances
        if read is None:  # absent, not zero, where the ENA driver is not
            return
        interface, allowances = read
        family = counter(
            "pathprobe_ena_allowance_exceeded",
            "Packets the instance queued or dropped for exceeding an allowance (ENA driver, ethtool -S): "
            "bw_in/bw_out (bandwidth), pps, conntrack, linklocal.",
            ["interface", "counter"],
        )
        for name in ena.ALLOWANCES:
            if name in allowances:
                family.add_metric([interface or "", name], allowances[name])
        yield family
        yield from _express(interface or "", allowances)

    def _budget(self, cfg: Config) -> Iterator[Metric]:
        b = self.budget
        yield one(
            GaugeMetricFamily,
            "pathprobe_budget_remaining_bytes",
            "Bytes throughput tests may still move in the current budget period.",
            b.remaining(),
        )
        yield one(
            GaugeMetricFamily,
            "pathprobe_budget_limit_bytes",
            "Bytes throughput tests may move per period.",
            cfg.budget.daily_bytes,
        )
        yield one(
            CounterMetricFamily,
            "pathprobe_budget_save_failures",
            "Times the budget state file could not be written (the count goes on in memory; see the log).",
            b.save_failures,
        )
        yield one(
            GaugeMetricFamily,
            "pathprobe_budget_state_unusable",
            "1 when the budget state file was unusable at start, until the period it made count as spent "
            "ends (see the log).",
            1 if b.unusable() else 0,
        )
        yield one(
            GaugeMetricFamily,
            "pathprobe_budget_period_end_timestamp_seconds",
            "Unix time at which the current budget period ends.",
            b.period_end(),
        )

    def _reloads(self) -> Iterator[Metric]:
        reloads = counter(
            "pathprobe_config_reloads",
            "Config reloads (SIGHUP, POST /-/reload): failure keeps the running config.",
            ["result"],
        )
        for result in ("success", "failure"):
            reloads.add_metric([result], self.reloads[result])
        yield reloads
        yield one(
            GaugeMetricFamily,
            "pathprobe_config_last_reload_successful",
            "1 when the last reload applied its config (or none was asked for), 0 when it was refused.",
            float(self.last_reload_ok),
        )
        yield one(
            CounterMetricFamily,
            "pathprobe_config_reloads_dropping_most_peers",
            "Applied reloads that left fewer than half as many probed peers as before (more often a file "
            "cut short than a rollout).",
            self.reloads_dropping_most,
        )

    def _turns(self) -> Iterator[Metric]:
        yield one(
            CounterMetricFamily,
            "pathprobe_schedule_turns",
            "Client turns this host took in the schedule.",
            self.schedule_turns,
        )
        last_turn = self.last_turn
        if last_turn is not None:
            yield one(
                GaugeMetricFamily,
                "pathprobe_schedule_last_turn_timestamp_seconds",
                "Unix time at which this host's last throughput turn began (its start, before the first).",
                last_turn,
            )
        errors = counter(
            "pathprobe_schedule_turn_errors",
            "Throughput turns that ended on an unexpected error (logged), by exception type; the loop goes on.",
            ["reason"],
        )
        for reason, n in dict(self.turn_errors).items():
            errors.add_metric([reason], n)
        yield errors

    def _responders(self, cfg: Config) -> Iterator[Metric]:
        requests = counter(
            "pathprobe_responder_requests",
            "Connections (rr) or datagrams (echo) that reached a responder, by outcome.",
            ["responder", "result"],
        )
        counted = Counter(dict.fromkeys(IPERF3_ADMISSIONS if cfg.iperf3.admit != "anyone" else (), 0))
        for (responder, result), n in dict(self.responder_requests).items():
            if responder == "iperf3":
                counted[result] += n
            else:
                requests.add_metric([responder, result], n)
        for result, n in counted.items():
            requests.add_metric(["iperf3", result], n)
        yield requests
        admission = InfoMetricFamily(
            "pathprobe_iperf3_admission",
            "Whose tests this host's iperf3 server lets run (iperf3.admit): turn (a peer in its turn by "
            "the schedule), peers, or anyone (no check).",
        )
        admission.add_metric([], {"admit": cfg.iperf3.admit})
        yield admission
        yield one(
            GaugeMetricFamily,
            "pathprobe_iperf3_server_up",
            "1 while the supervised iperf3 server runs.",
            1 if self.iperf3_server_up else 0,
        )
        restarts = counter(
            "pathprobe_iperf3_server_restarts",
            "Times a supervised iperf3 server was restarted, by reason: it exited, it was stopped (SIGSTOP) for "
            "30 s, or the supervisor found it wedged (stalled_client: a client held in the handshake, or an "
            "admitted test without a data stream, for 10 s; client_gone: its client had no connection to it for "
            "6 s; overran: the test ran past iperf3.max_test_seconds).",
            ["reason"],
        )
        for reason, n in (dict.fromkeys(RESTART_REASONS, 0) | dict(self.iperf3_server_restarts)).items():
            restarts.add_metric([reason], n)
        yield restarts


# ENA Express's counters (ena.EXPRESS) by metric: its kind, name and help text.
EXPRESS_FAMILIES = {
    "ena_srd_mode": (GaugeMetricFamily, "pathprobe_ena_srd_mode",
        "ENA Express on this interface (ena_srd_mode, the driver's flags): 0 off, 1 on, 3 on for UDP as well. "
        "A path expected at ENA Express's per-flow limit with 0 here is at ENA's 5 Gbit/s per flow."),
    "ena_srd_tx_pkts": (CounterMetricFamily, "pathprobe_ena_srd_tx_packets",
        "Packets sent over SRD (ENA Express)."),
    "ena_srd_eligible_tx_pkts": (CounterMetricFamily, "pathprobe_ena_srd_eligible_tx_packets",
        "Packets that could have gone over SRD (ENA Express on both ends, same AZ): above "
        "pathprobe_ena_srd_tx_packets, SRD fell back to ENA for the rest."),
    "ena_srd_rx_pkts": (CounterMetricFamily, "pathprobe_ena_srd_rx_packets",
        "Packets received over SRD (ENA Express)."),
    "ena_srd_resource_utilization": (GaugeMetricFamily, "pathprobe_ena_srd_resource_utilization_ratio",
        "Share of the memory for concurrent SRD connections in use (0-1): at 1, new flows fall back to ENA."),
}  # fmt: skip


def _express(interface: str, counters: dict[str, int]) -> Iterator[Metric]:
    """ENA Express's counters, where the driver has them (absent, not zero, elsewhere)."""
    for name, (kind, metric, doc) in EXPRESS_FAMILIES.items():
        if name in counters:
            family = kind(metric, doc, labels=["interface"])
            value = counters[name] / 100 if name == "ena_srd_resource_utilization" else counters[name]
            family.add_metric([interface], value)
            yield family
