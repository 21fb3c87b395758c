"""Grafana dashboards for pathprobe, as code (grafana-foundation-sdk).

    .venv/bin/python dashboards/generate.py            # writes dashboards/json/*.json
    .venv/bin/python dashboards/generate.py --check    # exit 1 if the committed JSON differs

Conventions: one `datasource` variable that every panel uses; `region`, `host` and
`peer` variables (multi, all); a unit and a description on every panel; stable UIDs;
links between the dashboards; the recording rules of alerts/ where they fit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders.dashboard import (
    CustomVariable,
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import TableColoredBackgroundCellOptions
from grafana_foundation_sdk.models.dashboard import (
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    GridPos,
    Panel,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUT = Path(__file__).parent / "json"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'region=~"$region", host=~"$host", peer=~"$peer"'
TAG = "pathprobe"


# --- small builders ------------------------------------------------------------------
def query(expr: str, legend: str = "", instant: bool = False, fmt: PromQueryFormat | None = None,
          ref: str = "A") -> Dataquery:  # fmt: skip
    q = Dataquery().expr(expr).ref_id(ref).datasource(DS)
    q = q.legend_format(legend) if legend else q
    q = q.instant() if instant else q.range()
    return q.format(fmt) if fmt else q


def steps(*pairs: tuple[float | None, str]) -> ThresholdsConfig:
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps([Threshold(v, c) for v, c in pairs])


def place(panel: Any, w: int, h: int, x: int, y: int) -> Builder[Panel]:
    """Position a panel (every panel builder has grid_pos; their common base does not)."""
    return panel.grid_pos(GridPos(h=h, w=w, x=x, y=y))  # type: ignore[no-any-return]


def series(title: str, description: str, unit: str, *targets: Dataquery) -> timeseries.Panel:
    p = timeseries.Panel().title(title).description(description).unit(unit).datasource(DS)
    for t in targets:
        p = p.with_target(t)
    return p


def grid(title: str, description: str, unit: str, expr: str, thresholds: ThresholdsConfig,
         decimals: int = 2) -> table.Panel:  # fmt: skip
    """A region x region matrix (perfSONAR MaDDash style): rows source region, columns peer region."""
    return (
        table.Panel().title(title).description(description).unit(unit).decimals(decimals).datasource(DS)
        .with_target(query(expr, instant=True, fmt=PromQueryFormat.TABLE))
        .with_transformation(DataTransformerConfig(id_val="groupingToMatrix", options={
            "rowField": "region", "columnField": "peer_region", "valueField": "Value", "emptyValue": "null"}))
        .thresholds(thresholds)
        .cell_options(TableColoredBackgroundCellOptions())
    )  # fmt: skip


def dashboard(uid: str, title: str, description: str) -> Dashboard:
    d = (
        Dashboard(title).uid(uid).description(description).tags([TAG]).editable()
        .time("now-6h", "now").refresh("1m").timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(variable("region", "Source region", "label_values(pathprobe_peer_info, region)"))
        .with_variable(variable("host", "Source host", 'label_values(pathprobe_peer_info{region=~"$region"}, host)'))
        .with_variable(variable("peer", "Peer", 'label_values(pathprobe_peer_info{host=~"$host"}, peer)'))
        .link(DashboardLink("pathprobe").type(DashboardLinkType.DASHBOARDS).tags([TAG]).as_dropdown(True)
              .include_vars(True).keep_time(True))
    )  # fmt: skip
    return d


def variable(name: str, label: str, definition: str) -> QueryVariable:
    return (
        QueryVariable(name).label(label).datasource(DS).query(definition).refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True).include_all(True).all_value(".*").current(VariableOption(True, "All", "$__all"))
    )  # fmt: skip


# --- the dashboards -----------------------------------------------------------------------
def overview() -> Dashboard:
    d = dashboard(
        "pathprobe-overview",
        "pathprobe / Overview",
        "Every path between regions at a glance: throughput against expected, RTT, loss, firing alerts.",
    )
    ratio = f'min by (region, peer_region) (path:pathprobe_throughput_expected_ratio:last{{{SEL}, streams="1", direction="send"}})'  # noqa: E501
    rtt = f'max by (region, peer_region) (path:pathprobe_rtt_seconds:p50_5m{{{SEL}, protocol="tcp"}})'
    loss = f"max by (region, peer_region) (path:pathprobe_udp_loss_ratio:rate5m{{{SEL}}})"
    panels = [
        place(
            grid(
                "Throughput / expected, one stream",
                "Worst path between each pair of regions: last one-stream "
                "test's receiver-side rate as a share of the smallest limit that applies (per-flow, instance, "
                "inter-region cap, Transit Gateway, receive window). Green >= 90%, yellow >= 70%.",
                "percentunit",
                ratio,
                steps((None, "red"), (0.7, "yellow"), (0.9, "green")),
            ),
            8,
            9,
            0,
            0,
        ),
        place(
            grid(
                "RTT p50 (TCP request/response)",
                "Worst path between each pair of regions: median RTT of "
                "TCP request/response over 5 minutes, from the histogram.",
                "s",
                rtt,
                steps((None, "green"), (0.1, "yellow"), (0.2, "red")),
                4,
            ),
            8,
            9,
            8,
            0,
        ),
        place(
            grid(
                "UDP echo loss",
                "Worst path between each pair of regions: share of low-rate UDP echo packets lost over 5 minutes.",
                "percentunit",
                loss,
                steps((None, "green"), (0.001, "yellow"), (0.01, "red")),
                3,
            ),
            8,
            9,
            16,
            0,
        ),
        place(
            stat.Panel()
            .title("Paths below 80% of expected")
            .description("Source-to-peer test series whose last result is below 80% of expected.")
            .unit("short")
            .datasource(DS)
            .with_target(
                query(f"count(path:pathprobe_throughput_expected_ratio:last{{{SEL}}} < 0.8) or vector(0)", instant=True)
            )
            .thresholds(steps((None, "green"), (1, "red"))),
            6,
            5,
            0,
            9,
        ),
        place(
            stat.Panel()
            .title("Peers unreachable")
            .description("Peers with no answer to any RTT probe over 5 minutes.")
            .unit("short")
            .datasource(DS)
            .with_target(
                query(
                    f'count(sum by (host, peer) (increase(pathprobe_probe_runs_total{{{SEL}, probe="rtt", '
                    f'result="ok"}}[5m])) == 0) or vector(0)',
                    instant=True,
                )
            )
            .thresholds(steps((None, "green"), (1, "red"))),
            6,
            5,
            6,
            9,
        ),
        place(
            table.Panel()
            .title("Firing pathprobe alerts")
            .description("Alerts of the pathprobe rules firing now, with the path they name.")
            .unit("short")
            .datasource(DS)
            .with_target(
                query('ALERTS{alertname=~"Pathprobe.*", alertstate="firing"}', instant=True, fmt=PromQueryFormat.TABLE)
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
                        }
                    },
                )
            ),
            12,
            5,
            12,
            9,
        ),
    ]
    for p in panels:
        d = d.with_panel(p)
    return d


def path_detail() -> Dashboard:
    d = dashboard(
        "pathprobe-path",
        "pathprobe / Path detail",
        "One path in detail: throughput against its expected value and binding limit, retransmits, "
        "RTT over time and as a heatmap, loss, jitter, and probe outcomes.",
    )
    panels = [
        series(
            "Throughput and expected",
            "Receiver-side rate of each test (by streams and direction) and the "
            "expected rate with the binding limit in the legend.",
            "bps",
            query(
                f"path:pathprobe_throughput_bits_per_second:last{{{SEL}}}",
                "{{host}} -> {{peer}} {{protocol}} x{{streams}} {{direction}}",
            ),
            query(
                f"path:pathprobe_throughput_expected_bits_per_second:last{{{SEL}}}",
                "expected x{{streams}} {{direction}} ({{limit}})",
                ref="B",
            ),
        ),
        series(
            "Throughput / expected",
            "Each test's rate as a share of expected; alerts fire below 80% (warning) "
            "and 50% (critical) over consecutive tests.",
            "percentunit",
            query(
                f"path:pathprobe_throughput_expected_ratio:last{{{SEL}}}",
                "{{host}} -> {{peer}} x{{streams}} {{direction}} ({{limit}})",
            ),
        ),
        series(
            "Retransmits per test",
            "TCP retransmits in the last test (sender side).",
            "short",
            query(f"pathprobe_throughput_retransmits{{{SEL}}}", "{{host}} -> {{peer}} x{{streams}} {{direction}}"),
        ),
        series(
            "RTT quantiles",
            "TCP request/response and UDP echo RTT, p50 and p99 over 5 minutes.",
            "s",
            query(f"path:pathprobe_rtt_seconds:p50_5m{{{SEL}}}", "p50 {{host}} -> {{peer}} {{protocol}}"),
            query(f"path:pathprobe_rtt_seconds:p99_5m{{{SEL}}}", "p99 {{host}} -> {{peer}} {{protocol}}", ref="B"),
        ),
        heatmap.Panel()
        .title("RTT heatmap (TCP)")
        .description("Distribution of TCP request/response RTT from the histogram buckets.")
        .unit("s")
        .datasource(DS)
        .with_target(
            query(
                f'sum by (le) (increase(pathprobe_rtt_seconds_bucket{{{SEL}, protocol="tcp"}}[$__rate_interval]))',
                "{{le}}",
                fmt=PromQueryFormat.HEATMAP,
            )
        ),
        series(
            "UDP echo loss and jitter",
            "Share of UDP echo packets lost over 5 minutes, and the smoothed variation of successive RTTs (RFC 3550).",
            "percentunit",
            query(f"path:pathprobe_udp_loss_ratio:rate5m{{{SEL}}}", "loss {{host}} -> {{peer}}"),
            query(f"pathprobe_udp_jitter_seconds{{{SEL}}} * 1000", "jitter ms {{host}} -> {{peer}}", ref="B"),
        ),
        series(
            "Probe outcomes",
            "Probe attempts per second by probe and result (ok, busy, timeout, refused, "
            "unreachable, not_allowed, error).",
            "ops",
            query(
                'sum by (probe, result) (rate(pathprobe_probe_runs_total{host=~"$host", peer=~"$peer"}'
                "[$__rate_interval]))",
                "{{probe}} {{result}}",
            ),
        ),
        series(
            "Last successful test age",
            "Seconds since each probe last succeeded for the path.",
            "s",
            query(
                'time() - pathprobe_probe_last_success_timestamp_seconds{host=~"$host", peer=~"$peer"}',
                "{{probe}} {{host}} -> {{peer}}",
            ),
        ),
    ]
    for i, p in enumerate(panels):
        d = d.with_panel(place(p, 12, 8, 12 * (i % 2), 8 * (i // 2)))
    return d


def capacity() -> Dashboard:
    d = (
        dashboard("pathprobe-capacity", "pathprobe / Capacity review",
                  "Sustained throughput per path over 30 days, headroom to the limits, and the time and cost to "
                  "move a data set (`pathprobe capacity` does the same from the command line).")
        .with_variable(CustomVariable("volume_tb").label("Data set (TB)").values("40,1,10,100,500")
                       .current(VariableOption(True, "40", "40")))
        .with_variable(CustomVariable("price_per_gb").label("Transfer $/GB").values("0.02,0.01,0.09")
                       .current(VariableOption(True, "0.02", "0.02")))
    )  # fmt: skip
    base = f'path:pathprobe_throughput_bits_per_second:last{{{SEL}, direction="send"}}'
    pct = {"p10": 0.1, "p50": 0.5, "p90": 0.9}
    targets = [query(f"quantile_over_time({q}, {base}[30d])", instant=True, fmt=PromQueryFormat.TABLE,
                     ref=name) for name, q in pct.items()]  # fmt: skip
    sustained = (
        table.Panel()
        .title("Sustained throughput over 30 days")
        .description("Percentiles of each path's test results (receiver side) over 30 days, by stream count.")
        .unit("bps")
        .datasource(DS)
        .decimals(3)
    )
    for t in targets:
        sustained = sustained.with_target(t)
    sustained = sustained.with_transformation(DataTransformerConfig(id_val="merge", options={}))
    headroom = (
        table.Panel()
        .title("Headroom to each limit")
        .description("Expected rate (the binding limit) minus the 30-day median: how much more the path should give.")
        .unit("bps")
        .datasource(DS)
        .decimals(3)
        .with_target(
            query(
                f"max by (host, peer, streams, limit) (path:pathprobe_throughput_expected_bits_per_second:last{{{SEL}, "
                f'direction="send"}}) - on (host, peer, streams) group_left () max by (host, peer, streams) '
                f"(quantile_over_time(0.5, {base}[30d]))",
                instant=True,
                fmt=PromQueryFormat.TABLE,
            )
        )
    )
    move = (
        table.Panel()
        .title("Time to move the data set")
        .description("Seconds to move $volume_tb TB at each path's 30-day median rate, by stream count.")
        .unit("s")
        .datasource(DS)
        .with_target(
            query(
                f"$volume_tb * 1e12 * 8 / max by (host, peer, streams) (quantile_over_time(0.5, {base}[30d]))",
                instant=True,
                fmt=PromQueryFormat.TABLE,
            )
        )
    )
    cost = (
        stat.Panel()
        .title("Transfer cost")
        .description("Data set size x price per GB (inter-region transfer is billed per GB moved).")
        .unit("currencyUSD")
        .datasource(DS)
        .with_target(query("vector($volume_tb * 1000 * $price_per_gb)", instant=True))
    )
    spent = series(
        "Probe bytes per day",
        "Bytes the throughput probes moved per day: the monitoring's own transfer cost.",
        "decbytes",
        query(
            'sum by (host) (increase(pathprobe_probe_bytes_sent_total{host=~"$host", probe="throughput"}[1d]))',
            "{{host}}",
        ),
    )
    for p, (w, h, x, y) in ((sustained, (16, 10, 0, 0)), (cost, (8, 5, 16, 0)), (spent, (8, 5, 16, 5)),
                            (headroom, (12, 9, 0, 10)), (move, (12, 9, 12, 10))):  # fmt: skip
        d = d.with_panel(place(p, w, h, x, y))
    return d


def exporter_health() -> Dashboard:
    d = dashboard(
        "pathprobe-exporter",
        "pathprobe / Exporter health",
        "The exporters themselves: up, probe outcomes, byte budget, scrape cost, resources, schedule.",
    )
    job = 'job="pathprobe", host=~"$host"'
    panels = [
        stat.Panel()
        .title("Exporters up")
        .description("Exporters Prometheus can scrape now.")
        .unit("short")
        .datasource(DS)
        .with_target(query(f"sum(up{{{job}}})", instant=True)),
        stat.Panel()
        .title("Schedules in the mesh")
        .description("Distinct schedule fingerprints: 1 when every exporter has the same peer list and slot length.")
        .unit("short")
        .datasource(DS)
        .with_target(query(f"count(count by (fingerprint) (pathprobe_schedule_info{{{job}}}))", instant=True))
        .thresholds(steps((None, "green"), (2, "red"))),
        series(
            "Probe outcomes",
            "Probe attempts per second by probe and result.",
            "ops",
            query(
                f"sum by (probe, result) (rate(pathprobe_probe_runs_total{{{job}}}[$__rate_interval]))",
                "{{probe}} {{result}}",
            ),
        ),
        series(
            "Byte budget remaining",
            "Bytes the throughput tests may still move today, per host.",
            "decbytes",
            query(f"pathprobe_budget_remaining_bytes{{{job}}}", "{{host}}"),
            query(f"pathprobe_budget_limit_bytes{{{job}}}", "{{host}} limit", ref="B"),
        ),
        series(
            "Scrape duration",
            "Prometheus's scrape time, the snapshot's render time and age.",
            "s",
            query(f"scrape_duration_seconds{{{job}}}", "scrape {{host}}"),
            query(f"pathprobe_scrape_render_seconds{{{job}}}", "render {{host}}", ref="B"),
            query(f"pathprobe_scrape_snapshot_age_seconds{{{job}}}", "snapshot age {{host}}", ref="C"),
        ),
        series(
            "Exporter CPU",
            "CPU time per second (share of one core).",
            "percentunit",
            query(f"rate(process_cpu_seconds_total{{{job}}}[$__rate_interval])", "{{host}}"),
        ),
        series(
            "Exporter memory", "Resident memory.", "bytes", query(f"process_resident_memory_bytes{{{job}}}", "{{host}}")
        ),
        series(
            "Schedule turns and skipped tests",
            "Client turns taken per hour, and scheduled tests skipped (budget spent or slot over).",
            "short",
            query(f"increase(pathprobe_schedule_turns_total{{{job}}}[1h])", "turns {{host}}"),
            query(
                f"sum by (host, reason) (increase(pathprobe_throughput_skipped_total{{{job}}}[1h]))",
                "skipped {{host}} {{reason}}",
                ref="B",
            ),
        ),
        series(
            "Responder requests",
            "What reached each host's responders, by outcome (refusals mean a host outside the peer list).",
            "ops",
            query(
                f"sum by (host, responder, result) (rate(pathprobe_responder_requests_total{{{job}}}"
                "[$__rate_interval]))",
                "{{host}} {{responder}} {{result}}",
            ),
        ),
        series(
            "iperf3 server",
            "1 while each host's supervised iperf3 server runs; restarts per hour.",
            "short",
            query(f"pathprobe_iperf3_server_up{{{job}}}", "up {{host}}"),
            query(f"increase(pathprobe_iperf3_server_restarts_total{{{job}}}[1h])", "restarts {{host}}", ref="B"),
        ),
    ]
    # Two small stats and the outcomes on top, then two panels a row.
    layout = [(6, 8, 0, 0), (6, 8, 6, 0), (12, 8, 12, 0)] + [(12, 8, 12 * (i % 2), 8 + 8 * (i // 2)) for i in range(7)]
    for p, (w, h, x, y) in zip(panels, layout, strict=True):
        d = d.with_panel(place(p, w, h, x, y))
    return d


DASHBOARDS = {"overview": overview, "path-detail": path_detail, "capacity": capacity,
              "exporter-health": exporter_health}  # fmt: skip


def render() -> dict[str, str]:
    return {f"{name}.json": json.dumps(fn().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"
            for name, fn in DASHBOARDS.items()}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed JSON instead of writing")
    args = parser.parse_args()
    rendered = render()
    if args.check:
        stale = [n for n, text in rendered.items() if not (OUT / n).exists() or (OUT / n).read_text() != text]
        if stale:
            print(f"dashboards out of date: {', '.join(stale)} (run dashboards/generate.py)", file=sys.stderr)
            return 1
        return 0
    OUT.mkdir(exist_ok=True)
    for name, text in rendered.items():
        (OUT / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
