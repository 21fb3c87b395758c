"""The culprit rules (alerts/runbook.md, "Culprits"): each path's state from its signals, the
candidate hosts, zones, Transit Gateway attachments and region pairs most of whose paths are bad,
named in order, and their alerts."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .common import (
    HOST_BOUND,
    PATH,
    RTT_OK,
    RTT_RUNS,
    SENT_RATIO,
    SOURCE,
    TEST,
    Alert,
    copy_labels,
    rtt_p50,
    with_labels,
    with_path_sides,
)
from .evidence import aws_moved
from .params import Params

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
CULPRIT_ALERTS = {
    "host": "PathprobeHostDegraded",
    "zone": "PathprobeZoneDegraded",
    "region_pair": "PathprobeRegionPairDegraded",
    "transit_gateway": "PathprobeTransitGatewayAttachmentDegraded",
}
CULPRIT_CRITICAL_ALERTS = {scope: name.replace("Degraded", "Failing") for scope, name in CULPRIT_ALERTS.items()}
PATHS, PATHS_BAD, PATHS_CRITICAL = (
    "culprit:pathprobe_paths:count",
    "culprit:pathprobe_paths_bad:count",
    "culprit:pathprobe_paths_critical:count",
)
# The per-path alerts a culprit explains (alertmanager.yml's inhibitions name the same), and how many
# of them fire at critical severity over each candidate culprit's paths that no culprit named before
# it explains.
EXPLAINABLE = "PathprobeThroughput(Far)?BelowExpected|PathprobeRtt.*|PathprobePacketLoss.*|PathprobePeerUnreachable"
CRITICAL_ALERTS = "culprit:pathprobe_path_critical_alerts:count"
# Idle UDP echoes lost and sent in the loss window: per path (with every label of the path; lost
# only where some were), and over each candidate culprit's paths that no culprit named before it explains.
PATH_IDLE_LOST, PATH_IDLE_SENT = (
    "path:pathprobe_udp_idle_packets_lost:increase",
    "path:pathprobe_udp_idle_packets_sent:increase",
)
# The share of its idle echoes a path lost, where it lost loss_min_lost_packets or more: what the
# loss signal and both loss alerts read. At a thousand hosts each of them dividing every path's
# counts again took 3-4 s of an evaluation; the lossy paths are few.
PATH_IDLE_LOSS = "path:pathprobe_udp_idle_packets_lost:ratio"
IDLE_LOST, IDLE_SENT = "culprit:pathprobe_udp_idle_packets_lost:sum", "culprit:pathprobe_udp_idle_packets_sent:sum"


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
    zone_in = copy_labels(by("peer_zone, peer_region", peer_zoned), zone="peer_zone", region="peer_region")
    zone = f"sum by (zone, region) (\n  {by('zone, region', zoned)}\n  or {with_labels(zone_in, end='ingress')}\n)"
    host_in = copy_labels(by("peer, peer_region, peer_zone"), host="peer", region="peer_region", zone="peer_zone")
    tgw_in = copy_labels(
        by("peer_attachment, peer_region", peer_attached), attachment="peer_attachment", region="peer_region"
    )
    tgw_in = f"max without (peer_region) ({tgw_in})"
    return {
        "zone": with_labels(copy_labels(zone, peer_zone="zone"), scope="zone"),
        "host": f"{with_labels(by('host, region, zone'), scope='host', side='egress')}\n"
        f"or {with_labels(f'max without (peer_region, peer_zone) ({host_in})', scope='host', side='ingress')}",
        "transit_gateway": with_labels(by("attachment, region", attached), scope="transit_gateway", side="egress")
        + f"\nor {with_labels(tgw_in, scope='transit_gateway', side='ingress')}",
        "region_pair": with_labels(by("region, peer_region"), scope="region_pair"),
    }


def _named(p: Params, scope: str, bad: str, paths: str) -> str:
    """The culprits of a scope: `bad` (per candidate: its bad paths that no culprit named before
    explains) is at least culprit_min_bad_paths and culprit_bad_share of `paths` (its paths that no
    culprit named before explains). The value is 2 when that share of all its paths is bad at a
    critical threshold, when all its paths' idle echoes together lose more than the critical loss
    ratio (and at least loss_min_lost_packets), or when a per-path critical alert it explains fires
    (CRITICAL_ALERTS), else 1."""
    m = f'{{scope="{scope}"}}'
    critical_share = f"({PATHS_CRITICAL}{m} / {PATHS}{m} >= bool {p.culprit_bad_share:g})"
    critical_loss = (
        f"({IDLE_LOST}{m} / {IDLE_SENT}{m} > bool {p.loss_ratio_critical:g})"
        f" * ({IDLE_LOST}{m} >= bool {p.loss_min_lost_packets})"
    )
    critical_alert = f"({CRITICAL_ALERTS}{m} >= bool 1)"
    # A candidate without echoes has no loss sum, one without critical alerts no count: 0 for them.
    return (
        f"1 + clamp_max({critical_share} + ({critical_loss} or 0 * {critical_share})\n"
        f"  + ({critical_alert} or 0 * {critical_share}), 1)\n"
        f"and ({bad} >= {p.culprit_min_bad_paths}) / {paths} >= {p.culprit_bad_share:g}"
    )


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
    # Tests this host sent: a receive test measures the peer's egress under this host's labels. A
    # test that measured its own ends says nothing of the path.
    ratio = f"min by ({SOURCE}) ({SENT_RATIO} unless on ({TEST}) {HOST_BOUND})"
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
    }


def _measured_paths(p: Params) -> str:
    """Every path that a signal measures (what path_signals reads), with the value 0."""
    inputs = (SENT_RATIO, PATH_IDLE_SENT, rtt_p50(p.rtt_recent_window), RTT_OK)
    return "0 * (\n  " + "\n  or ".join(f"group by ({SOURCE}) ({series})" for series in inputs) + "\n)"


def _path_level(p: Params) -> str:
    """Each path's state (path_signals: the worst of its signals, or 0), with every label of the path."""
    terms = "\n  or ".join(with_labels(f"({expr})", signal=name) for name, expr in path_signals(p).items())
    return with_path_sides(p, f"max by ({SOURCE}) (\n  {terms}\n  or {_measured_paths(p)}\n)")


def _critical_alerts(matchers: str) -> str:
    """The per-path critical alerts firing that a culprit explains (EXPLAINABLE), with `matchers`."""
    return (
        f'ALERTS{{alertstate="firing", scope="path", severity="critical", alertname=~"{EXPLAINABLE}"'
        f"{', ' + matchers if matchers else ''}}}"
    )


def _selected(series: str, matchers: str) -> str:
    """`series` with `matchers` (none: all of it)."""
    return f"{series}{{{matchers}}}" if matchers else series


def _level(matchers: str, condition: str = "") -> str:
    """Each path's state (BAD) with `matchers`, and `condition` (e.g. " >= 1": the bad ones)."""
    return _selected(BAD, matchers) + condition


def _named_outside(p: Params, scope: str, explained: str) -> str:
    """The scope's culprits, counting only its paths outside `explained` (the paths that culprits
    named before explain)."""
    bad = _candidates("count", lambda m: f"({_level(m, ' >= 1')} unless on ({PATH}) ({explained}))")
    paths = _candidates("count", lambda m: f"({_level(m)} unless on ({PATH}) ({explained}))")
    return _named(p, scope, f"({bad[scope]})", f"({paths[scope]})")


def _own(scope: str, explained: str | None, agg: str, series: Callable[[str], str]) -> str:
    """`agg` of `series` over the scope's candidates' paths outside `explained` (None: all of them)."""
    if explained is None:
        return _candidates(agg, series)[scope]
    return _candidates(agg, lambda m: f"({series(m)} unless on ({PATH}) ({explained}))")[scope]


def _evidence(scope: str, explained: str | None) -> list[dict[str, Any]]:
    """What raises the scope's culprits to critical besides their paths' levels: their idle echoes
    lost and sent, and the per-path critical alerts firing, over their paths outside `explained`
    (None: all of them). A culprit's loss and alerts are its own, not those of a lossy zone that
    some of its paths run into (that zone's page has them). Lost echoes and alerts are on few
    paths; the echoes sent, on all: their sum (once: each costs a thousand hosts' group a second)
    less that of the (few) explained paths, or of none (PATHS: every candidate)."""
    lost = _own(scope, explained, "sum", functools.partial(_selected, PATH_IDLE_LOST))
    alerts = _own(scope, explained, "count", _critical_alerts)
    sent = f"({_candidates('sum', functools.partial(_selected, PATH_IDLE_SENT))[scope]})"
    if explained is not None:
        gone = _candidates("sum", lambda m: f"({_selected(PATH_IDLE_SENT, m)} and on ({PATH}) ({explained}))")
        sent = f'{sent}\n- ({gone[scope]}\n  or 0 * {PATHS}{{scope="{scope}"}})'
    return [
        {"record": record, "expr": expr, "labels": {"scope": scope}}
        for record, expr in ((IDLE_LOST, lost), (IDLE_SENT, sent), (CRITICAL_ALERTS, alerts))
    ]


def _explains(scope: str, side: str, on: str) -> str:
    """The bad paths that the scope's culprits (of `side`, where it has sides) explain, matched `on` a label."""
    side_matcher = f', side="{side}"' if side else ""
    return f'{BAD} >= 1 and on ({on}) {CULPRIT}{{scope="{scope}"{side_matcher}}}'


def _filled(agg: str, series: Callable[[str], str]) -> str:
    """`agg` of `series` (the few bad or lossy paths) over each candidate's paths, and 0 for the
    other candidates (PATHS): an aggregation over every path costs a thousand hosts' culprit
    group a second of its interval."""
    return "\nor ".join(_candidates(agg, series).values()) + f"\nor 0 * {PATHS}"


def _path_inputs(p: Params) -> list[dict[str, Any]]:
    """Per path: its idle echoes lost and sent and their ratio, its RTT probe runs, its state; per
    candidate, its paths, bad paths and critically bad paths."""
    return [
        {"record": PATH_IDLE_LOST, "expr": with_path_sides(p, f"({_idle_udp(p, 'lost')} > 0)")},
        {"record": PATH_IDLE_SENT, "expr": with_path_sides(p, _idle_udp(p, "sent"))},
        {"record": PATH_IDLE_LOSS, "expr": f"({PATH_IDLE_LOST} >= {p.loss_min_lost_packets})\n  / {PATH_IDLE_SENT}"},
        {
            "record": RTT_RUNS,
            "expr": f"sum by ({SOURCE}, result) (increase(pathprobe_probe_runs_total{{{p.selector}, "
            f'probe="rtt"}}[{p.unreachable_window}]))',
        },
        {"record": BAD, "expr": _path_level(p)},
        {"record": PATHS, "expr": "\nor ".join(_candidates("count", _level).values())},
        {"record": PATHS_BAD, "expr": _filled("count", lambda m: _level(m, " >= 1"))},
        {"record": PATHS_CRITICAL, "expr": _filled("count", lambda m: _level(m, " >= 2"))},
    ]


def _zones(p: Params) -> list[dict[str, Any]]:
    """The zones named, first, and the paths they explain."""
    zone = '{scope="zone"}'
    named = _named(p, "zone", PATHS_BAD + zone, PATHS + zone)
    # The hosts measuring from each zone: its host candidates as senders.
    hosts = f'count by (zone) ({PATHS}{{scope="host", side="egress", zone!=""}})'
    explained = [_explains("zone", "", "zone"), _explains("zone", "", "peer_zone")]
    return [
        *_evidence("zone", None),
        # A zone of one (measuring) host is that host: its own culprit names it.
        {"record": CULPRIT, "expr": f"{named}\nand on (zone) {hosts} >= 2", "labels": {"scope": "zone"}},
        {"record": EXPLAINED, "expr": "\nor ".join(explained), "labels": {"scope": "zone"}},
    ]


def _hosts(p: Params) -> list[dict[str, Any]]:
    """The hosts named outside the named zones, on the paths that no zone explains."""
    zone = '{scope="zone"}'
    before = EXPLAINED + zone
    explained = [_explains("host", "egress", "host"), _explains("host", "ingress", "peer")]
    return [
        *_evidence("host", before),
        {
            "record": CULPRIT,
            "expr": f"({_named_outside(p, 'host', before)})\nunless on (zone) {CULPRIT}{zone}",
            "labels": {"scope": "host"},
        },
        {"record": EXPLAINED, "expr": "\nor ".join(explained), "labels": {"scope": "host"}},
    ]


def _attachments_and_region_pairs(p: Params) -> list[dict[str, Any]]:
    """The Transit Gateway attachments named on the paths that no zone or host explains, then the
    region pairs on those that none of them explains."""
    before = EXPLAINED + '{scope=~"zone|host"}'
    explained = [
        _explains("transit_gateway", "egress", "attachment"),
        _explains("transit_gateway", "ingress", "peer_attachment"),
    ]
    return [
        # Each rule reads the explained paths recorded before it in this evaluation: the ones recorded
        # after it are the last evaluation's until they are recorded again (a culprit would leave out its own).
        *_evidence("transit_gateway", before),
        {
            "record": CULPRIT,
            "expr": _named_outside(p, "transit_gateway", before),
            "labels": {"scope": "transit_gateway"},
        },
        {"record": EXPLAINED, "expr": "\nor ".join(explained), "labels": {"scope": "transit_gateway"}},
        *_evidence("region_pair", EXPLAINED),
        {"record": CULPRIT, "expr": _named_outside(p, "region_pair", EXPLAINED), "labels": {"scope": "region_pair"}},
    ]


def culprit_rules(p: Params) -> list[dict[str, Any]]:
    """Localization (alerts/runbook.md, "Culprits"): the host, zone, Transit Gateway attachment or region
    pair most of whose paths are bad. The rules of a group run in order, each seeing the ones before:
    zones are named first, then hosts outside named zones (a zone's loss makes each of its hosts look
    bad), then attachments and region pairs; each of those on the paths that no zone (or host, or
    attachment) named before explains: the paths into a lossy zone are its, not the hosts' at their
    other ends, and a host's fault can make its region's pairs look bad."""
    return [*_path_inputs(p), *_zones(p), *_hosts(p), *_attachments_and_region_pairs(p)]


def _culprit_evidence(scope: str, *labels: str) -> str:
    """A culprit alert's evidence, looked up when it fires: its bad and critically bad paths of all
    its paths, its idle echoes' loss and its own critical alerts held back."""
    match = ",".join(f"{name}='%s'" for name in labels)
    args = " ".join(f"$labels.{name}" for name in labels)
    counts = [
        f"{{{{ with printf \"{record}{{scope='{scope}',{match}}}\" {args} | query }}}}"
        "{{ . | first | value }}{{ end }}"
        for record in (PATHS_BAD, PATHS_CRITICAL, PATHS)
    ]
    selector = f"{{scope='{scope}',{match}}}"
    loss = (
        f'{{{{ with printf "{IDLE_LOST}{selector} / {IDLE_SENT}{selector}" {args} {args} | query }}}}'
        "; their idle echoes lose {{ . | first | value | humanizePercentage }} together{{ end }}"
    )
    alerts = (
        f'{{{{ with printf "{CRITICAL_ALERTS}{selector}" {args} | query }}}}'
        "; {{ . | first | value }} of their own critical alerts firing (held back){{ end }}"
    )
    return f"{counts[0]} of its {counts[2]} paths are bad ({counts[1]} critically{loss}{alerts})"


def _culprit_texts() -> dict[str, tuple[str, str]]:
    """Per scope of culprit: what its paths run (for the summary) and its description."""
    return {
        "host": (
            "through one host",
            "{{ $labels.host }} ({{ $labels.region }} {{ $labels.zone }}), {{ $labels.side }}: "
            + _culprit_evidence("host", "side", "host")
            + " (throughput below expected, loss, RTT above baseline or no "
            "answer), while its peers' other paths are not: check its instance allowances "
            "(pathprobe_ena_allowance_exceeded_total) first.",
        ),
        "zone": (
            "through one availability zone",
            "{{ $labels.zone }} ({{ $labels.region }}): "
            + _culprit_evidence("zone", "zone")
            + ", from and to its hosts.",
        ),
        "region_pair": (
            "from one region to another",
            "{{ $labels.region }} -> {{ $labels.peer_region }}: "
            + _culprit_evidence("region_pair", "region", "peer_region")
            + ", from hosts that reach their other "
            "peers well: the regions' interconnect, not a host.",
        ),
        "transit_gateway": (
            "over one Transit Gateway attachment",
            "{{ $labels.attachment }} ({{ $labels.region }}), "
            "{{ $labels.side }}: " + _culprit_evidence("transit_gateway", "side", "attachment") + " over it.",
        ),
    }


def culprit_alerts(p: Params) -> list[Alert]:
    """Two alerts per scope of culprit (CULPRIT_ALERTS); each inhibits the per-path alerts it explains
    (alertmanager.yml)."""

    alerts = []
    for scope, (what, text) in _culprit_texts().items():
        named = f'{CULPRIT}{{scope="{scope}"}}'
        # A region pair's culprit: whether AWS's own figure for the pair moved as well.
        description = text + (aws_moved(p) if scope == "region_pair" else "")
        alerts += [
            Alert(
                name=CULPRIT_ALERTS[scope],
                expr=named,
                severity="warning",
                summary=f"Most paths {what} are degraded: the culprit.",
                description=description,
                for_=p.culprit_for,
                scope=scope,
                keep_firing_for=p.culprit_keep_firing_for,
            ),
            Alert(
                name=CULPRIT_CRITICAL_ALERTS[scope],
                expr=f"{named} == 2",
                severity="critical",
                summary=f"Most paths {what} fail (critical thresholds), lose over {p.loss_ratio_critical:.0%} of their "
                "echoes together, or fail one by one (their own critical alerts): the culprit.",
                description=description,
                for_=p.culprit_for,
                scope=scope,
                keep_firing_for=p.culprit_keep_firing_for,
            ),
        ]
    return alerts
