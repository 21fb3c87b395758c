"""pathprobe / Overview: every path between regions at a glance."""

from __future__ import annotations

from grafana_foundation_sdk.builders import stat, table
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models.dashboard import DataTransformerConfig
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from pathprobe.monitoring.culprits import CULPRIT_ALERTS
from pathprobe.monitoring.params import Params

from . import links
from .common import DS, FULL, HALF, QUARTER, dashboard, grid, query, steps


def build(p: Params) -> Dashboard:
    warn, crit = p.throughput_ratio_warning, p.throughput_ratio_critical
    # The region-pair aggregates (rules group pathprobe.region_pairs): what a global Prometheus
    # holds (docs/fleet.md); a single Prometheus evaluates the same rules.
    ratio = (
        "min by (region, peer_region) "
        '(region_pair:pathprobe_throughput_expected_ratio:min{streams="1", direction="send"})'
    )
    w = p.rtt_exporter_window
    rtt = f'region_pair:pathprobe_rtt_seconds:max_p50_{w}{{protocol="tcp"}}'
    tail = f'region_pair:pathprobe_rtt_seconds:max_p99_{w}{{protocol="tcp"}}'
    tested = "time() - region_pair:pathprobe_throughput_last_test_timestamp_seconds:max"
    loss = "region_pair:pathprobe_udp_loss_ratio:max_rate5m"
    return (
        dashboard(
            p,
            "pathprobe-overview",
            "pathprobe / Overview",
            "Every path between regions at a glance: throughput against expected, RTT, loss, firing alerts.",
        )
        .with_row(Row("Culprits"))
        .with_panel(culprits())
        .with_row(Row("Region x region"))
        .with_panel(
            grid(
                "Throughput / expected, one stream",
                "Worst path between each pair of regions: last one-stream test's receiver-side rate as a share of the "
                "smallest limit that applies (per-flow, instance baseline, inter-region cap, Transit Gateway, buffer "
                f"bounds). Green >= {warn:.0%}, yellow >= {crit:.0%}: the alerts' thresholds.",
                "percentunit",
                ratio,
                steps((None, "red"), (crit, "yellow"), (warn, "green")),
            )
        )
        .with_panel(
            grid(
                "RTT p50 (TCP request/response)",
                "Worst path between each pair of regions: the exact median RTT of TCP request/response over the last "
                f"{w}, idle samples only (as the probe measured it, within 0.2%).",
                "s",
                rtt,
                steps((None, "green"), (0.1, "yellow"), (0.2, "red")),
                4,
            )
        )
        .with_panel(
            grid(
                "RTT p99 (TCP request/response)",
                f"Worst path between each pair of regions: the 99th percentile of TCP request/response RTT over the "
                f"last {w}, idle samples only. Far above the p50 beside it: queueing or retransmits on an idle path.",
                "s",
                tail,
                steps((None, "green"), (0.1, "yellow"), (0.2, "red")),
                4,
            )
        )
        .with_panel(
            grid(
                "Since the last throughput test",
                "Per pair of regions: the time since the most recent throughput test between them (any path, any "
                "test). It grows past the schedule's rotation (docs/fleet.md) when the pair's tests stop; per path, "
                f"PathprobeThroughputResultsStale fires at {p.stale_rotations:g} rotations.",
                "s",
                tested,
                steps((None, "transparent")),
                0,
            )
        )
        .with_panel(
            grid(
                "UDP echo loss",
                "Worst path between each pair of regions: share of low-rate UDP echo packets lost over 5 minutes.",
                "percentunit",
                loss,
                steps((None, "green"), (p.loss_ratio_warning, "yellow"), (p.loss_ratio_critical, "red")),
                3,
            )
        )
        .with_row(Row("Now"))
        .with_panel(
            stat.Panel()
            .title(f"Region pairs below {warn:.0%} of expected")
            .description(
                f"Tests between two regions (protocol, streams, direction) whose worst path's last "
                f"result is below {warn:.0%} of expected."
            )
            .unit("short")
            .datasource(DS)
            .span(QUARTER)
            .height(5)
            .with_target(
                query(
                    f"count(region_pair:pathprobe_throughput_expected_ratio:min < {warn:g}) or vector(0)", instant=True
                )
            )
            .thresholds(steps((None, "green"), (1, "red")))
            .data_links([links.panel_link("Throughput of the chosen paths")])
        )
        .with_panel(
            stat.Panel()
            .title("Paths unreachable")
            .description("Paths (host to peer) with no answer to any RTT probe over 5 minutes.")
            .unit("short")
            .datasource(DS)
            .span(QUARTER)
            .height(5)
            .with_target(query("sum(region_pair:pathprobe_paths_unreachable:count) or vector(0)", instant=True))
            .thresholds(steps((None, "green"), (1, "red")))
            .data_links([links.panel_link("Probe outcomes of the chosen paths")])
        )
        .with_panel(
            table.Panel()
            .title("Firing pathprobe alerts")
            .description(
                "Alerts of the pathprobe rules firing now, with the path they name (on a regional or "
                "single Prometheus: a global one evaluates no per-path alert)."
            )
            .unit("short")
            .datasource(DS)
            .span(HALF)
            .height(5)
            .with_target(
                query(
                    links.with_detail_labels('ALERTS{alertname=~"Pathprobe.*", alertstate="firing", job=~"$job"}'),
                    instant=True,
                    fmt=PromQueryFormat.TABLE,
                )
            )
            .with_transformation(
                DataTransformerConfig(
                    id_val="organize",
                    options={
                        "excludeByName": {
                            "Time": True,
                            "Value": True,
                            "__name__": True,
                            "alertstate": True,
                            "job": True,
                            "detail": True,
                        }
                    },
                )
            )
            .data_links([links.row_link("The alert's paths")])
            .override_by_regexp(links.HIDDEN_FIELDS, [links.HIDDEN])
        )
    )


def culprits() -> table.Panel:
    """The culprits named now (rules group pathprobe.culprits), one row each: scope, name, level,
    since when (its alert's active-since time), and the evidence: bad paths of its paths."""
    named = "culprit:pathprobe_culprit:level"
    # Each query keeps the culprits' own labels and no metric name, so that the merge joins them
    # into one row each; since: its warning alert's (it fires first and stays while the culprit is named).
    alerts = "|".join(CULPRIT_ALERTS.values())
    since = f'max without (alertname, severity) (ALERTS_FOR_STATE{{alertname=~"{alerts}"}})'
    return (
        table.Panel()
        .title("Culprits now")
        .description(
            "The host (egress or ingress), zone, region pair or Transit Gateway attachment most of whose "
            "paths are bad, as the culprit rules name it (alerts/runbook.md#culprits): level 2 critical, 1 "
            "warning; since: when its alert became active; bad paths of its paths. Empty: no shared fault; "
            "the per-path grid below shows any single bad path."
        )
        .unit("short")
        .datasource(DS)
        .span(FULL)
        .height(6)
        # The culprit's paths (links.with_detail_labels: hidden labels that the row's link reads).
        .with_target(
            query(
                links.with_detail_labels(f"max without () ({named})"), instant=True, fmt=PromQueryFormat.TABLE, ref="A"
            )
        )
        .with_target(query(since, instant=True, fmt=PromQueryFormat.TABLE, ref="B"))
        .with_target(
            query(
                f"max without () (culprit:pathprobe_paths_bad:count and {named})",
                instant=True,
                fmt=PromQueryFormat.TABLE,
                ref="C",
            )
        )
        .with_target(
            query(
                f"max without () (culprit:pathprobe_paths:count and {named})",
                instant=True,
                fmt=PromQueryFormat.TABLE,
                ref="D",
            )
        )
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "detail": True},
                    "renameByName": {
                        "Value #A": "level",
                        "Value #B": "since",
                        "Value #C": "bad paths",
                        "Value #D": "paths",
                    },
                    "indexByName": {
                        "scope": 0,
                        "side": 1,
                        "host": 2,
                        "zone": 3,
                        "region": 4,
                        "peer_region": 5,
                        "attachment": 6,
                        "Value #A": 7,
                        "Value #B": 8,
                        "Value #C": 9,
                        "Value #D": 10,
                    },
                },
            )
        )
        .data_links([links.row_link("The culprit's paths")])
        .override_by_regexp(links.HIDDEN_FIELDS, [links.HIDDEN])
    )
