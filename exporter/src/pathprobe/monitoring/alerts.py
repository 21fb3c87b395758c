"""The per-path, schedule and exporter alerts."""

from __future__ import annotations

from .common import (
    DURATION,
    HOST,
    PATH,
    PATH_TEXT,
    PERCENT,
    RTT_OK,
    RTT_RUNS,
    VALUE,
    Alert,
    duration_seconds,
    label,
    rtt_p50,
)
from .culprits import PATH_IDLE_LOSS, PATH_IDLE_SENT
from .evidence import aws_moved
from .params import Params


def _owd_change(p: Params) -> str:
    """A template naming which way a path's delay rose: each direction's one-way p50 over the
    recent window against its baseline (where the exporter exports one-way delays)."""
    recent, base = (
        f"path:pathprobe_owd_seconds:p50_{p.rtt_recent_window}",
        f"path:pathprobe_owd_seconds:p50_{p.rtt_baseline_window}",
    )
    change = f'{recent}{{instance="%s",peer="%s"}} - {base}'
    return (
        f"One way, against the baseline:{{{{ with printf `{change}` $labels.instance $labels.peer | query "
        '| sortByLabel "direction" }}'
        "{{ range . }} {{ .Labels.direction }} {{ .Value | humanizeDuration }};{{ end }}"
        "{{ else }} not known (no one-way delays: a clock error bound unknown or too wide).{{ end }}"
    )


def _rtt_alerts(p: Params) -> list[Alert]:
    """A path's RTT against its baseline and its ceiling."""
    sel, path_text = p.selector, PATH_TEXT
    recent, base = rtt_p50(p.rtt_recent_window), rtt_p50(p.rtt_baseline_window)
    return [
        Alert(
            name="PathprobeRttAboveBaseline",
            expr=f"{recent} > {p.rtt_baseline_ratio:g} * {base}\n"
            f"and ({recent} - {base}) > {p.rtt_baseline_min_increase_seconds:g}",
            severity="warning",
            summary="Path RTT above its own baseline.",
            description=f"{path_text} {label('protocol')} RTT p50 over {p.rtt_recent_window} is "
            f"{DURATION}, more than {p.rtt_baseline_ratio:g}x its {p.rtt_baseline_window} "
            f"p50. {_owd_change(p)}{aws_moved(p)}",
            for_=p.rtt_for,
        ),
        Alert(
            name="PathprobeRttAboveCeiling",
            expr=f'{rtt_p50(p.rtt_exporter_window)}{{protocol="tcp"}}\n'
            f"  > on ({PATH}) group_left () pathprobe_rtt_ceiling_seconds{{{sel}}}",
            severity="warning",
            summary="Path RTT above its configured ceiling.",
            description=f"{path_text} RTT p50 is {DURATION}, above the path's configured ceiling.{aws_moved(p)}",
            for_=p.rtt_for,
        ),
    ]


def _loss_alerts(p: Params) -> list[Alert]:
    """A path's loss, and its flows that fail while others pass."""
    sel, path_text = p.selector, PATH_TEXT
    # Loss while this host or the peer runs a throughput test is self-inflicted: alerts count idle packets only,
    # as the culprit group records them per path (the increase over a thousand hosts' counters, taken once),
    # on paths that lost loss_min_lost_packets or more.
    idle_loss = f"sum by ({PATH}, host, region, zone) ({PATH_IDLE_LOSS})"
    return [
        Alert(
            name="PathprobePacketLossHigh",
            expr=f"{idle_loss} > {p.loss_ratio_warning:g}",
            severity="warning",
            summary="Packet loss on a path.",
            description=f"{path_text} loses {PERCENT} of UDP echo packets over {p.loss_window}.",
            for_=p.loss_for,
        ),
        Alert(
            name="PathprobePacketLossCritical",
            expr=f"{idle_loss} > {p.loss_ratio_critical:g}",
            severity="critical",
            summary="Heavy packet loss on a path.",
            description=f"{path_text} loses {PERCENT} of UDP echo packets over {p.loss_window}.",
            for_=p.loss_for,
        ),
        Alert(
            name="PathprobePathPartiallyFailing",
            expr=f"pathprobe_probe_flows_failing{{{sel}}} > 0\n"
            f'and on ({PATH}) sum by ({PATH}) (increase(pathprobe_probe_runs_total{{{sel}, result="ok"}}'
            f"[{p.loss_window}])) > 0",
            severity="warning",
            summary="Some flows of a path fail while others pass (an ECMP member path).",
            description=f"{path_text}: {VALUE} {label('protocol')} probe flows (source ports) fail while the "
            "others pass: one member of an ECMP group, or a stateful device on one 5-tuple, is broken. The "
            "path's total loss understates it.",
            for_=p.partial_failure_for,
        ),
    ]


def _reachability_alerts(p: Params) -> list[Alert]:
    """The packet sizes a path stopped carrying, and a peer that does not answer."""
    sel, path_text = p.selector, PATH_TEXT
    return [
        Alert(
            name="PathprobePathMtuBlackHole",
            expr=f"pathprobe_path_mtu_carried{{{sel}}} == 0\n"
            f"and on ({PATH}, size_bytes) (time() - pathprobe_path_mtu_last_carried_timestamp_seconds{{{sel}}}) "
            f"< {duration_seconds(p.mtu_memory)}",
            severity="warning",
            summary="A path stopped carrying packets of a size it carried before.",
            description=f"{path_text} no longer carries {label('size_bytes')}-byte packets (Don't Fragment set), "
            f"which it carried within {p.mtu_memory}: a path MTU black hole; large transfers stall while "
            "small probes pass.",
            for_=p.mtu_for,
        ),
        # The RTT probe runs in unreachable_window as the culprit group records them (the increase over a
        # thousand hosts' counters, taken once: computed here again it took 2-4 s of each evaluation).
        Alert(
            name="PathprobePeerUnreachable",
            expr=f"sum by ({PATH}, host, region, zone) ({RTT_OK}) == 0\nand on ({PATH})\n"
            f'sum by ({PATH}) ({RTT_RUNS}{{result!="ok"}}) > 0',
            severity="critical",
            summary="A peer does not answer.",
            description=f"{label('host')} ({label('region')}) has had no answer from {label('peer')} "
            f"for {p.unreachable_window}.",
            for_=p.unreachable_for,
        ),
    ]


def path_alerts(p: Params) -> list[Alert]:
    """Reachability and MTU, RTT, loss and partial failure of each path; the applications' flows on it.
    A peer that does not answer first: it holds back the others (rules._inhibitors_first)."""
    return [*_reachability_alerts(p), *_rtt_alerts(p), *_loss_alerts(p), *_application_alerts(p)]


def _application_alerts(p: Params) -> list[Alert]:
    """The host's own applications' TCP flows to a peer (pathprobe_tcp_flows_*) beside the probes:
    host scope, since what they show beside a healthy path is the host's or the application's."""
    sel, w = p.selector, p.app_window
    by = "job, instance, host, region, zone, peer, peer_region, path_class"
    acked = f"sum by ({by}) (increase(pathprobe_tcp_flows_bytes_acked_total{{{sel}}}[{w}]))"
    retrans = f"sum by ({by}) (increase(pathprobe_tcp_flows_retransmitted_segments_total{{{sel}}}[{w}]))"
    limited = "pathprobe_tcp_flows_limited_seconds_total"
    window = f'sum by ({by}) (increase({limited}{{{sel}, limit=~"receive_window|send_buffer"}}[{w}]))'
    sending = f'sum by ({by}) (increase({limited}{{{sel}, limit!="application"}}[{w}]))'
    rtt_series = f"{rtt_p50(p.rtt_exporter_window)}"
    rtt = f'max by ({PATH}) ({rtt_series}{{protocol="tcp"}})'
    # Templates do no arithmetic: the query computes the figure (bytes: the RTT times the rate over the
    # share), each parameter as set, so that the mixin's _config stands in for it.
    per_second = f"{p.app_target_bits_per_second:g} / 8 / {p.app_window_share:g}"
    figure = (
        f'{{{{ with printf `{rtt_series}{{instance="%s",peer="%s",protocol="tcp"}} * {per_second}` '
        "$labels.instance $labels.peer | query }}{{ with first . }}{{ .Value | humanize1024 }}B{{ end }}"
        "{{ else }}(the RTT times the rate over the share){{ end }}"
    )
    return [
        Alert(
            name="PathprobeApplicationRetransmits",
            expr=f"({retrans} * {p.app_segment_bytes} / {acked}) > {p.app_retransmit_ratio:g}\n"
            f"and on ({PATH}) {acked} > {p.app_min_bytes:g}\n"
            # The probes ran on the path (idle echoes sent) and lost too few to be a loss alert's: their
            # loss ratio is recorded only where 3 or more were lost.
            f"and on ({PATH}) {PATH_IDLE_SENT} > 0\n"
            f"unless on ({PATH}) {PATH_IDLE_LOSS} >= {p.loss_ratio_warning:g}",
            severity="warning",
            summary="Applications retransmit on a path the probes call healthy.",
            description="{{ $labels.host }}'s applications retransmit about "
            f"{PERCENT} of their segments to {{{{ $labels.peer }}}} ({{{{ $labels.peer_region }}}}) over {w}, "
            f"while pathprobe's own probes on that path lose under {p.loss_ratio_warning:.0%}: the host (its NIC, "
            "its queues, a conntrack table, an allowance: pathprobe_ena_allowance_exceeded_total) or the "
            "application's side, not the path. `pathprobe flows --to PEER` on the host lists the flows.",
            for_=p.app_for,
            scope="host",
        ),
        Alert(
            name="PathprobeApplicationsWindowLimited",
            expr=f"({window} / {sending}) > {p.app_window_limited_share:g}\n"
            f"and on ({PATH}) {acked} > {p.app_min_bytes:g}\n"
            f"and on ({PATH}) {rtt} >= {p.app_long_path_seconds:g}",
            severity="info",
            summary="Applications on a long path are limited by a TCP window or buffer.",
            description="{{ $labels.host }}'s applications' flows to {{ $labels.peer }} ({{ $labels.peer_region }}) "
            f"spent {PERCENT} of their sending time over {w} with the receive window or send buffer full, on a "
            # The thresholds in their units by Prometheus's template functions, each parameter as
            # it is set (so that the mixin's _config can stand in for it).
            f"path of RTT p50 {{{{ humanizeDuration {p.app_long_path_seconds:g} }}}} or more: their rate is the "
            f"buffer over the RTT, not the path's. For {{{{ humanize {p.app_target_bits_per_second:g} }}}}bit/s "
            "per flow the buffer max (the "
            f"receiver's net.ipv4.tcp_rmem, this host's tcp_wmem) should be at least {figure}; "
            "`pathprobe flows --to PEER` names which and the figure for each flow.",
            for_=p.app_for,
            scope="host",
        ),
    ]


def _stale_alerts(p: Params) -> list[Alert]:
    """Throughput results and turns that stop coming."""
    sel = p.selector
    rotations = f"on (instance) group_left () ({p.stale_rotations:g} * pathprobe_schedule_rotation_seconds{{{sel}}})"
    return [
        Alert(
            name="PathprobeThroughputResultsStale",
            expr=f'(time() - pathprobe_probe_last_success_timestamp_seconds{{{sel}, probe="throughput"}})\n'
            f"  > {rotations}\n"
            f"or on ({PATH}) (max by ({PATH}, host, region, zone) (pathprobe_throughput_settings_info{{{sel}}})\n"
            f'  unless on ({PATH}) pathprobe_probe_last_success_timestamp_seconds{{{sel}, probe="throughput"}}\n'
            f"  and on (instance) (time() - process_start_time_seconds{{{sel}}}) > {rotations})",
            severity="warning",
            summary="No successful throughput test for several schedule rotations.",
            description="{{ $labels.host }} ({{ $labels.region }}) -> {{ $labels.peer }}: no successful throughput "
            "test in "
            f"{p.stale_rotations:g} rotations of the schedule; "
            "the dashboards show old numbers.",
        ),
        Alert(
            name="PathprobeThroughputTurnsStopped",
            expr=f"(time() - pathprobe_schedule_last_turn_timestamp_seconds{{{sel}}}) > {rotations}\n"
            f"and on (instance) (time() - process_start_time_seconds{{{sel}}}) > {rotations}",
            severity="warning",
            summary="An exporter takes no throughput turns.",
            description="{{ $labels.host }} ({{ $labels.region }}) has taken no throughput turn in "
            f"{p.stale_rotations:g} rotations of the schedule: its throughput loop is stuck; see its log.",
            scope="host",
        ),
    ]


def _turn_alerts(p: Params) -> list[Alert]:
    """Throughput turns cut, misplaced by a clock, or failing."""
    sel = p.selector
    return [
        Alert(
            name="PathprobeThroughputTestsOutOfTurn",
            expr=f'increase(pathprobe_probe_runs_total{{{sel}, probe="throughput", result="out_of_turn"}}'
            f"[{p.out_of_turn_window}]) >= 2",
            severity="warning",
            summary="A host's throughput tests are cut by its peer as out of turn.",
            description='{{ $value | printf "%.0f" }} throughput tests of {{ $labels.host }} ({{ $labels.region }}) '
            "against "
            f"{label('peer')} in {p.out_of_turn_window} were cut by {label('peer')} as out of turn: "
            "the two disagree on the time (PathprobeClockOffsetHigh names the host whose clock is off) or on "
            "the schedule (PathprobeScheduleMismatch); those tests measure nothing.",
        ),
        Alert(
            name="PathprobeClockOffsetHigh",
            expr=f"min by ({HOST}) (abs(pathprobe_clock_offset_seconds{{{sel}}}))\n  > {p.clock_offset_max_seconds:g}",
            severity="warning",
            summary="A host's clock differs from all its peers' clocks.",
            description="{{ $labels.host }} ({{ $labels.region }})'s clock differs from every peer's by at least "
            "{{ $value | humanizeDuration }} (from its UDP echoes): its throughput turns start at the wrong "
            "time and its peers cut its tests as out of turn. Check its time sync (chronyc tracking).",
            for_=p.clock_offset_for,
            scope="host",
        ),
        Alert(
            name="PathprobeThroughputTurnErrors",
            expr=f"increase(pathprobe_schedule_turn_errors_total{{{sel}}}[{p.turn_errors_window}]) > 0",
            severity="warning",
            summary="Throughput turns fail on an unexpected error.",
            description="{{ $labels.host }} ({{ $labels.region }}): {{ $value | humanize }} throughput turns ended on "
            f"{label('reason')} in {p.turn_errors_window} (the loop goes on; the log has the traceback).",
            scope="host",
        ),
    ]


def schedule_alerts(p: Params) -> list[Alert]:
    """Throughput results and turns that stop coming."""
    return [*_stale_alerts(p), *_turn_alerts(p)]


def _scrape_alerts(p: Params) -> list[Alert]:
    """Exporters that cannot be scraped, or none at all."""
    sel = p.selector
    return [
        # As kube-prometheus's TargetDown: one exporter down is a warning (its peers' paths to it are held
        # back behind it); a share of the job's exporters down pages.
        Alert(
            name="PathprobeExporterDown",
            expr=f"up{{{sel}}} == 0",
            severity="warning",
            summary="A pathprobe exporter is down.",
            description="{{ $labels.host }} ({{ $labels.region }}) cannot be scraped: its paths are not measured and "
            "its peers' probes to it fail.",
            for_=p.exporter_down_for,
            scope="host",
        ),
        Alert(
            name="PathprobeExportersDown",
            expr=f"count by (job) (up{{{sel}}} == 0) / count by (job) (up{{{sel}}}) > {p.exporters_down_share:g}",
            severity="critical",
            summary="Many pathprobe exporters are down.",
            description="{{ $value | humanizePercentage }} of the {{ $labels.job }} exporters cannot be scraped "
            f"(more than {p.exporters_down_share:.0%}): their paths are not measured.",
            for_=p.exporter_down_for,
            scope="mesh",
        ),
        Alert(
            name="PathprobeExporterAbsent",
            expr=f"absent(up{{{sel}}})",
            severity="critical",
            summary="No pathprobe exporter is scraped.",
            description=f"Prometheus has no target matching {p.selector}: check service discovery.",
            for_=p.exporter_down_for,
            scope="mesh",
        ),
    ]


def _budget_alerts(p: Params) -> list[Alert]:
    """The daily byte budget and its state file."""
    sel = p.selector
    return [
        # Before the exhausted budget, which it holds back (alertmanager.yml; rules._inhibitors_first).
        Alert(
            name="PathprobeBudgetStateUnusable",
            expr=f"pathprobe_budget_state_unusable{{{sel}}} == 1",
            severity="warning",
            summary="A host's budget state file was unusable: its tests wait for the next budget period.",
            description="{{ $labels.host }} ({{ $labels.region }}) could not use its budget state file at start, so "
            "it counts "
            "the budget period as spent: its throughput tests stop until "
            "{{ with printf \"pathprobe_budget_period_end_timestamp_seconds{instance='%s'}\" $labels.instance "
            "| query }}{{ . | first | value | humanizeTimestamp }}{{ end }} unless the file is fixed or removed "
            "and the exporter restarted (the log says why).",
            for_=p.budget_state_unusable_for,
            scope="host",
        ),
        Alert(
            name="PathprobeBudgetExhausted",
            expr=f"pathprobe_budget_remaining_bytes{{{sel}}} == 0",
            severity="warning",
            summary="Throughput byte budget exhausted.",
            description="{{ $labels.host }} has spent its daily byte budget: throughput tests stop until "
            "{{ with printf \"pathprobe_budget_period_end_timestamp_seconds{instance='%s'}\" $labels.instance "
            "| query }}{{ . | first | value | humanizeTimestamp }}{{ end }}.",
            for_=p.budget_for,
            scope="host",
        ),
        Alert(
            name="PathprobeBudgetSaveFailures",
            expr=f"increase(pathprobe_budget_save_failures_total{{{sel}}}[{p.budget_save_failures_window}]) > 0",
            severity="warning",
            summary="A host cannot write its budget state file.",
            description="{{ $labels.host }} ({{ $labels.region }}) could not write its budget state file in the last "
            f"{p.budget_save_failures_window}: it counts today's bytes in memory only, so a restart would forget "
            "them and could spend the budget again (the log says why).",
            scope="host",
        ),
    ]


def _config_alerts(p: Params) -> list[Alert]:
    """What the config names that the limits table lacks, and the responders' refusals."""
    sel = p.selector
    return [
        Alert(
            name="PathprobeInstanceTypeUnknown",
            expr=f"pathprobe_instance_type_unknown{{{sel}}} == 1",
            severity="warning",
            summary="An instance type the limits table does not know.",
            description="{{ $labels.host }}'s config names instance type {{ $labels.instance_type }} (for "
            "{{ if $labels.peer }}peer {{ $labels.peer }}{{ else }}this host{{ end }}), which the instance-type "
            "table does not know: the expected throughput of its paths leaves its bandwidth out.",
            scope="host",
        ),
        Alert(
            name="PathprobeRespondersRefusingPeers",
            expr=f'increase(pathprobe_probe_runs_total{{{sel}, result="not_allowed"}}[{p.refused_window}]) > 0',
            severity="warning",
            summary="A host's responders refuse its peers.",
            description="{{ $labels.peer }} refuses {{ $labels.probe }} probes from {{ $labels.host }}: its peer "
            "list, allow "
            "list or iperf3 keys do not include this host.",
        ),
        Alert(
            name="PathprobeResponderOverloaded",
            expr=f'increase(pathprobe_responder_requests_total{{{sel}, responder="echo", '
            f'result="dropped_queue_full"}}[{p.refused_window}]) > 0',
            severity="warning",
            summary="A host's echo responder drops datagrams: its queue is full.",
            description="{{ $labels.host }}'s UDP echo responder dropped {{ $value | humanize }} datagrams in "
            f"{p.refused_window} because its socket queue was full (a flood, or more peers than it keeps up "
            "with): its peers read that as loss on their paths to it.",
            scope="host",
        ),
        # Per mesh: a Prometheus that scrapes several meshes labels each one's targets with `mesh`.
    ]


def _serving_alerts(p: Params) -> list[Alert]:
    """The responders' queue, the mesh's schedules and the /metrics snapshot."""
    sel = p.selector
    return [
        Alert(
            name="PathprobeScheduleMismatch",
            expr=f"count by (job, mesh) (count by (job, mesh, fingerprint) (pathprobe_schedule_info{{{sel}}})) > 1",
            severity="warning",
            summary="Exporters derive different throughput schedules.",
            description="{{ $value }} different schedules in the mesh{{ with $labels.mesh }} {{ . }}{{ end }}: peer "
            "lists or "
            "slot lengths differ between hosts, so throughput tests may collide (busy) and measure each other.",
            for_=p.schedule_mismatch_for,
            scope="mesh",
        ),
        Alert(
            name="PathprobeMetricsSnapshotStale",
            expr=f"pathprobe_scrape_snapshot_age_seconds{{{sel}}} > {p.snapshot_stale_seconds:g}",
            severity="critical",
            summary="An exporter serves an old metrics snapshot.",
            description="{{ $labels.host }} ({{ $labels.region }}) serves a /metrics snapshot {{ $value | "
            "humanizeDuration }} "
            "old: its renders fail (pathprobe_scrape_render_errors_total; the log has the traceback) or stall, so "
            "its results and alerts no longer change.",
            for_=p.snapshot_stale_for,
            scope="host",
        ),
    ]


def exporter_alerts(p: Params) -> list[Alert]:
    """The exporters themselves: scraped, budget, config, responders, schedule, /metrics."""
    return [*_scrape_alerts(p), *_budget_alerts(p), *_config_alerts(p), *_serving_alerts(p)]
