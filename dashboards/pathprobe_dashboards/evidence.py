"""The evidence panels of Path detail: the path's RTT beside AWS's own p50 for its Region pair
(`pathprobe aws-performance --serve` imports it), and the last test of each path with a link to
its whole record (/tests/<id> on the exporter)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import table, timeseries
from grafana_foundation_sdk.models.dashboard import DataTransformerConfig, DynamicConfigValue
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from pathprobe.monitoring.params import Params

from .common import DS, HALF, query, selector, series

# The exporters' scheme in the records' links: a fleet whose /metrics is served over TLS (web
# config file) renders the dashboards with https (dashboards/generate.py's parameters name none yet).
SCHEME = "http"


def aws_beside_ours(p: Params) -> timeseries.Panel:
    """The path's idle RTT p50 and AWS's own p50 between the chosen Regions."""
    return series(
        "RTT beside AWS's own p50",
        "This path's idle TCP RTT p50 (5 minutes) beside AWS's own median round trip from the source's Region "
        "to the peer's (Network Manager's Infrastructure Performance, every 5 minutes, from AWS's probes; imported by "
        "`pathprobe aws-performance --serve`). Ours rose and AWS's for the pair did too: AWS's backbone (open a "
        "support case with `pathprobe evidence --aws`); ours alone: this side (the hosts, the VPC, the Transit "
        "Gateway). No AWS line where nothing imports it.",
        "s",
        query(f'path:pathprobe_rtt_seconds:p50_5m{{{selector(p)}, protocol="tcp"}}', "ours {{host}} -> {{peer}}"),
        query(
            'pathprobe_aws_latency_p50_seconds{scope="region", source_region=~"$region", '
            'destination_region=~"$peer_region"}',
            "AWS {{source_region}} -> {{destination_region}}",
            ref="B",
        ),
    )


def test_records(p: Params) -> table.Panel:
    """Each path's last test: its record's id, a link to the whole record on the exporter."""
    link = f"{SCHEME}://${{__data.fields.instance}}/tests/${{__value.raw}}"
    return (
        table.Panel()
        .title("Last test's record")
        .description(
            "The id of each test's last kept record (pathprobe_evidence_last_test_info): the link opens its whole "
            "result on the exporter (/tests/<id>, behind /metrics' authentication): iperf3's per-interval rate, "
            "retransmits, cwnd and RTT per stream, both ends' CPU, the settings, what bound it and the ENA "
            "counters. /tests on the exporter lists the others; `pathprobe evidence` bundles them."
        )
        .unit("short")
        .datasource(DS)
        .span(HALF)
        .height(8)
        .with_target(
            query(f"pathprobe_evidence_last_test_info{{{selector(p)}}}", instant=True, fmt=PromQueryFormat.TABLE)
        )
        .with_transformation(
            DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True},
                    "indexByName": {"host": 0, "peer": 1, "protocol": 2, "streams": 3, "direction": 4, "test_id": 5},
                },
            )
        )
        .override_by_name("test_id", [DynamicConfigValue("links", [{"title": "The record", "url": link}])])
    )
