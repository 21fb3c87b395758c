"""Every metric the exporter serves, in one registry (the contract with the rules
and dashboards; README.md documents each)."""

from __future__ import annotations

import time

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from . import __version__
from .config import Config, Peer, ThroughputSettings
from .results import REASONS, ThroughputResult

PEER = ("peer", "peer_region", "path_class")
TEST = (*PEER, "protocol", "streams", "direction")
PROBES = ("throughput", "rtt", "loss")

# From tens of microseconds (same zone) to seconds (a path in trouble), denser
# where inter-region RTTs live (1-100 ms: steps of 20-30%). Every bucket costs
# a series per peer and protocol, so this is a compromise with scrape size.
RTT_BUCKETS = (
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.010, 0.0125, 0.015,
    0.020, 0.025, 0.030, 0.040, 0.050, 0.060, 0.080, 0.100, 0.150, 0.200,
    0.300, 0.500, 1.0, 2.5, 5.0,
)  # fmt: skip

CACHED = "Results are cached from the last completed test; see the matching _timestamp_seconds."


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.build_info = Info("pathprobe_build", "Version of the pathprobe exporter.", registry=r)
        self.build_info.info({"version": __version__})

        g = self._gauge
        self.throughput = g(
            "pathprobe_throughput_bytes_per_second",
            "Receiver-side throughput of the last completed iperf3 test. " + CACHED,
            TEST,
        )
        self.throughput_sender = g(
            "pathprobe_throughput_sender_bytes_per_second",
            "Sender-side throughput of the last completed iperf3 test. " + CACHED,
            TEST,
        )
        self.retransmits = g(
            "pathprobe_throughput_retransmits",
            "TCP retransmits during the last completed test (sender side). " + CACHED,
            TEST,
        )
        self.udp_loss_ratio = g(
            "pathprobe_throughput_udp_loss_ratio",
            "Share of UDP datagrams lost in the last UDP throughput test (0-1); measures the "
            "receiver as much as the path at high rates. " + CACHED,
            TEST,
        )
        self.throughput_jitter = g(
            "pathprobe_throughput_udp_jitter_seconds",
            "Receiver-side jitter of the last UDP throughput test. " + CACHED,
            TEST,
        )
        self.throughput_ts = g(
            "pathprobe_throughput_last_test_timestamp_seconds",
            "Unix time at which the last completed throughput test ended.",
            TEST,
        )
        self.throughput_settings = g(
            "pathprobe_throughput_settings_info",
            "Settings of the throughput tests behind each result (value 1).",
            (*TEST, "duration_seconds", "omit_seconds", "congestion", "target_bits_per_second", "window_bytes"),
        )
        self.expected = g(
            "pathprobe_throughput_expected_bytes_per_second",
            "Throughput the path should reach: the smallest applicable limit; `limit` names the one that binds.",
            (*TEST, "limit"),
        )
        self.receive_window_bound = g(
            "pathprobe_throughput_receive_window_bound_bytes_per_second",
            "Receive-window bound: the receiver's tcp_rmem max times the share TCP keeps in flight, over the RTT "
            "(median of the last 256 samples), times streams.",
            TEST,
        )

        self.rtt = Histogram(
            "pathprobe_rtt_seconds",
            "Round-trip time of TCP request/response (protocol=tcp) and UDP echo (protocol=udp) probes.",
            (*PEER, "protocol"),
            buckets=RTT_BUCKETS,
            registry=r,
        )
        self.rtt_ceiling = g(
            "pathprobe_rtt_ceiling_seconds",
            "Configured RTT ceiling of a path (peers[].rtt_ceiling_seconds), for alerting.",
            PEER,
        )
        self.rtt_settings = g(
            "pathprobe_rtt_settings_info",
            "Settings of the RTT probes (value 1): interval between requests, size, timeout.",
            (*PEER, "protocol", "interval_seconds", "size_bytes", "timeout_seconds"),
        )

        c = self._counter
        self.udp_sent = c("pathprobe_udp_packets_sent", "UDP echo packets sent.", PEER)
        self.udp_received = c("pathprobe_udp_packets_received", "UDP echo packets answered in time.", PEER)
        self.udp_lost = c("pathprobe_udp_packets_lost", "UDP echo packets with no answer within the timeout.", PEER)
        self.udp_duplicate = c("pathprobe_udp_packets_duplicate", "Second and later echoes of one packet.", PEER)
        self.udp_reordered = c(
            "pathprobe_udp_packets_reordered", "Echoes that arrived after the echo of a later packet.", PEER
        )
        self.udp_late = c("pathprobe_udp_packets_late", "Echoes that arrived after the packet was counted lost.", PEER)
        self.udp_jitter = g(
            "pathprobe_udp_jitter_seconds",
            "Smoothed variation of successive UDP echo RTTs (RFC 3550 estimator, gain 1/16).",
            PEER,
        )

        self.runs = c(
            "pathprobe_probe_runs",
            "Probe attempts by outcome: a throughput test, an RTT request/response, or a UDP echo packet.",
            ("probe", "peer", "result"),
        )
        self.last_success = g(
            "pathprobe_probe_last_success_timestamp_seconds",
            "Unix time of the last successful probe.",
            ("probe", "peer"),
        )
        self.bytes_sent = c(
            "pathprobe_probe_bytes_sent",
            "Bytes moved by probes this host started (throughput: both directions, what inter-region transfer bills).",
            ("probe", "peer"),
        )
        self.skipped = c(
            "pathprobe_throughput_skipped", "Scheduled throughput tests not run, by reason.", ("peer", "reason")
        )

        self.budget_remaining = g(
            "pathprobe_budget_remaining_bytes",
            "Bytes throughput tests may still move in the current budget period.",
            (),
        )
        self.budget_limit = g("pathprobe_budget_limit_bytes", "Bytes throughput tests may move per period.", ())
        self.budget_period_end = g(
            "pathprobe_budget_period_end_timestamp_seconds", "Unix time at which the current budget period ends.", ()
        )

        self.peer_info = g(
            "pathprobe_peer_info",
            "A configured peer (value 1).",
            ("peer", "peer_region", "peer_zone", "path_class", "address"),
        )
        self.schedule_info = g(
            "pathprobe_schedule_info",
            "The mesh schedule this host derives (value 1); every host of a consistent mesh "
            "shows the same fingerprint.",
            ("fingerprint",),
        )
        self.schedule_members = g("pathprobe_schedule_members", "Hosts in the throughput schedule.", ())
        self.schedule_slot = g("pathprobe_schedule_slot_seconds", "Length of one schedule slot.", ())
        self.schedule_rotation = g(
            "pathprobe_schedule_rotation_seconds", "Time for every pair of hosts to meet once.", ()
        )
        self.schedule_turns = c("pathprobe_schedule_turns", "Client turns this host took in the schedule.", ())

        self.responder_requests = c(
            "pathprobe_responder_requests",
            "Connections (rr) or datagrams (echo) that reached a responder, by outcome.",
            ("responder", "result"),
        )
        self.iperf3_server_up = g("pathprobe_iperf3_server_up", "1 while the supervised iperf3 server runs.", ())
        self.iperf3_server_restarts = c(
            "pathprobe_iperf3_server_restarts", "Times the supervised iperf3 server exited and was restarted.", ()
        )

    def _gauge(self, name: str, doc: str, labels: tuple[str, ...]) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)

    def _counter(self, name: str, doc: str, labels: tuple[str, ...]) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    # --- set-up from config
    def describe_mesh(self, cfg: Config, fingerprint: str, rotation_seconds: float, members: int) -> None:
        self.schedule_info.labels(fingerprint).set(1)
        self.schedule_members.set(members)
        self.schedule_slot.set(cfg.schedule.slot_seconds)
        self.schedule_rotation.set(rotation_seconds)
        self.budget_limit.set(cfg.budget.daily_bytes)
        for peer in cfg.peers:
            self.peer_info.labels(peer.name, peer.region, peer.zone, peer.path_class.value, str(peer.address)).set(1)
            if peer.rtt_ceiling_seconds:
                self.rtt_ceiling.labels(*peer_labels(peer)).set(peer.rtt_ceiling_seconds)
            for probe in PROBES:
                # Start every outcome at zero so that increase() sees the first failure.
                for reason in REASONS:
                    self.runs.labels(probe, peer.name, reason)
            if cfg.probes.rtt.enabled:
                rtt = cfg.probes.rtt
                self.rtt_settings.labels(
                    *peer_labels(peer),
                    "tcp",
                    f"{rtt.interval_seconds:g}",
                    str(rtt.size_bytes),
                    f"{rtt.timeout_seconds:g}",
                ).set(1)
            if cfg.probes.loss.enabled:
                loss = cfg.probes.loss
                self.rtt_settings.labels(
                    *peer_labels(peer),
                    "udp",
                    f"{1 / loss.rate_pps:g}",
                    str(loss.size_bytes),
                    f"{loss.timeout_seconds:g}",
                ).set(1)
                for counter in (
                    self.udp_sent,
                    self.udp_received,
                    self.udp_lost,
                    self.udp_duplicate,
                    self.udp_reordered,
                    self.udp_late,
                ):
                    counter.labels(*peer_labels(peer))
            tput = cfg.throughput_for(peer)
            if tput.enabled:
                for key in test_keys(tput):
                    self.throughput_settings.labels(*peer_labels(peer), *key, *settings_labels(tput, key[0])).set(1)

    # --- results
    def record_throughput(self, peer: Peer, result: ThroughputResult, moved_bytes: int) -> None:
        labels = (*peer_labels(peer), result.protocol, str(result.streams), result.direction)
        self.throughput.labels(*labels).set(result.receiver_bytes_per_second)
        self.throughput_sender.labels(*labels).set(result.sender_bytes_per_second)
        if result.retransmits is not None:
            self.retransmits.labels(*labels).set(result.retransmits)
        if result.udp_loss_ratio is not None:
            self.udp_loss_ratio.labels(*labels).set(result.udp_loss_ratio)
        if result.jitter_seconds is not None:
            self.throughput_jitter.labels(*labels).set(result.jitter_seconds)
        self.throughput_ts.labels(*labels).set(result.timestamp)
        self.bytes_sent.labels("throughput", peer.name).inc(moved_bytes)
        self.success("throughput", peer.name)

    def success(self, probe: str, peer: str) -> None:
        self.runs.labels(probe, peer, "ok").inc()
        self.last_success.labels(probe, peer).set(time.time())


def peer_labels(peer: Peer) -> tuple[str, str, str]:
    return peer.name, peer.region, peer.path_class.value


def test_keys(t: ThroughputSettings) -> list[tuple[str, str, str]]:
    """(protocol, streams, direction) of every test the settings ask for, in run order."""
    return [(p, str(s), d) for p in t.protocols for s in t.streams for d in t.directions]


def settings_labels(t: ThroughputSettings, protocol: str) -> tuple[str, str, str, str, str]:
    return (
        f"{t.duration_seconds:g}",
        f"{t.omit_seconds:g}",
        (t.congestion or "default") if protocol == "tcp" else "",
        f"{t.udp_bitrate:.0f}" if protocol == "udp" else "",
        str(t.window_bytes or ""),
    )
