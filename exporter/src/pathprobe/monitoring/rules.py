"""Prometheus recording and alerting rules, rendered from the parameters (params.py).

As the monitoring mixins do, thresholds and windows live in one parameter set instead
of being buried in expressions; `pathprobe alerts render` writes the rule file.
alerts/pathprobe.rules.yml is the rendering of the defaults (a test keeps them equal);
the lab demo renders short windows so that a fire drill takes minutes.
"""

from __future__ import annotations

from typing import Any

import yaml

from .. import ends
from .alerts import exporter_alerts, path_alerts, schedule_alerts
from .common import (
    EXPECTED_RATIO,
    HOST_BOUND,
    PATH,
    PERCENT,
    PREVIOUS_RATIO,
    REGION_PAIR,
    TEST,
    TEST_TEXT,
    Alert,
    rtt_p50,
)
from .culprits import culprit_alerts, culprit_rules
from .evidence import last_test
from .params import Params


def _of_the_test(metric: str) -> str:
    """A template's lookup, when the alert fires, of `metric` for the test the alert is about
    (`{{ with ... }}`: its body reads the series, `{{ end }}` closes it)."""
    return (
        f"{{{{ with printf \"{metric}{{instance='%s',peer='%s',protocol='%s',streams='%s',direction='%s'}}\" "
        "$labels.instance $labels.peer $labels.protocol $labels.streams $labels.direction | query }}"
    )


# The binding limit of the test an alert is about, looked up when it fires (it is not a label
# of the alert: see the ratio's recording rule).
BINDING = _of_the_test("pathprobe_throughput_expected_bytes_per_second") + '{{ . | first | label "limit" }}{{ end }}'
# Whether the last test of an alert's path stopped at a settled rate (a steady-state test) or ran
# to its maximum; nothing for a fixed-length test (the series is absent).
CONVERGED = _of_the_test("pathprobe_throughput_converged") + (
    "{{ if eq (. | first | value) 1.0 }} The last test stopped at a settled rate.{{ else }} The last test never "
    "settled: it ran to its maximum length, and its rate is that of its last two windows (the path's rate "
    "varies).{{ end }}{{ end }}"
)


def _inhibitors_first(alert: Alert) -> tuple[int, int, int]:
    """An alert's place in its group: after every alert that may inhibit it (alertmanager.yml's
    inhibit_rules). Prometheus sends a rule's alerts to Alertmanager as soon as it has evaluated that
    rule, and Alertmanager holds an alert back only behind an inhibiting one it already has: a
    warning evaluated before its critical form is alone there until the critical one's rule has
    run (seconds, on a busy host), and a group that flushes then sends it (a CI fire drill did). So
    the mesh's alerts come first (many exporters down holds back one down), then the culprits' and
    the hosts' (a culprit holds back its paths', a down exporter its host's culprit and its
    paths'), then the paths'; within each, criticals before warnings (a critical form holds back
    its warning form), and a zone before its hosts. The sort is stable: the lists' order decides
    the rest (a down exporter before its host's culprit, an unreachable peer before its path's
    other alerts, an unusable budget file before the exhausted budget)."""
    tier = {"mesh": 0, "path": 2}.get(alert.scope, 1)
    return tier, alert.severity != "critical", alert.scope != "zone"


def render(p: Params) -> dict[str, Any]:
    alerts = sorted(
        [*exporter_alerts(p), *culprit_alerts(p), *path_alerts(p), *_throughput_alerts(p), *schedule_alerts(p)],
        key=_inhibitors_first,
    )
    return {
        "groups": [
            {"name": "pathprobe.recording", "interval": p.evaluation_interval, "rules": _recording(p)},
            {"name": "pathprobe.baseline", "interval": p.baseline_evaluation_interval, "rules": _baseline(p)},
            {"name": "pathprobe.region_pairs", "interval": p.evaluation_interval, "rules": _region_pairs(p)},
            # After the recording group: it reads the paths' recorded ratios (one evaluation behind).
            {"name": "pathprobe.culprits", "interval": p.evaluation_interval, "rules": culprit_rules(p)},
            {"name": "pathprobe.alerts", "interval": p.evaluation_interval, "rules": [a.rule(p) for a in alerts]},
        ]
    }


def _recording(p: Params) -> list[dict[str, str]]:
    """Per path, for the dashboards and the alerts."""
    return [*_throughput_records(p), *_rtt_and_loss_records(p)]


def _throughput_records(p: Params) -> list[dict[str, str]]:
    """Each test's last rate, expected rate, time and ratios to expected."""
    sel = p.selector
    return [
        {
            "record": "path:pathprobe_throughput_bits_per_second:last",
            "expr": f"pathprobe_throughput_bytes_per_second{{{sel}}} * 8",
        },
        {
            "record": "path:pathprobe_throughput_expected_bits_per_second:last",
            "expr": f"pathprobe_throughput_expected_bytes_per_second{{{sel}}} * 8",
        },
        # When each test last ran, recorded with its ratios: the alerts' recency guard reads the same
        # evaluation as the ratios (a raw series is one scrape ahead of a recorded one in another group).
        {
            "record": "path:pathprobe_throughput_last_test_timestamp_seconds:last",
            "expr": f"pathprobe_throughput_last_test_timestamp_seconds{{{sel}}}",
        },
        # Recorded with the ratios, for the same reason: the alerts that leave these tests out read one evaluation.
        {
            "record": HOST_BOUND,
            "expr": f'pathprobe_throughput_host_bound_info{{{sel}, limit=~"{"|".join(ends.HOST_LIMITS)}"}}',
        },
        # The binding limit is not part of a path's identity: a change of it must not restart `for:`.
        {
            "record": EXPECTED_RATIO,
            "expr": f"pathprobe_throughput_bytes_per_second{{{sel}}}\n"
            f"  / ignoring (limit)\n"
            f"pathprobe_throughput_expected_bytes_per_second{{{sel}}}",
        },
        {
            "record": PREVIOUS_RATIO,
            "expr": f"pathprobe_throughput_previous_bytes_per_second{{{sel}}}\n"
            f"  / ignoring (limit)\n"
            f"pathprobe_throughput_expected_bytes_per_second{{{sel}}}",
        },
    ]


def _rtt_and_loss_records(p: Params) -> list[dict[str, str]]:
    """Each path's loss ratio, RTT quantiles and one-way delays."""
    sel, w = p.selector, p.rtt_exporter_window
    return [
        {
            "record": "path:pathprobe_udp_loss_ratio:rate5m",
            "expr": f"rate(pathprobe_udp_packets_lost_total{{{sel}}}[5m])\n"
            f"  / rate(pathprobe_udp_packets_sent_total{{{sel}}}[5m])",
        },
        # RTT quantiles come exact from the exporter (a sliding window, 5 minutes by default; idle samples only).
        # Longer windows are medians of those medians: a summary's quantiles cannot be merged.
        {
            "record": rtt_p50(w),
            "expr": f'max without (quantile, state) (pathprobe_rtt_seconds{{{sel}, state="idle", quantile="0.5"}})',
        },
        {
            "record": f"path:pathprobe_rtt_seconds:p99_{w}",
            "expr": f'max without (quantile, state) (pathprobe_rtt_seconds{{{sel}, state="idle", quantile="0.99"}})',
        },
        {
            "record": rtt_p50(p.rtt_recent_window),
            "expr": f"quantile_over_time(0.5, {rtt_p50(w)}[{p.rtt_recent_window}])",
        },
        # One-way delays, by direction, the same way (exported only while both clocks' bounds allow).
        {
            "record": f"path:pathprobe_owd_seconds:p50_{w}",
            "expr": f'max without (quantile, state) (pathprobe_owd_seconds{{{sel}, state="idle", quantile="0.5"}})',
        },
        {
            "record": f"path:pathprobe_owd_seconds:p50_{p.rtt_recent_window}",
            "expr": f"quantile_over_time(0.5, path:pathprobe_owd_seconds:p50_{w}[{p.rtt_recent_window}])",
        },
    ]


def _baseline(p: Params) -> list[dict[str, str]]:
    return [
        {
            "record": rtt_p50(p.rtt_baseline_window),
            # A 30-minute step by default: the median over days needs no finer grain, and a query stays small.
            "expr": f"quantile_over_time(0.5, {rtt_p50(p.rtt_exporter_window)}"
            f"[{p.rtt_baseline_window}:{p.rtt_baseline_step}])",
        },
        {
            "record": f"path:pathprobe_owd_seconds:p50_{p.rtt_baseline_window}",
            "expr": f"quantile_over_time(0.5, path:pathprobe_owd_seconds:p50_{p.rtt_exporter_window}"
            f"[{p.rtt_baseline_window}:{p.rtt_baseline_step}])",
        },
    ]


def _region_pairs(p: Params) -> list[dict[str, str]]:
    # The global view (docs/fleet.md): per ordered region pair, from every path between them
    # that this Prometheus scrapes. A regional Prometheus scrapes its region's exporters, so it
    # holds every pair whose source is its region; it remote-writes these to the global one.
    # The worst path of each pair (a mean over paths would hide the one broken path).
    sel, idle, test = p.selector, 'state="idle"', f"{REGION_PAIR}, protocol, streams, direction"
    w = p.rtt_exporter_window
    return [
        {
            "record": "region_pair:pathprobe_paths:count",
            "expr": f"count by ({REGION_PAIR}) (pathprobe_peer_info{{{sel}}})",
        },
        {
            "record": "region_pair:pathprobe_throughput_expected_ratio:min",
            "expr": f"min by ({test}) ({EXPECTED_RATIO})",
        },
        {
            "record": "region_pair:pathprobe_throughput_bits_per_second:max",
            "expr": f"max by ({test}) (path:pathprobe_throughput_bits_per_second:last)",
        },
        {
            "record": "region_pair:pathprobe_throughput_last_test_timestamp_seconds:max",
            "expr": f"max by ({REGION_PAIR}) (path:pathprobe_throughput_last_test_timestamp_seconds:last)",
        },
        {
            "record": f"region_pair:pathprobe_rtt_seconds:max_p50_{w}",
            "expr": f"max by ({REGION_PAIR}, protocol) ({rtt_p50(w)})",
        },
        {
            "record": f"region_pair:pathprobe_rtt_seconds:max_p99_{w}",
            "expr": f"max by ({REGION_PAIR}, protocol) (path:pathprobe_rtt_seconds:p99_{w})",
        },
        # Absent while no path is unreachable; the outcome counters have no peer_region: from peer_info.
        {
            "record": "region_pair:pathprobe_paths_unreachable:count",
            "expr": f"count by ({REGION_PAIR}) (\n"
            f'  (sum by ({PATH}, region) (increase(pathprobe_probe_runs_total{{{sel}, probe="rtt", '
            f'result="ok"}}[5m])) == 0)\n'
            f"  * on ({PATH}) group_left (peer_region) pathprobe_peer_info{{{sel}}}\n)",
        },
        {
            "record": "region_pair:pathprobe_udp_loss_ratio:max_rate5m",
            "expr": f"max by ({REGION_PAIR}) (path:pathprobe_udp_loss_ratio:rate5m{{{idle}}})",
        },
    ]


def throughput_best_of_two(p: Params) -> tuple[str, str]:
    """What the throughput alerts compare with their ratios: the better of each test's last two
    results to expected (none before its second result: a fresh path's first test alone never
    fires; a missed test holds both), and the condition that its last test came within
    throughput_window (older results neither fire nor hold an alert: PathprobeThroughputResultsStale
    says they stopped)."""
    best = f"({EXPECTED_RATIO} >= {PREVIOUS_RATIO}\n  or {PREVIOUS_RATIO})"
    recent = (
        f"and on ({TEST})\nchanges(path:pathprobe_throughput_last_test_timestamp_seconds:last"
        f"{{{p.selector}}}[{p.throughput_window}]) >= 1"
    )
    return best, recent


# Which host's end an alert on a test bound by its own ends names: the sender is the exporter's host
# for a send test and the peer for a receive test (iperf3 -R), the receiver the other.
ENDS = (
    '{{ $receiver := $labels.peer }}{{ $sender := $labels.host }}{{ if eq $labels.direction "receive" }}'
    "{{ $receiver = $labels.host }}{{ $sender = $labels.peer }}{{ end }}"
)
HOST_BOUND_TEXT = (
    '{{ if eq $labels.limit "sender_cpu" }}the sender\'s CPU ({{ $sender }}){{ else if eq $labels.limit '
    "\"receiver_cpu\" }}the receiver's CPU ({{ $receiver }}){{ else }}the receiver's UDP socket buffer "
    "({{ $receiver }}){{ end }}"
)
REMEDY_TEXT = (
    "".join(
        f'{{{{ {"if" if i == 0 else "else if"} eq $labels.remedy "{key}" }}}}{text}'
        for i, (key, text) in enumerate(ends.REMEDIES.items())
    )
    + "{{ end }}"
)


def _throughput_alerts(p: Params) -> list[Alert]:
    sel, test_text = p.selector, TEST_TEXT
    ratio = EXPECTED_RATIO
    best, recent = throughput_best_of_two(p)
    # A test whose last result measured its own ends is PathprobeThroughputTestHostBound's.
    path_only = f"unless on ({TEST}) {HOST_BOUND}"
    evidence = CONVERGED + last_test(p)  # how the last test ended, and its record
    return [
        Alert(
            name="PathprobeThroughputBelowExpected",
            expr=f"{best} < {p.throughput_ratio_warning:g}\n{recent}\n{path_only}",
            severity="warning",
            summary="Path throughput below its expected limit.",
            description=f"{test_text}: the last two tests reached at most "
            "{{ $value | humanizePercentage }} of expected (binding limit: " + BINDING + ")." + evidence,
        ),
        Alert(
            name="PathprobeThroughputFarBelowExpected",
            expr=f"{best} < {p.throughput_ratio_critical:g}\n{recent}\n{path_only}",
            severity="critical",
            summary="Path throughput far below its expected limit.",
            description=f"{test_text}: the last two tests reached at most "
            "{{ $value | humanizePercentage }} of expected (binding limit: " + BINDING + ")." + evidence,
        ),
        Alert(
            name="PathprobeTransitGatewayNearLimit",
            expr=f'{ratio}{{path_class="transit_gateway"}} > {p.tgw_utilisation_warning:g}\n'
            f'and ignoring (limit) pathprobe_throughput_expected_bytes_per_second{{{sel}, limit="transit_gateway"}}',
            severity="warning",
            summary="A Transit Gateway path runs near its attachment limit.",
            description=f"{test_text} reached {PERCENT} of the Transit Gateway attachment limit: "
            "plan capacity (more attachments, or VPC peering).",
        ),
        Alert(
            name="PathprobeThroughputTestHostBound",
            # Its last test: an end saturated while the test fell short of what the path should give.
            # A saturated end at the expected rate held nothing back (the path's limit came first).
            expr=f"{HOST_BOUND}\nand on ({TEST}) {ratio} < {p.throughput_ratio_warning:g}\n{recent}",
            severity="warning",
            summary="A throughput test measured its own host, not the path.",
            description=ENDS
            + f"{test_text}: the last test reached "
            + _of_the_test(EXPECTED_RATIO)
            + "{{ . | first | value | humanizePercentage }}{{ end }} of expected, bound by "
            + HOST_BOUND_TEXT
            + ", not by the path, so this host cannot test the path at its rate and the path's throughput alerts "
            "leave these tests out: " + REMEDY_TEXT + ".",
            scope="host",
        ),
    ]


HEADER = """\
# Generated by `pathprobe alerts render` from the parameters in
# exporter/src/pathprobe/monitoring/params.py (documented in alerts/README.md). Do not edit:
# change the parameters (a YAML file for --params) and render again.
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, as people write them."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _str)


def dump(p: Params) -> str:
    return HEADER + yaml.dump(render(p), Dumper=_Dumper, sort_keys=False, width=1000)
