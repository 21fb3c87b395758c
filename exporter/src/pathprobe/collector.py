"""/metrics: a custom collector that builds every pathprobe metric from the store at
scrape time (client_python's custom-collector pattern). Nothing is registered ahead or
removed by hand: a series exists while the store or the config says so. README.md
documents each metric; the rules and dashboards depend on these names."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from . import __version__, ena, instance_types
from .budget import Budget
from .config import Config, Peer, ThroughputSettings
from .probes import REASONS
from .schedule import Timetable
from .store import RELATIVE_ACCURACY, STATES, UDP_COUNTS, WINDOW_SECONDS, Store

PEER = ["peer", "peer_region", "path_class"]
TEST = [*PEER, "protocol", "streams", "direction"]
PROBES = ("throughput", "rtt", "loss", "mtu")
# What a compact peer (mesh.compact_outside) keeps: what the rules read.
COMPACT_QUANTILES, COMPACT_UDP_COUNTS = (0.5, 0.99), ("sent", "lost")
IPERF3_ADMISSIONS = ("ok", "not_allowed", "out_of_turn")  # responders/iperf3.py: every outcome from zero
STATE_DOC = " state=loaded: this host or the peer may be in a throughput test (self-inflicted loss), else idle."
CACHED = "Results are cached from the last completed test; see the matching _timestamp_seconds."


def peer_labels(peer: Peer) -> list[str]:
    return [peer.name, peer.region, peer.path_class.value]


def settings_labels(t: ThroughputSettings, protocol: str) -> list[str]:
    return [
        f"{t.duration_seconds:g}",
        f"{t.omit_seconds:g}",
        (t.congestion or "default") if protocol == "tcp" else "",
        f"{t.udp_bitrate:.0f}" if protocol == "udp" else "",
        str(t.window_bytes or ""),
    ]


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


class Collector:
    """Builds the metric families of one exporter from its config, schedule, budget and store."""

    def __init__(self, cfg: Config, timetable: Timetable, budget: Budget, store: Store):
        self.budget, self.store = budget, store
        self.use(cfg, timetable)
        self.types = instance_types.load()
        self.interface = ena.interface(cfg.host.interface)
        # Held while collecting and while a reload changes the config, the peers or the store.
        self.lock = threading.Lock()

    def use(self, cfg: Config, timetable: Timetable) -> None:
        self.cfg, self.timetable = cfg, timetable
        self.peers = {p.name: p for p in cfg.peers}

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration: names are fixed here

    def collect(self) -> Iterator[Metric]:
        with self.lock:  # a whole scrape from one config (the metrics are built before the first is sent)
            families = [
                *self._info(), *self._throughput(), *self._rtt(), *self._udp(), *self._probe_outcomes(),
                *self._host(),
            ]  # fmt: skip
        yield from families

    # --- static: from the config
    def _info(self) -> Iterator[Metric]:
        build = InfoMetricFamily("pathprobe_build", "Version of the pathprobe exporter.")
        build.add_metric([], {"version": __version__})
        yield build
        info = _gauge(
            "pathprobe_peer_info", "A configured peer (value 1).", ["peer", "peer_region", "peer_zone", "path_class",
                                                                     "address"]
        )  # fmt: skip
        ceiling = _gauge(
            "pathprobe_rtt_ceiling_seconds",
            "Configured RTT ceiling of a path (peers[].rtt_ceiling_seconds), for alerting.",
            PEER,
        )
        rtt_settings = _gauge(
            "pathprobe_rtt_settings_info",
            "Settings of the RTT probes (value 1): interval between requests, size, timeout.",
            [*PEER, "protocol", "interval_seconds", "size_bytes", "timeout_seconds", "flows"],
        )
        tput_settings = _gauge(
            "pathprobe_throughput_settings_info",
            "Settings of the throughput tests behind each result (value 1).",
            [*TEST, "duration_seconds", "omit_seconds", "congestion", "target_bits_per_second", "window_bytes"],
        )
        rtt, loss = self.cfg.probes.rtt, self.cfg.probes.loss
        rtt_peers = {p.name for p in self.cfg.rtt_peers}
        throughput_peers = {p.name for p in self.cfg.throughput_peers}
        for peer in self.cfg.probed_peers:
            labels = peer_labels(peer)
            info.add_metric([peer.name, peer.region, peer.zone, peer.path_class.value, str(peer.address)], 1)
            if peer.rtt_ceiling_seconds:
                ceiling.add_metric(labels, peer.rtt_ceiling_seconds)
            if rtt.enabled and peer.name in rtt_peers:
                rtt_settings.add_metric(
                    [
                        *labels,
                        "tcp",
                        f"{rtt.interval_seconds:g}",
                        str(rtt.size_bytes),
                        f"{rtt.timeout_seconds:g}",
                        str(rtt.flows),
                    ],
                    1,
                )
            if loss.enabled and peer.name in rtt_peers:
                rtt_settings.add_metric(
                    [
                        *labels,
                        "udp",
                        f"{1 / loss.rate_pps:g}",
                        str(loss.size_bytes),
                        f"{loss.timeout_seconds:g}",
                        str(loss.flows),
                    ],
                    1,
                )
            tput = self.cfg.throughput_for(peer)
            if tput.enabled and peer.name in throughput_peers:
                for key in tput.tests():
                    tput_settings.add_metric([*labels, *key, *settings_labels(tput, key[0])], 1)
        unknown = _gauge(
            "pathprobe_instance_type_unknown",
            'An instance type named in the config (of this host, peer="", or of a peer) that the instance-type '
            "table does not know (value 1): its bandwidth limits are left out of the expected values.",
            ["peer", "instance_type"],
        )
        ends = [("", self.cfg.host.instance_type)] + [(p.name, p.instance_type) for p in self.cfg.peers]
        for peer_name, instance_type in ends:
            if instance_type and self.types.get(instance_type) is None:
                unknown.add_metric([peer_name, instance_type], 1)
        table = InfoMetricFamily(
            "pathprobe_instance_types_table", "The instance-type table the expected limits use: source and date."
        )
        table.add_metric([], {"source": self.types.source, "as_of": self.types.as_of.isoformat()})
        yield from (info, ceiling, rtt_settings, tput_settings, unknown, table)

    # --- throughput: the last result of every test, and what it should reach
    def _throughput(self) -> Iterator[Metric]:
        rate = _gauge(
            "pathprobe_throughput_bytes_per_second",
            "Receiver-side throughput (payload, after headers) of the last completed iperf3 test. " + CACHED,
            TEST,
        )
        sender = _gauge(
            "pathprobe_throughput_sender_bytes_per_second",
            "Sender-side throughput of the last completed iperf3 test. " + CACHED,
            TEST,
        )
        retransmits = _gauge(
            "pathprobe_throughput_retransmits",
            "TCP retransmits during the last completed test (sender side). " + CACHED,
            TEST,
        )
        udp_loss = _gauge(
            "pathprobe_throughput_udp_loss_ratio",
            "Share of UDP datagrams lost in the last UDP throughput test (0-1); measures the "
            "receiver as much as the path at high rates. " + CACHED,
            TEST,
        )
        jitter = _gauge(
            "pathprobe_throughput_udp_jitter_seconds",
            "Receiver-side jitter of the last UDP throughput test. " + CACHED,
            TEST,
        )
        ended = _gauge(
            "pathprobe_throughput_last_test_timestamp_seconds",
            "Unix time at which the last completed throughput test ended.",
            TEST,
        )
        expected = _gauge(
            "pathprobe_throughput_expected_bytes_per_second",
            "Throughput (payload, after headers, as measured) the path should reach: the smallest applicable "
            "limit; `limit` names the one that binds.",
            [*TEST, "limit"],
        )
        peak = _gauge(
            "pathprobe_throughput_expected_peak_bytes_per_second",
            "What the test may reach while the instances' network I/O credits last: the same limits with each "
            "instance's peak bandwidth instead of its baseline (context; alerts compare with the expected floor). "
            "`limit` names the one that binds.",
            [*TEST, "limit"],
        )
        window = _gauge(
            "pathprobe_throughput_receive_window_bound_bytes_per_second",
            "Receive-window bound: the receiver's tcp_rmem max times the share TCP keeps in flight, over the RTT "
            "(median of the last 256 samples), times streams.",
            TEST,
        )
        length = _gauge(
            "pathprobe_throughput_test_duration_seconds",
            "How long the last completed test ran (omitted seconds included): a steady-state test stops "
            "once its rate has settled.",
            TEST,
        )
        converged = _gauge(
            "pathprobe_throughput_converged",
            "1 when the last steady-state test stopped at a settled rate, 0 when it ran to its maximum "
            "(its rate is then that of its last seconds). Absent for fixed-length tests.",
            TEST,
        )
        for (name, *key), r in dict(self.store.throughput).items():
            labels = [*peer_labels(self.peers[name]), *key]
            length.add_metric(labels, r.duration_seconds + r.omit_seconds)
            if r.converged is not None:
                converged.add_metric(labels, float(r.converged))
            rate.add_metric(labels, r.receiver_bytes_per_second)
            sender.add_metric(labels, r.sender_bytes_per_second)
            if r.retransmits is not None:
                retransmits.add_metric(labels, r.retransmits)
            if r.udp_loss_ratio is not None:
                udp_loss.add_metric(labels, r.udp_loss_ratio)
            if r.jitter_seconds is not None:
                jitter.add_metric(labels, r.jitter_seconds)
            ended.add_metric(labels, r.timestamp)
        for (name, *key), e in dict(self.store.expected).items():
            labels = [*peer_labels(self.peers[name]), *key]
            expected.add_metric([*labels, e.limit], e.bits_per_second / 8)
            peak.add_metric([*labels, e.peak_limit], e.peak_bits_per_second / 8)
            if "receive_window" in e.candidates:
                window.add_metric(labels, e.candidates["receive_window"] / 8)
        rises = _gauge(
            "pathprobe_throughput_allowance_exceeded_during_last_test",
            "How much each ENA allowance counter (ethtool -S) rose during the last run of the test: above 0, the "
            "instance's allowance limited it, not the path. Absent where the counters do not exist.",
            [*TEST, "counter"],
        )
        for (name, *key), rose in dict(self.store.allowance_rises).items():
            for counter in ena.ALLOWANCES:
                rises.add_metric([*peer_labels(self.peers[name]), *key, counter], rose.get(counter, 0))
        skipped = _counter(
            "pathprobe_throughput_skipped", "Scheduled throughput tests not run, by reason.", ["peer", "reason"]
        )
        for (peer, reason), n in dict(self.store.skipped).items():
            skipped.add_metric([peer, reason], n)
        yield from (rate, sender, retransmits, udp_loss, jitter, ended, length, converged, expected, peak, window,
                    rises, skipped)  # fmt: skip

    # --- RTT: exact quantiles over a sliding window, idle and under load apart
    def _rtt(self) -> Iterator[Metric]:
        family = Metric(
            "pathprobe_rtt_seconds",
            f"Round-trip time of TCP request/response (protocol=tcp) and UDP echo (protocol=udp) probes: "
            f"quantiles over the last {WINDOW_SECONDS:g} s (within {RELATIVE_ACCURACY:.1%} of the value), "
            "count and sum since start. state=loaded: this host or the peer may be in a throughput test.",
            "summary",
        )
        now = self.store.clock()
        compact = self.cfg.compact_peers
        for (name, protocol, state), window in dict(self.store.rtt).items():
            if name in compact and state != "idle":
                continue
            labels = dict(zip(PEER, peer_labels(self.peers[name]), strict=True)) | {
                "protocol": protocol, "state": state
            }  # fmt: skip
            for q, v in window.quantiles(now).items():
                if name in compact and q not in COMPACT_QUANTILES:
                    continue
                family.add_sample("pathprobe_rtt_seconds", labels | {"quantile": floatToGoString(q)}, v)  # type: ignore[no-untyped-call]
            family.add_sample("pathprobe_rtt_seconds_count", labels, window.count)
            family.add_sample("pathprobe_rtt_seconds_sum", labels, window.total)
        yield family

    # --- UDP echo accounting
    def _udp(self) -> Iterator[Metric]:
        docs = {
            "sent": "UDP echo packets sent.",
            "received": "UDP echo packets answered in time.",
            "lost": "UDP echo packets with no answer within the timeout.",
            "duplicate": "Second and later echoes of one packet.",
            "reordered": "Echoes that arrived after the echo of a later packet.",
            "late": "Echoes that arrived after the packet was counted lost.",
        }
        families = {
            k: _counter(f"pathprobe_udp_packets_{k}", docs[k] + STATE_DOC, [*PEER, "state"]) for k in UDP_COUNTS
        }
        jitter = _gauge(
            "pathprobe_udp_rtt_variation_seconds",
            "Smoothed variation of successive UDP echo round-trip times (RFC 3550's jitter estimator, gain "
            "1/16, applied to RTTs: not the one-way jitter of pathprobe_throughput_udp_jitter_seconds).",
            PEER,
        )
        udp = dict(self.store.udp)
        # A peer's packets are "loaded" while this host or the peer is in any throughput test,
        # whether or not the two test each other (Exporter.load_state): both states for every
        # peer wherever this mesh runs tests.
        states = STATES if self.cfg.half_slot_need(with_margin=False) else ("idle",)
        if self.cfg.probes.loss.enabled:
            compact = self.cfg.compact_peers
            for peer in self.cfg.rtt_peers:
                for state in ("idle",) if peer.name in compact else states:
                    counts = dict(udp.get((peer.name, state), {}))
                    for k in COMPACT_UDP_COUNTS if peer.name in compact else UDP_COUNTS:
                        # every series from zero, so that increase() sees the first loss
                        families[k].add_metric([*peer_labels(peer), state], counts.get(k, 0))
        for name, value in dict(self.store.udp_jitter).items():
            jitter.add_metric(peer_labels(self.peers[name]), value)
        forward = _counter(
            "pathprobe_udp_packets_lost_forward",
            "UDP echo packets lost on the way to the peer (the peer's responder never counted them).",
            PEER,
        )
        reverse = _counter(
            "pathprobe_udp_packets_lost_reverse",
            "UDP echo packets the peer's responder counted whose echo never came back.",
            PEER,
        )
        by_direction = dict(self.store.lost_by_direction)
        worst = _gauge(
            "pathprobe_udp_worst_flow_loss_ratio",
            "Loss ratio of the worst of the echo probe's flows (source ports) over its last 32 packets.",
            PEER,
        )
        worst_loss = dict(self.store.worst_flow_loss)
        if self.cfg.probes.loss.enabled:
            for peer in self.cfg.rtt_peers:
                f, r = by_direction.get(peer.name, (0, 0))
                forward.add_metric(peer_labels(peer), f)
                reverse.add_metric(peer_labels(peer), r)
                if peer.name in worst_loss:
                    worst.add_metric(peer_labels(peer), worst_loss[peer.name])
        failing = _gauge(
            "pathprobe_probe_flows_failing",
            "Flows (source ports) of a continuous probe whose recent probes mostly failed: one broken member of "
            "an ECMP group fails some flows of a path and not others.",
            [*PEER, "protocol"],
        )
        for (name, protocol), n in dict(self.store.flows_failing).items():
            failing.add_metric([*peer_labels(self.peers[name]), protocol], n)
        yield from families.values()
        yield from (jitter, forward, reverse, worst, failing)
        yield from self._mtu()

    def _mtu(self) -> Iterator[Metric]:
        carried = _gauge(
            "pathprobe_path_mtu_carried",
            "1 when the last DF-set probe of this IP packet size reached the peer and came back, else 0.",
            [*PEER, "size_bytes"],
        )
        last = _gauge(
            "pathprobe_path_mtu_last_carried_timestamp_seconds",
            "Unix time at which a probe of this IP packet size was last carried (absent: never).",
            [*PEER, "size_bytes"],
        )
        for (name, size), (ok, when) in dict(self.store.mtu).items():
            labels = [*peer_labels(self.peers[name]), str(size)]
            carried.add_metric(labels, 1 if ok else 0)
            if when is not None:
                last.add_metric(labels, when)
        yield from (carried, last)

    # --- outcomes of every probe
    def _probe_outcomes(self) -> Iterator[Metric]:
        runs = _counter(
            "pathprobe_probe_runs",
            "Probe attempts by outcome: a throughput test, an RTT request/response, or a UDP echo packet.",
            ["probe", "peer", "result"],
        )
        counted = dict(self.store.runs)
        probed = {"throughput": self.cfg.throughput_peers, "rtt": self.cfg.rtt_peers}
        compact = self.cfg.compact_peers
        for probe in PROBES:  # every outcome from zero, so that increase() sees the first failure
            for peer in probed.get(probe, self.cfg.rtt_peers):  # loss and mtu go with rtt
                for reason in REASONS:
                    n = counted.get((probe, peer.name, reason), 0)
                    if n or peer.name not in compact:  # compact: the outcomes that happened
                        runs.add_metric([probe, peer.name, reason], n)
        last = _gauge(
            "pathprobe_probe_last_success_timestamp_seconds", "Unix time of the last successful probe.",
            ["probe", "peer"],
        )  # fmt: skip
        for (probe, peer_name), ts in dict(self.store.last_success).items():
            last.add_metric([probe, peer_name], ts)
        moved = _counter(
            "pathprobe_probe_bytes_sent",
            "Bytes moved by probes this host started (throughput: both directions, what inter-region transfer bills).",
            ["probe", "peer"],
        )
        cost = _counter(
            "pathprobe_probe_cost_dollars",
            "What the bytes of pathprobe_probe_bytes_sent_total cost at budget.price_per_gb of the peer's "
            "path class (only for classes with a price).",
            ["probe", "peer"],
        )
        prices = self.cfg.budget.price_per_gb
        for (probe, peer_name), n in dict(self.store.bytes_sent).items():
            moved.add_metric([probe, peer_name], n)
            price = prices.get(self.peers[peer_name].path_class)
            if price is not None:
                cost.add_metric([probe, peer_name], n / 1e9 * price)
        yield from (runs, last, moved, cost)

    # --- this host: budget, schedule, responders
    def _host(self) -> Iterator[Metric]:
        s = self.store
        # The schedule in force; before the epoch of a fresh start, the one to come.
        sched = self.timetable.at(s.clock()) or self.timetable.current
        allowances = ena.read(self.interface)
        if allowances is not None:  # absent, not zero, where the ENA driver is not
            family = _counter(
                "pathprobe_ena_allowance_exceeded",
                "Packets the instance queued or dropped for exceeding an allowance (ENA driver, ethtool -S): "
                "bw_in/bw_out (bandwidth), pps, conntrack, linklocal.",
                ["interface", "counter"],
            )
            for counter, n in allowances.items():
                family.add_metric([self.interface or "", counter], n)
            yield family
        yield _one(
            GaugeMetricFamily,
            "pathprobe_budget_remaining_bytes",
            "Bytes throughput tests may still move in the current budget period.",
            self.budget.remaining(),
        )
        yield _one(
            GaugeMetricFamily,
            "pathprobe_budget_limit_bytes",
            "Bytes throughput tests may move per period.",
            self.cfg.budget.daily_bytes,
        )
        yield _one(
            CounterMetricFamily,
            "pathprobe_budget_save_failures",
            "Times the budget state file could not be written (the count goes on in memory; see the log).",
            self.budget.save_failures,
        )
        yield _one(
            GaugeMetricFamily,
            "pathprobe_budget_state_unusable",
            "1 when the budget state file was unusable at start: today counts as spent (see the log).",
            1 if self.budget.load_error else 0,
        )
        yield _one(
            GaugeMetricFamily,
            "pathprobe_budget_period_end_timestamp_seconds",
            "Unix time at which the current budget period ends.",
            self.budget.period_end(),
        )
        info = _gauge(
            "pathprobe_schedule_info",
            "The mesh schedule this host derives (value 1); every host of a consistent mesh "
            "shows the same fingerprint.",
            ["fingerprint"],
        )
        info.add_metric([sched.fingerprint], 1)
        yield info
        yield _one(
            GaugeMetricFamily,
            "pathprobe_schedule_epoch_timestamp_seconds",
            "When the newest member list's schedule takes (or took) effect: mesh.epoch, or the time of the "
            "reload that loaded it (0: at start).",
            self.timetable.epoch,
        )
        reloads = _counter(
            "pathprobe_config_reloads", "Config reloads (SIGHUP, POST /-/reload): failure keeps the running config.",
            ["result"],
        )  # fmt: skip
        for result in ("success", "failure"):
            reloads.add_metric([result], s.reloads[result])
        yield reloads
        yield _one(
            GaugeMetricFamily,
            "pathprobe_config_last_reload_successful",
            "1 when the last reload applied its config (or none was asked for), 0 when it was refused.",
            float(s.last_reload_ok),
        )
        yield _one(
            GaugeMetricFamily, "pathprobe_schedule_members", "Hosts in the throughput schedule.", len(sched.members)
        )
        yield _one(
            GaugeMetricFamily, "pathprobe_schedule_slot_seconds", "Length of one schedule slot.", sched.slot_seconds
        )
        yield _one(
            GaugeMetricFamily,
            "pathprobe_schedule_rotation_seconds",
            "Time for every pair of hosts to meet once.",
            sched.rotation_seconds,
        )
        yield _one(
            CounterMetricFamily,
            "pathprobe_schedule_turns",
            "Client turns this host took in the schedule.",
            s.schedule_turns,
        )
        if s.last_turn is not None:
            yield _one(
                GaugeMetricFamily,
                "pathprobe_schedule_last_turn_timestamp_seconds",
                "Unix time at which this host's last throughput turn began (its start, before the first).",
                s.last_turn,
            )
        errors = _counter(
            "pathprobe_schedule_turn_errors",
            "Throughput turns that ended on an unexpected error (logged), by exception type; the loop goes on.",
            ["reason"],
        )
        for reason, n in dict(s.turn_errors).items():
            errors.add_metric([reason], n)
        yield errors
        requests = _counter(
            "pathprobe_responder_requests",
            "Connections (rr) or datagrams (echo) that reached a responder, by outcome.",
            ["responder", "result"],
        )
        counted = Counter(dict.fromkeys(IPERF3_ADMISSIONS if self.cfg.iperf3.admit != "anyone" else (), 0))
        for (responder, result), n in dict(s.responder_requests).items():
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
        admission.add_metric([], {"admit": self.cfg.iperf3.admit})
        yield admission
        yield _one(
            GaugeMetricFamily,
            "pathprobe_iperf3_server_up",
            "1 while the supervised iperf3 server runs.",
            1 if s.iperf3_server_up else 0,
        )
        yield _one(
            CounterMetricFamily,
            "pathprobe_iperf3_server_restarts",
            "Times the supervised iperf3 server exited and was restarted.",
            s.iperf3_server_restarts,
        )


def _one(kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str, doc: str, value: float) -> Metric:
    """A metric with one unlabelled sample."""
    return kind(name, doc, value=value)


def registry(collector: Collector) -> CollectorRegistry:
    """The registry /metrics serves: pathprobe's collector and the client library's process metrics."""
    r = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=r)
    PlatformCollector(registry=r)
    r.register(collector)
    return r
