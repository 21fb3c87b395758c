"""Prometheus recording and alerting rules, rendered from the parameters (params.py).

As the monitoring mixins do, thresholds and windows live in one parameter set instead
of being buried in expressions; `pathprobe alerts render` writes the rule file.
alerts/pathprobe.rules.yml is the rendering of the defaults (a test keeps them equal);
the lab demo renders short windows so that a fire drill takes minutes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

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

# One exporter: its target labels.
HOST = "job, instance, host, region"
# Labels that identify one measured path on one exporter (target labels + peer side).
PATH = "instance, peer"
TEST = "instance, peer, protocol, streams, direction"
# One ordered pair of regions (the source's target label, the peer's): what the global view keeps.
REGION_PAIR = "region, peer_region"
# The series a regional Prometheus sends to the global one (remote write), and nothing per host.
REGION_PAIR_SERIES = "region_pair:.+"


# The labels of a path that its source's target labels do not carry, from pathprobe_peer_info:
# the peer's region and zone, the path's class and the Transit Gateway attachments it crosses.
PATH_SIDES = "peer_region, peer_zone, path_class, attachment, peer_attachment"
# The scopes of the alerts (the `scope` label): what one alert is about, and so which per-path
# alerts a culprit explains (alertmanager.yml inhibits those).
SCOPES = ("path", "host", "zone", "region_pair", "transit_gateway", "mesh")


@dataclass(frozen=True)
class Alert:
    """One alerting rule, mixin style: CamelCase name, severity, summary, description, runbook link;
    `scope` says what it is about. A per-path alert carries every label of its path (PATH_SIDES), so
    that Alertmanager can match it with the culprit that explains it."""

    name: str
    expr: str
    severity: str
    summary: str
    description: str
    for_: str | None = None
    scope: str = "path"
    keep_firing_for: str | None = None

    def rule(self, p: Params) -> dict[str, Any]:
        expr = self.expr.strip()
        if self.scope == "path":
            expr = _with_path_sides(p, f"({expr})")
        rule: dict[str, Any] = {"alert": self.name, "expr": expr}
        if self.for_:
            rule["for"] = self.for_
        if self.keep_firing_for:
            rule["keep_firing_for"] = self.keep_firing_for
        rule["labels"] = {"severity": self.severity, "scope": self.scope}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{p.runbook_url_base}#{self.name.lower()}",
        }
        return rule


def duration_seconds(duration: str) -> int:
    """A Prometheus duration (e.g. 1d, 2h, 30m) in seconds, for comparisons with time()."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return int(float(duration[:-1]) * units[duration[-1]])


PATH_TEXT = "{{ $labels.host }} ({{ $labels.region }}) -> {{ $labels.peer }} ({{ $labels.peer_region }})"
TEST_TEXT = PATH_TEXT + " {{ $labels.protocol }} x{{ $labels.streams }} {{ $labels.direction }}"


def render(p: Params) -> dict[str, Any]:
    alerts = [*_culprit_alerts(p), *_throughput_alerts(p), *_path_alerts(p), *_schedule_alerts(p),
              *_exporter_alerts(p)]  # fmt: skip
    return {
        "groups": [
            {"name": "pathprobe.recording", "interval": p.evaluation_interval, "rules": _recording(p)},
            {"name": "pathprobe.baseline", "interval": p.baseline_evaluation_interval, "rules": _baseline(p)},
            {"name": "pathprobe.region_pairs", "interval": p.evaluation_interval, "rules": _region_pairs(p)},
            # After the recording group: it reads the paths' recorded ratios (one evaluation behind).
            {"name": "pathprobe.culprits", "interval": p.evaluation_interval, "rules": _culprits(p)},
            {"name": "pathprobe.alerts", "interval": p.evaluation_interval, "rules": [a.rule(p) for a in alerts]},
        ]
    }


def _recording(p: Params) -> list[dict[str, str]]:
    """Per path, for the dashboards and the alerts."""
    sel, w = p.selector, p.rtt_exporter_window
    return [
        {"record": "path:pathprobe_throughput_bits_per_second:last",
         "expr": f"pathprobe_throughput_bytes_per_second{{{sel}}} * 8"},
        {"record": "path:pathprobe_throughput_expected_bits_per_second:last",
         "expr": f"pathprobe_throughput_expected_bytes_per_second{{{sel}}} * 8"},
        # When each test last ran, recorded with its ratios: the alerts' recency guard reads the same
        # evaluation as the ratios (a raw series is one scrape ahead of a recorded one in another group).
        {"record": "path:pathprobe_throughput_last_test_timestamp_seconds:last",
         "expr": f"pathprobe_throughput_last_test_timestamp_seconds{{{sel}}}"},
        # The binding limit is not part of a path's identity: a change of it must not restart `for:`.
        {"record": EXPECTED_RATIO,
         "expr": f"pathprobe_throughput_bytes_per_second{{{sel}}}\n"
                 f"  / ignoring (limit)\n"
                 f"pathprobe_throughput_expected_bytes_per_second{{{sel}}}"},
        {"record": PREVIOUS_RATIO,
         "expr": f"pathprobe_throughput_previous_bytes_per_second{{{sel}}}\n"
                 f"  / ignoring (limit)\n"
                 f"pathprobe_throughput_expected_bytes_per_second{{{sel}}}"},
        {"record": "path:pathprobe_udp_loss_ratio:rate5m",
         "expr": f"rate(pathprobe_udp_packets_lost_total{{{sel}}}[5m])\n"
                 f"  / rate(pathprobe_udp_packets_sent_total{{{sel}}}[5m])"},
        # RTT quantiles come exact from the exporter (a sliding window, 5 minutes by default; idle samples only).
        # Longer windows are medians of those medians: a summary's quantiles cannot be merged.
        {"record": rtt_p50(w),
         "expr": f'max without (quantile, state) (pathprobe_rtt_seconds{{{sel}, state="idle", quantile="0.5"}})'},
        {"record": f"path:pathprobe_rtt_seconds:p99_{w}",
         "expr": f'max without (quantile, state) (pathprobe_rtt_seconds{{{sel}, state="idle", quantile="0.99"}})'},
        {"record": rtt_p50(p.rtt_recent_window),
         "expr": f"quantile_over_time(0.5, {rtt_p50(w)}[{p.rtt_recent_window}])"},
        # One-way delays, by direction, the same way (exported only while both clocks' bounds allow).
        {"record": f"path:pathprobe_owd_seconds:p50_{w}",
         "expr": f'max without (quantile, state) (pathprobe_owd_seconds{{{sel}, state="idle", quantile="0.5"}})'},
        {"record": f"path:pathprobe_owd_seconds:p50_{p.rtt_recent_window}",
         "expr": f"quantile_over_time(0.5, path:pathprobe_owd_seconds:p50_{w}[{p.rtt_recent_window}])"},
    ]  # fmt: skip


def _baseline(p: Params) -> list[dict[str, str]]:
    return [
        {"record": rtt_p50(p.rtt_baseline_window),
         # A 30-minute step by default: the median over days needs no finer grain, and a query stays small.
         "expr": f"quantile_over_time(0.5, {rtt_p50(p.rtt_exporter_window)}"
                 f"[{p.rtt_baseline_window}:{p.rtt_baseline_step}])"},
        {"record": f"path:pathprobe_owd_seconds:p50_{p.rtt_baseline_window}",
         "expr": f"quantile_over_time(0.5, path:pathprobe_owd_seconds:p50_{p.rtt_exporter_window}"
                 f"[{p.rtt_baseline_window}:{p.rtt_baseline_step}])"},
    ]  # fmt: skip


def _region_pairs(p: Params) -> list[dict[str, str]]:
    # The global view (docs/fleet.md): per ordered region pair, from every path between them
    # that this Prometheus scrapes. A regional Prometheus scrapes its region's exporters, so it
    # holds every pair whose source is its region; it remote-writes these to the global one.
    # The worst path of each pair (a mean over paths would hide the one broken path).
    sel, idle, test = p.selector, 'state="idle"', f"{REGION_PAIR}, protocol, streams, direction"
    w = p.rtt_exporter_window
    return [
        {"record": "region_pair:pathprobe_paths:count",
         "expr": f"count by ({REGION_PAIR}) (pathprobe_peer_info{{{sel}}})"},
        {"record": "region_pair:pathprobe_throughput_expected_ratio:min",
         "expr": f"min by ({test}) ({EXPECTED_RATIO})"},
        {"record": "region_pair:pathprobe_throughput_bits_per_second:max",
         "expr": f"max by ({test}) (path:pathprobe_throughput_bits_per_second:last)"},
        {"record": "region_pair:pathprobe_throughput_last_test_timestamp_seconds:max",
         "expr": f"max by ({REGION_PAIR}) (path:pathprobe_throughput_last_test_timestamp_seconds:last)"},
        {"record": f"region_pair:pathprobe_rtt_seconds:max_p50_{w}",
         "expr": f"max by ({REGION_PAIR}, protocol) ({rtt_p50(w)})"},
        {"record": f"region_pair:pathprobe_rtt_seconds:max_p99_{w}",
         "expr": f"max by ({REGION_PAIR}, protocol) (path:pathprobe_rtt_seconds:p99_{w})"},
        # Absent while no path is unreachable; the outcome counters have no peer_region: from peer_info.
        {"record": "region_pair:pathprobe_paths_unreachable:count",
         "expr": f"count by ({REGION_PAIR}) (\n"
                 f'  (sum by ({PATH}, region) (increase(pathprobe_probe_runs_total{{{sel}, probe="rtt", '
                 f'result="ok"}}[5m])) == 0)\n'
                 f"  * on ({PATH}) group_left (peer_region) pathprobe_peer_info{{{sel}}}\n)"},
        {"record": "region_pair:pathprobe_udp_loss_ratio:max_rate5m",
         "expr": f"max by ({REGION_PAIR}) (path:pathprobe_udp_loss_ratio:rate5m{{{idle}}})"},
    ]  # fmt: skip


# A path's state for the culprits: 0 good, 1 bad (a warning threshold crossed), 2 bad at a critical one.
BAD = "path:pathprobe_path_bad:level"
# Bad paths that a named zone, host or attachment explains (value: the path's level; `scope`: which).
EXPLAINED = "path:pathprobe_path_explained:level"
CULPRIT = "culprit:pathprobe_culprit:level"
# A culprit's alerts by scope: the warning one while it is named, the critical one (the level 2)
# while most of its paths are bad at a critical threshold too, while its paths' idle echoes, added
# up, lose more than the critical loss ratio, or while a per-path critical alert that it explains
# fires. Not "a few paths at a critical level": a culprit of hundreds of paths at a warning-level
# fault has a few past the critical line by chance in any window; and a fault at the critical line
# itself leaves many paths just below it by chance (a lab path's window holds ~100 echoes), where
# the sum over all of them does not waver. But a per-path critical alert (its own window and `for`
# past) is a page: alertmanager.yml holds it back behind the culprit that explains it, of either
# severity, so the culprit turns critical in its place, and the page names the culprit. Two alerts,
# not one whose severity follows the level: a label that changes starts a new alert, and its `for`
# would leave a gap in the inhibitions.
CULPRIT_ALERTS = {"host": "PathprobeHostDegraded", "zone": "PathprobeZoneDegraded",
                  "region_pair": "PathprobeRegionPairDegraded",
                  "transit_gateway": "PathprobeTransitGatewayAttachmentDegraded"}  # fmt: skip
CULPRIT_CRITICAL_ALERTS = {scope: name.replace("Degraded", "Failing") for scope, name in CULPRIT_ALERTS.items()}
PATHS, PATHS_BAD, PATHS_CRITICAL = ("culprit:pathprobe_paths:count", "culprit:pathprobe_paths_bad:count",
                                    "culprit:pathprobe_paths_critical:count")  # fmt: skip
# The per-path alerts a culprit explains (alertmanager.yml's inhibitions name the same), and how many
# of them fire at critical severity over each candidate culprit's paths that no culprit named before
# it explains.
EXPLAINABLE = "PathprobeThroughput(Far)?BelowExpected|PathprobeRtt.*|PathprobePacketLoss.*|PathprobePeerUnreachable"
CRITICAL_ALERTS = "culprit:pathprobe_path_critical_alerts:count"
# Idle UDP echoes lost and sent in the loss window: per path (with every label of the path; lost
# only where some were), and over each candidate culprit's paths that no culprit named before it explains.
PATH_IDLE_LOST, PATH_IDLE_SENT = ("path:pathprobe_udp_idle_packets_lost:increase",
                                  "path:pathprobe_udp_idle_packets_sent:increase")  # fmt: skip
# The share of its idle echoes a path lost, where it lost loss_min_lost_packets or more: what the
# loss signal and both loss alerts read. At a thousand hosts each of them dividing every path's
# counts again took 3-4 s of an evaluation; the lossy paths are few.
PATH_IDLE_LOSS = "path:pathprobe_udp_idle_packets_lost:ratio"
# RTT probe runs of each path in the unreachable window, by result: read twice by the reachability
# signal (no answer, and failed probes) and by PathprobePeerUnreachable, computed once.
RTT_RUNS = "path:pathprobe_rtt_probe_runs:increase"
IDLE_LOST, IDLE_SENT = "culprit:pathprobe_udp_idle_packets_lost:sum", "culprit:pathprobe_udp_idle_packets_sent:sum"
# The source's labels that identify a path (the target labels and the peer).
SOURCE = "job, instance, host, region, zone, peer"
# Recorded series that several rules read, named once.
EXPECTED_RATIO = "path:pathprobe_throughput_expected_ratio:last"
PREVIOUS_RATIO = "path:pathprobe_throughput_previous_expected_ratio:last"  # the test before the last, to expected
SENT_RATIO = EXPECTED_RATIO + '{direction="send"}'  # the tests a host sent: its egress
RTT_OK = f'{RTT_RUNS}{{result="ok"}}'


def rtt_p50(window: str) -> str:
    """The recorded idle RTT median over `window` (the exporter's own window, or a median of it)."""
    return f"path:pathprobe_rtt_seconds:p50_{window}"


def _with(expr: str, **labels: str) -> str:
    """expr with constant labels added."""
    for name, value in labels.items():
        expr = f'label_replace({expr}, "{name}", "{value}", "", "")'
    return expr


def _copy(expr: str, **renames: str) -> str:
    """expr with each label (key) set from another (value)."""
    for dst, src in renames.items():
        expr = f'label_replace({expr}, "{dst}", "$1", "{src}", "(.*)")'
    return expr


# The candidate culprits, by scope, and the paths through each. A host and a Transit Gateway
# attachment are candidates as senders (egress) and as receivers (ingress) apart; a zone counts the
# paths from it and to it (a path inside it twice); a region pair is one direction. The ingress forms
# also carry the peer-side label (peer, peer_attachment) that the per-path alerts they explain carry,
# and a zone its name as peer_zone too: alertmanager.yml's inhibitions match on them.
def _candidates(agg: str, series: Callable[[str], str]) -> dict[str, str]:
    """`agg` ("count" or "sum") of `series(matchers)` (per path) over each candidate's paths, by scope."""

    def by(labels: str, matchers: str = "") -> str:
        return f"{agg} by ({labels}) ({series(matchers)})"

    zoned, peer_zoned, attached, peer_attached = 'zone!=""', 'peer_zone!=""', 'attachment!=""', 'peer_attachment!=""'
    zone_in = _copy(by("peer_zone, peer_region", peer_zoned), zone="peer_zone", region="peer_region")
    zone = f"sum by (zone, region) (\n  {by('zone, region', zoned)}\n  or {_with(zone_in, end='ingress')}\n)"
    host_in = _copy(by("peer, peer_region, peer_zone"), host="peer", region="peer_region", zone="peer_zone")
    tgw_in = _copy(by("peer_attachment, peer_region", peer_attached), attachment="peer_attachment",
                   region="peer_region")  # fmt: skip
    tgw_in = f"max without (peer_region) ({tgw_in})"
    return {
        "zone": _with(_copy(zone, peer_zone="zone"), scope="zone"),
        "host": f"{_with(by('host, region, zone'), scope='host', side='egress')}\n"
                f"or {_with(f'max without (peer_region, peer_zone) ({host_in})', scope='host', side='ingress')}",
        "transit_gateway": f"{_with(by('attachment, region', attached), scope='transit_gateway', side='egress')}\n"
                           f"or {_with(tgw_in, scope='transit_gateway', side='ingress')}",
        "region_pair": _with(by("region, peer_region"), scope="region_pair"),
    }  # fmt: skip


def _named(p: Params, scope: str, bad: str, paths: str) -> str:
    """The culprits of a scope: `bad` (per candidate: its bad paths that no culprit named before
    explains) is at least culprit_min_bad_paths and culprit_bad_share of `paths` (its paths that no
    culprit named before explains). The value is 2 when that share of all its paths is bad at a
    critical threshold, when all its paths' idle echoes together lose more than the critical loss
    ratio (and at least loss_min_lost_packets), or when a per-path critical alert it explains fires
    (CRITICAL_ALERTS), else 1."""
    m = f'{{scope="{scope}"}}'
    critical_share = f"({PATHS_CRITICAL}{m} / {PATHS}{m} >= bool {p.culprit_bad_share:g})"
    critical_loss = (f"({IDLE_LOST}{m} / {IDLE_SENT}{m} > bool {p.loss_ratio_critical:g})"
                     f" * ({IDLE_LOST}{m} >= bool {p.loss_min_lost_packets})")  # fmt: skip
    critical_alert = f"({CRITICAL_ALERTS}{m} >= bool 1)"
    # A candidate without echoes has no loss sum, one without critical alerts no count: 0 for them.
    return (f"1 + clamp_max({critical_share} + ({critical_loss} or 0 * {critical_share})\n"
            f"  + ({critical_alert} or 0 * {critical_share}), 1)\n"
            f"and ({bad} >= {p.culprit_min_bad_paths}) / {paths} >= {p.culprit_bad_share:g}")  # fmt: skip


def _idle_udp(p: Params, counter: str) -> str:
    """Idle UDP echo packets (`counter`: lost or sent) of each path in the loss window."""
    return (
        f'sum by ({SOURCE}) (increase(pathprobe_udp_packets_{counter}_total{{{p.selector}, state="idle"}}'
        f"[{p.loss_window}]))"
    )


def path_signals(p: Params) -> dict[str, str]:
    """Each signal's bad paths, at the alerts' own thresholds (throughput: its latest test, not the
    alerts' window of tests): 1 bad, 2 bad at a critical threshold (throughput, loss) or unreachable;
    a path that a signal finds good is not in its expression. Loss, RTT and reachability are round
    trips: a fault on them marks both directions of a path. Bad paths only, filtered before any
    arithmetic: at a thousand hosts each operation over every path costs a fraction of a second of
    the culprit group's interval, and healthy paths are most of them (_measured_paths gives those a 0)."""
    # Tests this host sent: a receive test measures the peer's egress under this host's labels.
    ratio = f"min by ({SOURCE}) ({SENT_RATIO})"
    recent, base = rtt_p50(p.rtt_recent_window), rtt_p50(p.rtt_baseline_window)
    ok, failed = RTT_OK, f'{RTT_RUNS}{{result!="ok"}}'
    return {
        # The critical ratio is below the warning one, the critical loss above it.
        "throughput": f"1 + ({ratio} < {p.throughput_ratio_warning:g} < bool {p.throughput_ratio_critical:g})",
        "loss": f"1 + ({PATH_IDLE_LOSS} > {p.loss_ratio_warning:g} > bool {p.loss_ratio_critical:g})",
        "rtt": f"max by ({SOURCE}) (\n  ({recent} > {p.rtt_baseline_ratio:g} * {base}) - {base}\n"
               f"  > {p.rtt_baseline_min_increase_seconds:g}\n) * 0 + 1",
        # Unreachable: no answer and failed probes (a path without RTT probes stays good).
        "reachability": f"max by ({SOURCE}) ({ok} == 0 and on ({PATH}) {failed} > 0) * 0 + 2",
    }  # fmt: skip


def _measured_paths(p: Params) -> str:
    """Every path that a signal measures (what path_signals reads), with the value 0."""
    inputs = (SENT_RATIO, PATH_IDLE_SENT, rtt_p50(p.rtt_recent_window), RTT_OK)
    return "0 * (\n  " + "\n  or ".join(f"group by ({SOURCE}) ({series})" for series in inputs) + "\n)"


def _path_level(p: Params) -> str:
    """Each path's state (path_signals: the worst of its signals, or 0), with every label of the path."""
    terms = "\n  or ".join(_with(f"({expr})", signal=name) for name, expr in path_signals(p).items())
    return _with_path_sides(p, f"max by ({SOURCE}) (\n  {terms}\n  or {_measured_paths(p)}\n)")


def _with_path_sides(p: Params, expr: str) -> str:
    """A per-path expr with the labels of its path that its source's do not carry (PATH_SIDES)."""
    return f"{expr}\n* on ({PATH}) group_left ({PATH_SIDES}) pathprobe_peer_info{{{p.selector}}}"


def _critical_alerts(matchers: str) -> str:
    """The per-path critical alerts firing that a culprit explains (EXPLAINABLE), with `matchers`."""
    return (f'ALERTS{{alertstate="firing", scope="path", severity="critical", alertname=~"{EXPLAINABLE}"'
            f"{', ' + matchers if matchers else ''}}}")  # fmt: skip


def _selected(series: str, matchers: str) -> str:
    """`series` with `matchers` (none: all of it)."""
    return f"{series}{{{matchers}}}" if matchers else series


def _culprits(p: Params) -> list[dict[str, Any]]:
    """Localization (alerts/runbook.md, "Culprits"): the host, zone, Transit Gateway attachment or region
    pair most of whose paths are bad. The rules of a group run in order, each seeing the ones before:
    zones are named first, then hosts outside named zones (a zone's loss makes each of its hosts look
    bad), then attachments and region pairs; each of those on the paths that no zone (or host, or
    attachment) named before explains: the paths into a lossy zone are its, not the hosts' at their
    other ends, and a host's fault can make its region's pairs look bad."""

    def level(matchers: str, condition: str = "") -> str:
        return _selected(BAD, matchers) + condition

    def named(scope: str, explained: str) -> str:
        """The scope's culprits, counting only its paths outside `explained` (the paths that
        culprits named before explain)."""
        bad = _candidates("count", lambda m: f"({level(m, ' >= 1')} unless on ({PATH}) ({explained}))")
        paths = _candidates("count", lambda m: f"({level(m)} unless on ({PATH}) ({explained}))")
        return _named(p, scope, f"({bad[scope]})", f"({paths[scope]})")

    def evidence(scope: str, explained: str | None) -> list[dict[str, Any]]:
        """What raises the scope's culprits to critical besides their paths' levels: their idle echoes
        lost and sent, and the per-path critical alerts firing, over their paths outside `explained`
        (None: all of them). A culprit's loss and alerts are its own, not those of a lossy zone that
        some of its paths run into (that zone's page has them). Lost echoes and alerts are on few
        paths; the echoes sent, on all: their sum (once: each costs a thousand hosts' group a second)
        less that of the (few) explained paths, or of none (PATHS: every candidate)."""

        def own(agg: str, series: Callable[[str], str]) -> str:
            if explained is None:
                return _candidates(agg, series)[scope]
            return _candidates(agg, lambda m: f"({series(m)} unless on ({PATH}) ({explained}))")[scope]

        lost, alerts = own("sum", functools.partial(_selected, PATH_IDLE_LOST)), own("count", _critical_alerts)
        sent = f"({_candidates('sum', functools.partial(_selected, PATH_IDLE_SENT))[scope]})"
        if explained is not None:
            gone = _candidates("sum", lambda m: f"({_selected(PATH_IDLE_SENT, m)} and on ({PATH}) ({explained}))")
            sent = f'{sent}\n- ({gone[scope]}\n  or 0 * {PATHS}{{scope="{scope}"}})'
        return [{"record": record, "expr": expr, "labels": {"scope": scope}}
                for record, expr in ((IDLE_LOST, lost), (IDLE_SENT, sent), (CRITICAL_ALERTS, alerts))]  # fmt: skip

    def explains(scope: str, side: str, on: str) -> str:
        side_matcher = f', side="{side}"' if side else ""
        return f'{BAD} >= 1 and on ({on}) {CULPRIT}{{scope="{scope}"{side_matcher}}}'

    by_zone = [explains("zone", "", "zone"), explains("zone", "", "peer_zone")]
    by_host = [explains("host", "egress", "host"), explains("host", "ingress", "peer")]
    by_attachment = [explains("transit_gateway", "egress", "attachment"),
                     explains("transit_gateway", "ingress", "peer_attachment")]  # fmt: skip
    zone = '{scope="zone"}'
    zone_named = _named(p, "zone", PATHS_BAD + zone, PATHS + zone)
    # The paths that the culprits named before each scope's explain.
    before = {"host": EXPLAINED + zone, "transit_gateway": EXPLAINED + '{scope=~"zone|host"}',
              "region_pair": EXPLAINED}  # fmt: skip

    def filled(agg: str, series: Callable[[str], str]) -> str:
        """`agg` of `series` (the few bad or lossy paths) over each candidate's paths, and 0 for the
        other candidates (PATHS): an aggregation over every path costs a thousand hosts' culprit
        group a second of its interval."""
        return "\nor ".join(_candidates(agg, series).values()) + f"\nor 0 * {PATHS}"

    # The hosts measuring from each zone: its host candidates as senders.
    zone_hosts = f'count by (zone) ({PATHS}{{scope="host", side="egress", zone!=""}})'
    return [
        {"record": PATH_IDLE_LOST, "expr": _with_path_sides(p, f"({_idle_udp(p, 'lost')} > 0)")},
        {"record": PATH_IDLE_SENT, "expr": _with_path_sides(p, _idle_udp(p, "sent"))},
        {"record": PATH_IDLE_LOSS, "expr": f"({PATH_IDLE_LOST} >= {p.loss_min_lost_packets})\n  / {PATH_IDLE_SENT}"},
        {"record": RTT_RUNS, "expr": f'sum by ({SOURCE}, result) (increase(pathprobe_probe_runs_total{{{p.selector}, '
                                    f'probe="rtt"}}[{p.unreachable_window}]))'},
        {"record": BAD, "expr": _path_level(p)},
        {"record": PATHS, "expr": "\nor ".join(_candidates("count", level).values())},
        {"record": PATHS_BAD, "expr": filled("count", lambda m: level(m, " >= 1"))},
        {"record": PATHS_CRITICAL, "expr": filled("count", lambda m: level(m, " >= 2"))},
        *evidence("zone", None),
        # A zone of one (measuring) host is that host: its own culprit names it.
        {"record": CULPRIT, "expr": f"{zone_named}\nand on (zone) {zone_hosts} >= 2", "labels": {"scope": "zone"}},
        {"record": EXPLAINED, "expr": "\nor ".join(by_zone), "labels": {"scope": "zone"}},
        *evidence("host", before["host"]),
        {"record": CULPRIT, "expr": f'({named("host", before["host"])})\nunless on (zone) {CULPRIT}{zone}',
         "labels": {"scope": "host"}},
        {"record": EXPLAINED, "expr": "\nor ".join(by_host), "labels": {"scope": "host"}},
        # Each rule reads the explained paths recorded before it in this evaluation: the ones recorded
        # after it are the last evaluation's until they are recorded again (a culprit would leave out its own).
        *evidence("transit_gateway", before["transit_gateway"]),
        {"record": CULPRIT, "expr": named("transit_gateway", before["transit_gateway"]),
         "labels": {"scope": "transit_gateway"}},
        {"record": EXPLAINED, "expr": "\nor ".join(by_attachment), "labels": {"scope": "transit_gateway"}},
        *evidence("region_pair", before["region_pair"]),
        {"record": CULPRIT, "expr": named("region_pair", before["region_pair"]), "labels": {"scope": "region_pair"}},
    ]  # fmt: skip


def _culprit_alerts(p: Params) -> list[Alert]:
    """Two alerts per scope of culprit (CULPRIT_ALERTS); each inhibits the per-path alerts it explains
    (alertmanager.yml)."""

    def evidence(scope: str, *labels: str) -> str:
        match = ",".join(f"{name}='%s'" for name in labels)
        args = " ".join(f"$labels.{name}" for name in labels)
        counts = [
            f"{{{{ with printf \"{record}{{scope='{scope}',{match}}}\" {args} | query }}}}"
            "{{ . | first | value }}{{ end }}"
            for record in (PATHS_BAD, PATHS_CRITICAL, PATHS)
        ]
        selector = f"{{scope='{scope}',{match}}}"
        loss = (f"{{{{ with printf \"{IDLE_LOST}{selector} / {IDLE_SENT}{selector}\" {args} {args} | query }}}}"
                "; their idle echoes lose {{ . | first | value | humanizePercentage }} together{{ end }}")  # fmt: skip
        alerts = (f"{{{{ with printf \"{CRITICAL_ALERTS}{selector}\" {args} | query }}}}"
                  "; {{ . | first | value }} of their own critical alerts firing (held back){{ end }}")  # fmt: skip
        return f"{counts[0]} of its {counts[2]} paths are bad ({counts[1]} critically{loss}{alerts})"

    scopes = {
        "host": ("through one host",
                 "{{ $labels.host }} ({{ $labels.region }} {{ $labels.zone }}), {{ $labels.side }}: "
                 + evidence("host", "side", "host") + " (throughput below expected, loss, RTT above baseline or no "
                 "answer), while its peers' other paths are not: check its instance allowances "
                 "(pathprobe_ena_allowance_exceeded_total) first."),
        "zone": ("through one availability zone",
                 "{{ $labels.zone }} ({{ $labels.region }}): " + evidence("zone", "zone") + ", from and to its hosts."),
        "region_pair": ("from one region to another", "{{ $labels.region }} -> {{ $labels.peer_region }}: "
                        + evidence("region_pair", "region", "peer_region") + ", from hosts that reach their other "
                        "peers well: the regions' interconnect, not a host."),
        "transit_gateway": ("over one Transit Gateway attachment", "{{ $labels.attachment }} ({{ $labels.region }}), "
                            "{{ $labels.side }}: " + evidence("transit_gateway", "side", "attachment") + " over it."),
    }  # fmt: skip
    alerts = []
    for scope, (what, description) in scopes.items():
        named = f'{CULPRIT}{{scope="{scope}"}}'
        alerts += [
            Alert(CULPRIT_ALERTS[scope], named, "warning", f"Most paths {what} are degraded: the culprit.",
                  description, p.culprit_for, scope=scope, keep_firing_for=p.culprit_keep_firing_for),
            Alert(CULPRIT_CRITICAL_ALERTS[scope], f"{named} == 2", "critical",
                  f"Most paths {what} fail (critical thresholds), lose over {p.loss_ratio_critical:.0%} of their "
                  "echoes together, or fail one by one (their own critical alerts): the culprit.", description,
                  p.culprit_for,
                  scope=scope, keep_firing_for=p.culprit_keep_firing_for),
        ]  # fmt: skip
    return alerts


def throughput_best_of_two(p: Params) -> tuple[str, str]:
    """What the throughput alerts compare with their ratios: the better of each test's last two
    results to expected (none before its second result: a fresh path's first test alone never
    fires; a missed test holds both), and the condition that its last test came within
    throughput_window (older results neither fire nor hold an alert: PathprobeThroughputResultsStale
    says they stopped)."""
    best = f"({EXPECTED_RATIO} >= {PREVIOUS_RATIO}\n  or {PREVIOUS_RATIO})"
    recent = (f"and on ({TEST})\nchanges(path:pathprobe_throughput_last_test_timestamp_seconds:last"
              f"{{{p.selector}}}[{p.throughput_window}]) >= 1")  # fmt: skip
    return best, recent


def _throughput_alerts(p: Params) -> list[Alert]:
    sel, test_text = p.selector, TEST_TEXT
    ratio = EXPECTED_RATIO
    best, recent = throughput_best_of_two(p)
    return [
        Alert("PathprobeThroughputBelowExpected",
               f"{best} < {p.throughput_ratio_warning:g}\n{recent}",
               "warning", "Path throughput below its expected limit.",
               f"{test_text}: the last two tests reached at most "
               "{{ $value | humanizePercentage }} of expected (binding limit: " + BINDING + ")." + CONVERGED),
        Alert("PathprobeThroughputFarBelowExpected",
               f"{best} < {p.throughput_ratio_critical:g}\n{recent}",
               "critical", "Path throughput far below its expected limit.",
               f"{test_text}: the last two tests reached at most "
               "{{ $value | humanizePercentage }} of expected (binding limit: " + BINDING + ")." + CONVERGED),
        Alert("PathprobeTransitGatewayNearLimit",
               f'{ratio}{{path_class="transit_gateway"}} > {p.tgw_utilisation_warning:g}\n'
               f'and ignoring (limit) pathprobe_throughput_expected_bytes_per_second{{{sel}, limit="transit_gateway"}}',
               "warning", "A Transit Gateway path runs near its attachment limit.",
               f"{test_text} reached {{{{ $value | humanizePercentage }}}} of the Transit Gateway attachment limit: "
               "plan capacity (more attachments, or VPC peering)."),
    ]  # fmt: skip


def _owd_change(p: Params) -> str:
    """A template naming which way a path's delay rose: each direction's one-way p50 over the
    recent window against its baseline (where the exporter exports one-way delays)."""
    recent, base = (f"path:pathprobe_owd_seconds:p50_{p.rtt_recent_window}",
                    f"path:pathprobe_owd_seconds:p50_{p.rtt_baseline_window}")  # fmt: skip
    change = f'{recent}{{instance="%s",peer="%s"}} - {base}'
    return (
        f"One way, against the baseline:{{{{ with printf `{change}` $labels.instance $labels.peer | query "
        '| sortByLabel "direction" }}'
        "{{ range . }} {{ .Labels.direction }} {{ .Value | humanizeDuration }};{{ end }}"
        "{{ else }} not known (no one-way delays: a clock error bound unknown or too wide).{{ end }}"
    )


def _path_alerts(p: Params) -> list[Alert]:
    """RTT, loss, partial failure, MTU and reachability of each path."""
    sel, path_text = p.selector, PATH_TEXT
    recent, base = rtt_p50(p.rtt_recent_window), rtt_p50(p.rtt_baseline_window)
    # Loss while this host or the peer runs a throughput test is self-inflicted: alerts count idle packets only,
    # as the culprit group records them per path (the increase over a thousand hosts' counters, taken once),
    # on paths that lost loss_min_lost_packets or more.
    idle_loss = f"sum by ({PATH}, host, region, zone) ({PATH_IDLE_LOSS})"
    return [
        Alert("PathprobeRttAboveBaseline",
               f"{recent} > {p.rtt_baseline_ratio:g} * {base}\n"
               f"and ({recent} - {base}) > {p.rtt_baseline_min_increase_seconds:g}",
               "warning", "Path RTT above its own baseline.",
               f"{path_text} {{{{ $labels.protocol }}}} RTT p50 over {p.rtt_recent_window} is "
               f"{{{{ $value | humanizeDuration }}}}, more than {p.rtt_baseline_ratio:g}x its {p.rtt_baseline_window} "
               f"p50. {_owd_change(p)}", p.rtt_for),
        Alert("PathprobeRttAboveCeiling",
               f'{rtt_p50(p.rtt_exporter_window)}{{protocol="tcp"}}\n'
               f"  > on ({PATH}) group_left () pathprobe_rtt_ceiling_seconds{{{sel}}}",
               "warning", "Path RTT above its configured ceiling.",
               f"{path_text} RTT p50 is {{{{ $value | humanizeDuration }}}}, above the path's configured ceiling.",
               p.rtt_for),
        Alert("PathprobePacketLossHigh", f"{idle_loss} > {p.loss_ratio_warning:g}",
               "warning", "Packet loss on a path.",
               f"{path_text} loses {{{{ $value | humanizePercentage }}}} of UDP echo packets over {p.loss_window}.",
               p.loss_for),
        Alert("PathprobePacketLossCritical", f"{idle_loss} > {p.loss_ratio_critical:g}",
               "critical", "Heavy packet loss on a path.",
               f"{path_text} loses {{{{ $value | humanizePercentage }}}} of UDP echo packets over {p.loss_window}.",
               p.loss_for),
        Alert("PathprobePathPartiallyFailing",
               f"pathprobe_probe_flows_failing{{{sel}}} > 0\n"
               f"and on ({PATH}) sum by ({PATH}) (increase(pathprobe_probe_runs_total{{{sel}, result=\"ok\"}}"
               f"[{p.loss_window}])) > 0",
               "warning", "Some flows of a path fail while others pass (an ECMP member path).",
               f"{path_text}: {{{{ $value }}}} {{{{ $labels.protocol }}}} probe flows (source ports) fail while the "
               "others pass: one member of an ECMP group, or a stateful device on one 5-tuple, is broken. The "
               "path's total loss understates it.", p.partial_failure_for),
        Alert("PathprobePathMtuBlackHole",
               f"pathprobe_path_mtu_carried{{{sel}}} == 0\n"
               f"and on ({PATH}, size_bytes) (time() - pathprobe_path_mtu_last_carried_timestamp_seconds{{{sel}}}) "
               f"< {duration_seconds(p.mtu_memory)}",
               "warning", "A path stopped carrying packets of a size it carried before.",
               f"{path_text} no longer carries {{{{ $labels.size_bytes }}}}-byte packets (Don't Fragment set), "
               f"which it carried within {p.mtu_memory}: a path MTU black hole; large transfers stall while "
               "small probes pass.", p.mtu_for),
        # The RTT probe runs in unreachable_window as the culprit group records them (the increase over a
        # thousand hosts' counters, taken once: computed here again it took 2-4 s of each evaluation).
        Alert("PathprobePeerUnreachable",
               f"sum by ({PATH}, host, region, zone) ({RTT_OK}) == 0\nand on ({PATH})\n"
               f'sum by ({PATH}) ({RTT_RUNS}{{result!="ok"}}) > 0',
               "critical", "A peer does not answer.",
               f"{{{{ $labels.host }}}} ({{{{ $labels.region }}}}) has had no answer from {{{{ $labels.peer }}}} "
               f"for {p.unreachable_window}.", p.unreachable_for),
    ]  # fmt: skip


def _schedule_alerts(p: Params) -> list[Alert]:
    """Throughput results and turns that stop coming."""
    sel = p.selector
    rotations = f"on (instance) group_left () ({p.stale_rotations:g} * pathprobe_schedule_rotation_seconds{{{sel}}})"
    return [
        Alert("PathprobeThroughputResultsStale",
               f'(time() - pathprobe_probe_last_success_timestamp_seconds{{{sel}, probe="throughput"}})\n'
               f"  > {rotations}\n"
               f"or on ({PATH}) (max by ({PATH}, host, region, zone) (pathprobe_throughput_settings_info{{{sel}}})\n"
               f'  unless on ({PATH}) pathprobe_probe_last_success_timestamp_seconds{{{sel}, probe="throughput"}}\n'
               f"  and on (instance) (time() - process_start_time_seconds{{{sel}}}) > {rotations})",
               "warning", "No successful throughput test for several schedule rotations.",
               "{{ $labels.host }} ({{ $labels.region }}) -> {{ $labels.peer }}: no successful throughput test in "
               f"{p.stale_rotations:g} rotations of the schedule; "
               "the dashboards show old numbers."),
        Alert("PathprobeThroughputTurnsStopped",
               f"(time() - pathprobe_schedule_last_turn_timestamp_seconds{{{sel}}}) > {rotations}\n"
               f"and on (instance) (time() - process_start_time_seconds{{{sel}}}) > {rotations}",
               "warning", "An exporter takes no throughput turns.",
               "{{ $labels.host }} ({{ $labels.region }}) has taken no throughput turn in "
               f"{p.stale_rotations:g} rotations of the schedule: its throughput loop is stuck; see its log.",
               scope="host"),
        Alert("PathprobeThroughputTestsOutOfTurn",
               f'increase(pathprobe_probe_runs_total{{{sel}, probe="throughput", result="out_of_turn"}}'
               f"[{p.out_of_turn_window}]) >= 2",
               "warning", "A host's throughput tests are cut by its peer as out of turn.",
               "{{ $value | printf \"%.0f\" }} throughput tests of {{ $labels.host }} ({{ $labels.region }}) against "
               f"{{{{ $labels.peer }}}} in {p.out_of_turn_window} were cut by {{{{ $labels.peer }}}} as out of turn: "
               "the two disagree on the time (PathprobeClockOffsetHigh names the host whose clock is off) or on "
               "the schedule (PathprobeScheduleMismatch); those tests measure nothing."),
        Alert("PathprobeClockOffsetHigh",
               f"min by ({HOST}) (abs(pathprobe_clock_offset_seconds{{{sel}}}))\n"
               f"  > {p.clock_offset_max_seconds:g}",
               "warning", "A host's clock differs from all its peers' clocks.",
               "{{ $labels.host }} ({{ $labels.region }})'s clock differs from every peer's by at least "
               "{{ $value | humanizeDuration }} (from its UDP echoes): its throughput turns start at the wrong "
               "time and its peers cut its tests as out of turn. Check its time sync (chronyc tracking).",
               p.clock_offset_for, scope="host"),
        Alert("PathprobeThroughputTurnErrors",
               f"increase(pathprobe_schedule_turn_errors_total{{{sel}}}[{p.turn_errors_window}]) > 0",
               "warning", "Throughput turns fail on an unexpected error.",
               "{{ $labels.host }} ({{ $labels.region }}): {{ $value | humanize }} throughput turns ended on "
               f"{{{{ $labels.reason }}}} in {p.turn_errors_window} (the loop goes on; the log has the traceback).",
               scope="host"),
    ]  # fmt: skip


def _exporter_alerts(p: Params) -> list[Alert]:
    """The exporters themselves: scraped, budget, config, responders, schedule, /metrics."""
    sel = p.selector
    return [
        Alert("PathprobeExporterDown", f"up{{{sel}}} == 0", "critical", "A pathprobe exporter is down.",
               "{{ $labels.host }} ({{ $labels.region }}) cannot be scraped: its paths are not measured and its "
               "peers' probes to it fail.", p.exporter_down_for, scope="host"),
        Alert("PathprobeExporterAbsent", f"absent(up{{{sel}}})", "critical", "No pathprobe exporter is scraped.",
               f"Prometheus has no target matching {p.selector}: check service discovery.", p.exporter_down_for,
               scope="mesh"),
        Alert("PathprobeBudgetExhausted", f"pathprobe_budget_remaining_bytes{{{sel}}} == 0", "warning",
               "Throughput byte budget exhausted.",
               "{{ $labels.host }} has spent its daily byte budget: throughput tests stop until "
               "{{ with printf \"pathprobe_budget_period_end_timestamp_seconds{instance='%s'}\" $labels.instance "
               "| query }}{{ . | first | value | humanizeTimestamp }}{{ end }}.", p.budget_for, scope="host"),
        Alert("PathprobeBudgetStateUnusable", f"pathprobe_budget_state_unusable{{{sel}}} == 1", "warning",
               "A host's budget state file was unusable: its tests wait for the next budget period.",
               "{{ $labels.host }} ({{ $labels.region }}) could not use its budget state file at start, so it counts "
               "the budget period as spent: its throughput tests stop until "
               "{{ with printf \"pathprobe_budget_period_end_timestamp_seconds{instance='%s'}\" $labels.instance "
               "| query }}{{ . | first | value | humanizeTimestamp }}{{ end }} unless the file is fixed or removed "
               "and the exporter restarted (the log says why).", p.budget_state_unusable_for, scope="host"),
        Alert("PathprobeBudgetSaveFailures",
               f"increase(pathprobe_budget_save_failures_total{{{sel}}}[{p.budget_save_failures_window}]) > 0",
               "warning", "A host cannot write its budget state file.",
               "{{ $labels.host }} ({{ $labels.region }}) could not write its budget state file in the last "
               f"{p.budget_save_failures_window}: it counts today's bytes in memory only, so a restart would forget "
               "them and could spend the budget again (the log says why).", scope="host"),
        Alert("PathprobeInstanceTypeUnknown", f"pathprobe_instance_type_unknown{{{sel}}} == 1", "warning",
               "An instance type the limits table does not know.",
               "{{ $labels.host }}'s config names instance type {{ $labels.instance_type }} (for "
               "{{ if $labels.peer }}peer {{ $labels.peer }}{{ else }}this host{{ end }}), which the instance-type "
               "table does not know: the expected throughput of its paths leaves its bandwidth out.", scope="host"),
        Alert("PathprobeRespondersRefusingPeers",
               f'increase(pathprobe_probe_runs_total{{{sel}, result="not_allowed"}}[{p.refused_window}]) > 0',
               "warning", "A host's responders refuse its peers.",
               "{{ $labels.peer }} refuses {{ $labels.probe }} probes from {{ $labels.host }}: its peer list, allow "
               "list or iperf3 keys do not include this host."),
        Alert("PathprobeResponderOverloaded",
               f'increase(pathprobe_responder_requests_total{{{sel}, responder="echo", '
               f'result="dropped_queue_full"}}[{p.refused_window}]) > 0',
               "warning", "A host's echo responder drops datagrams: its queue is full.",
               "{{ $labels.host }}'s UDP echo responder dropped {{ $value | humanize }} datagrams in "
               f"{p.refused_window} because its socket queue was full (a flood, or more peers than it keeps up "
               "with): its peers read that as loss on their paths to it.", scope="host"),
        # Per mesh: a Prometheus that scrapes several meshes labels each one's targets with `mesh`.
        Alert("PathprobeScheduleMismatch",
               f"count by (job, mesh) (count by (job, mesh, fingerprint) (pathprobe_schedule_info{{{sel}}})) > 1",
               "warning", "Exporters derive different throughput schedules.",
               "{{ $value }} different schedules in the mesh{{ with $labels.mesh }} {{ . }}{{ end }}: peer lists or "
               "slot lengths differ between hosts, so throughput tests may collide (busy) and measure each other.",
               p.schedule_mismatch_for, scope="mesh"),
        Alert("PathprobeMetricsSnapshotStale",
              f"pathprobe_scrape_snapshot_age_seconds{{{sel}}} > {p.snapshot_stale_seconds:g}", "critical",
              "An exporter serves an old metrics snapshot.",
              "{{ $labels.host }} ({{ $labels.region }}) serves a /metrics snapshot {{ $value | humanizeDuration }} "
              "old: its renders fail (pathprobe_scrape_render_errors_total; the log has the traceback) or stall, so "
              "its results and alerts no longer change.", p.snapshot_stale_for, scope="host"),
    ]  # fmt: skip


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
