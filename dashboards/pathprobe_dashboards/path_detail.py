"""pathprobe / Path detail: one path in depth."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from pathprobe.monitoring.params import Params

from .common import FULL, THIRD, dashboard, lines, query, selector, series, target
from .evidence import aws_beside_ours, test_records


def build(p: Params) -> Dashboard:
    sel = selector(p)
    # Sent packets of both states: the per-direction counters are not split by state.
    sent = f"sum without (state) (rate(pathprobe_udp_packets_sent_total{{{sel}}}[$__rate_interval]))"
    rtt = "pathprobe_rtt_seconds"
    return (
        dashboard(
            p,
            "pathprobe-path",
            "pathprobe / Path detail",
            "One path in detail: throughput against its expected value and binding limit, retransmits, RTT "
            "idle and under load, loss by direction and by flow, path MTU, and probe outcomes.",
        )
        .with_row(Row("Throughput"))
        .with_panel(
            series(
                "Throughput and expected",
                "Receiver-side rate (payload) of each test (by streams and direction) and the expected rate, in the "
                "same units, with the binding limit in the legend.",
                "bps",
                query(
                    f"path:pathprobe_throughput_bits_per_second:last{{{sel}}}",
                    "{{host}} -> {{peer}} {{protocol}} x{{streams}} {{direction}}",
                ),
                query(
                    f"path:pathprobe_throughput_expected_bits_per_second:last{{{sel}}}",
                    "expected x{{streams}} {{direction}} ({{limit}})",
                    ref="B",
                ),
            )
        )
        .with_panel(
            series(
                "Throughput / expected",
                f"Each test's rate as a share of expected; alerts fire below {p.throughput_ratio_warning:.0%} "
                "(warning) "
                f"and {p.throughput_ratio_critical:.0%} (critical) for two tests in a row.",
                "percentunit",
                query(
                    f"path:pathprobe_throughput_expected_ratio:last{{{sel}}}",
                    "{{host}} -> {{peer}} x{{streams}} {{direction}}",
                ),
            )
        )
        .with_panel(
            series(
                "Retransmits per test",
                "TCP retransmits in the last test (sender side).",
                "short",
                query(f"pathprobe_throughput_retransmits{{{sel}}}", "{{host}} -> {{peer}} x{{streams}} {{direction}}"),
                span=THIRD,
            )
        )
        .with_panel(
            series(
                "Test length",
                "How long the last test ran: a TCP test stops once its rate has settled (throughput.steady_state), "
                "so a test as long as its duration_seconds either never settled or is a fixed-length one.",
                "s",
                query(
                    f"pathprobe_throughput_test_duration_seconds{{{sel}}}",
                    "{{host}} -> {{peer}} {{protocol}} x{{streams}} {{direction}}",
                ),
                span=THIRD,
            )
        )
        .with_panel(
            series(
                "Settled",
                "1: the last test stopped at a settled rate; 0: it never settled and ran to its maximum, its rate "
                "that of its last two windows (a rate that kept moving: competing traffic, loss bursts). No line for "
                "fixed-length tests (UDP, or steady state off).",
                "short",
                query(f"pathprobe_throughput_converged{{{sel}}}", "{{host}} -> {{peer}} x{{streams}} {{direction}}"),
                span=THIRD,
            )
        )
        .with_panel(
            series(
                "What held the sender back",
                "Share of the last send test's sending time with the receiver's advertised window full (rwnd) or "
                "this host's send buffer full (sndbuf) (tcp_info, read during steady-state TCP tests). On a test "
                "well below its floor, rwnd points at the receiver's buffers (still growing, or too small), not at "
                "the path. A path bound by the send buffer's window reads some sndbuf (8-10% in the lab).",
                "percentunit",
                query(
                    f"pathprobe_throughput_receive_window_limited_ratio{{{sel}}}",
                    "rwnd {{host}} -> {{peer}} x{{streams}}",
                ),
                query(
                    f"pathprobe_throughput_send_buffer_limited_ratio{{{sel}}}",
                    "sndbuf {{host}} -> {{peer}} x{{streams}}",
                    ref="B",
                ),
            )
        )
        .with_panel(
            series(
                "The test's own ends",
                "Each end of the last test (sender, receiver): the share of its busiest second that its busiest "
                "iperf3 thread was on a CPU or waiting for one (schedstat), and that its host's busiest core spent in "
                "softirq, and the share of its host's CPU time its hypervisor took (steal). At 90% (steal: 10%) the "
                "end bound the test, not the path: the throughput alerts leave such a test out and "
                "PathprobeThroughputTestHostBound names the host. No line for an end that reported nothing (an "
                "older peer).",
                "percentunit",
                query(
                    f"pathprobe_throughput_end_runnable_ratio{{{sel}}}",
                    "cpu {{end}} {{host}} -> {{peer}} x{{streams}} {{direction}}",
                ),
                query(
                    f"pathprobe_throughput_end_softirq_ratio{{{sel}}}",
                    "softirq {{end}} {{host}} -> {{peer}} x{{streams}} {{direction}}",
                    ref="B",
                ),
                query(
                    f"pathprobe_throughput_end_steal_ratio{{{sel}}}",
                    "steal {{end}} {{host}} -> {{peer}} x{{streams}} {{direction}}",
                    ref="C",
                ),
            )
        )
        .with_panel(
            series(
                "UDP tests: the path's loss and the receiver's drops",
                "The last UDP test's loss less the datagrams its receiving host dropped for a full socket buffer "
                "(the path's share), beside the whole loss as iperf3 counted it: at rates the receiver cannot "
                "read, most of iperf3's loss is the receiver's.",
                "percentunit",
                query(f"pathprobe_throughput_udp_path_loss_ratio{{{sel}}}", "path {{host}} -> {{peer}} x{{streams}}"),
                query(
                    f"pathprobe_throughput_udp_loss_ratio{{{sel}}}",
                    "iperf3's {{host}} -> {{peer}} x{{streams}}",
                    ref="B",
                ),
            )
        )
        .with_panel(test_records(p))
        .with_row(Row("RTT"))
        .with_panel(aws_beside_ours(p))
        .with_panel(
            series(
                "RTT idle: p50, p90, p99",
                "Exact quantiles of the last 5 minutes (as the probe measured them, within 0.2%), from samples taken "
                "while neither host was in a throughput test.",
                "s",
                query(f'{rtt}{{{sel}, state="idle"}}', "p{{quantile}} {{host}} -> {{peer}} {{protocol}}"),
            )
        )
        .with_panel(
            series(
                "RTT under load: p50, p99",
                "The same quantiles from samples taken while this host or the peer may be in a throughput test: they "
                "sit behind the test's queue (self-inflicted queueing, kept out of the idle figures and the alerts). "
                "With them, the mean smoothed RTT the last send test's own streams saw (tcp_info): a test below its "
                "floor with an RTT near the idle one kept less in flight; with a longer one, it met a queue.",
                "s",
                query(
                    f'{rtt}{{{sel}, state="loaded", quantile=~"0.5|0.99"}}',
                    "p{{quantile}} loaded {{host}} -> {{peer}} {{protocol}}",
                ),
                query(
                    f"pathprobe_throughput_sender_rtt_seconds{{{sel}}}",
                    "test's streams {{host}} -> {{peer}} x{{streams}}",
                    ref="B",
                ),
            )
        )
        .with_panel(
            series(
                "One-way delay idle: p50 each way, and how far off it may be",
                "The UDP echoes' delay to the peer (forward) and back (reverse): which way a slower path slowed. "
                "Each figure may be off by both clocks' error bounds added (the error bound line); shown only while "
                "the exporter trusts them (pathprobe_owd_trusted: both bounds known, the clocks within them, the "
                "bounds within clock.max_error_share of the delay).",
                "s",
                *lines(
                    (
                        f'pathprobe_owd_seconds{{{sel}, state="idle", quantile="0.5"}}',
                        "{{direction}} {{host}} -> {{peer}}",
                    ),
                    (f"pathprobe_owd_error_bound_seconds{{{sel}}}", "error bound {{host}} -> {{peer}}"),
                ),
                span=FULL,
            )
        )
        .with_row(Row("Loss, flows and MTU"))
        .with_panel(
            series(
                "UDP echo loss by direction",
                "Share of echo packets lost over 5 minutes in all (the recorded ratio), and on the way to the peer "
                "(forward) and back (reverse), from the responder's own count, over the rate interval.",
                "percentunit",
                *lines(
                    (f"path:pathprobe_udp_loss_ratio:rate5m{{{sel}}}", "{{state}} {{host}} -> {{peer}}"),
                    (
                        f"rate(pathprobe_udp_packets_lost_forward_total{{{sel}}}[$__rate_interval]) / {sent}",
                        "forward {{host}} -> {{peer}}",
                    ),
                    (
                        f"rate(pathprobe_udp_packets_lost_reverse_total{{{sel}}}[$__rate_interval]) / {sent}",
                        "reverse {{host}} -> {{peer}}",
                    ),
                ),
                span=THIRD,
            )
        )
        .with_panel(
            series(
                "Flows failing and the worst flow",
                "The continuous probes use several source ports (flows) so that they cross every member of an ECMP "
                "group: flows whose recent probes mostly fail, and the loss of the worst UDP flow.",
                "short",
                query(f"pathprobe_probe_flows_failing{{{sel}}}", "failing {{protocol}} {{host}} -> {{peer}}"),
                query(f"pathprobe_udp_worst_flow_loss_ratio{{{sel}}}", "worst flow loss {{host}} -> {{peer}}", ref="B"),
                span=THIRD,
            )
        )
        .with_panel(
            series(
                "Path MTU: sizes carried",
                "1 while the last Don't-Fragment probe of each IP packet size came back.",
                "short",
                query(f"pathprobe_path_mtu_carried{{{sel}}}", "{{size_bytes}} B {{host}} -> {{peer}}"),
                span=THIRD,
            )
        )
        .with_panel(
            series(
                "UDP echo RTT variation",
                "RFC 3550's jitter estimator applied to successive echo RTTs (a round-trip variation).",
                "s",
                query(f"pathprobe_udp_rtt_variation_seconds{{{sel}}}", "{{host}} -> {{peer}}"),
            )
        )
        .with_row(Row("Applications beside the probes"))
        .with_panel(
            series(
                "Applications' RTT beside the probes'",
                "The smoothed RTT (tcp_info) of this host's own applications' TCP flows to the peer, min, median and "
                "max over its flows (pathprobe_tcp_flows_rtt_seconds, read every flows.interval_seconds), beside the "
                "RTT probe's idle p50: flows above the probes carry their own queue (a bulk transfer filling a "
                "buffer) or a slow receiver.",
                "s",
                query(f"pathprobe_tcp_flows_rtt_seconds{{{sel}}}", "apps {{stat}} {{host}} -> {{peer}}"),
                query(
                    f'{rtt}{{{sel}, protocol="tcp", state="idle", quantile="0.5"}}',
                    "probes p50 {{host}} -> {{peer}}",
                    ref="B",
                ),
            )
        )
        .with_panel(
            series(
                "Applications' retransmit rate beside the probes' loss",
                "Segments this host's applications retransmit per second to the peer, as a share of the segments "
                f"they send ({p.app_segment_bytes} bytes each: an estimate), beside the idle UDP echo loss of the "
                "probes: applications retransmitting on a path the probes call healthy point at the host or the "
                "application (PathprobeApplicationRetransmits).",
                "percentunit",
                query(
                    f"sum by (host, peer) (rate(pathprobe_tcp_flows_retransmitted_segments_total{{{sel}}}"
                    f"[$__rate_interval])) * {p.app_segment_bytes}\n  / sum by (host, peer) "
                    f"(rate(pathprobe_tcp_flows_bytes_acked_total{{{sel}}}[$__rate_interval]))",
                    "apps {{host}} -> {{peer}}",
                ),
                query(
                    f'sum by (host, peer) (rate(pathprobe_udp_packets_lost_total{{{sel}, state="idle"}}'
                    f"[$__rate_interval]))\n  / sum by (host, peer) (rate(pathprobe_udp_packets_sent_total{{{sel}, "
                    'state="idle"}[$__rate_interval]))',
                    "probes {{host}} -> {{peer}}",
                    ref="B",
                ),
            )
        )
        .with_row(Row("Probes"))
        .with_panel(
            series(
                "Probe outcomes",
                "Probe attempts per second by probe and result (ok, busy, timeout, refused, unreachable, not_allowed, "
                "out_of_turn, fragmentation_needed, error).",
                "ops",
                query(
                    f'sum by (probe, result) (rate(pathprobe_probe_runs_total{{{target(p)}, host=~"$host", '
                    'peer=~"$peer"}[$__rate_interval]))',
                    "{{probe}} {{result}}",
                ),
            )
        )
        .with_panel(
            series(
                "Last successful probe age",
                "Seconds since each probe last succeeded for the path.",
                "s",
                query(
                    f'time() - pathprobe_probe_last_success_timestamp_seconds{{{target(p)}, host=~"$host", '
                    'peer=~"$peer"}',
                    "{{probe}} {{host}} -> {{peer}}",
                ),
            )
        )
    )
