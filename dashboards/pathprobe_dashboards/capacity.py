"""pathprobe / Capacity review: 30 days of results, headroom, time and cost to move a data set."""

from __future__ import annotations

from grafana_foundation_sdk.builders import stat, table, timeseries
from grafana_foundation_sdk.builders.dashboard import CustomVariable, Dashboard, Row
from grafana_foundation_sdk.models.dashboard import DataTransformerConfig, VariableOption
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from pathprobe.monitoring.params import Params

from .common import DS, HALF, THIRD, dashboard, query, selector, series, target


def build(p: Params) -> Dashboard:
    sel = selector(p)
    base = f'path:pathprobe_throughput_bits_per_second:last{{{sel}, direction="send"}}'
    sustained = (
        table.Panel()
        .title("Sustained throughput over 30 days, beside the prediction")
        .description(
            "Percentiles of each path's test results (receiver side) over 30 days, by stream count, "
            "beside what the model predicts for the path now (`pathprobe capacity --predict` gives the "
            "same before the hosts exist): the floor (baseline bandwidths; the alerts compare with it) "
            "and the peak (while the instances' network I/O credits last)."
        )
        .unit("bps")
        .datasource(DS)
        .decimals(3)
        .span(16)
        .height(10)  # beside the cost
    )
    for name, q in {"p10": 0.1, "p50": 0.5, "p90": 0.9}.items():
        sustained = sustained.with_target(
            query(f"quantile_over_time({q}, {base}[30d])", instant=True, fmt=PromQueryFormat.TABLE, ref=name)
        )
    predicted = {  # without the binding limit's name, so that each row joins its path's percentiles
        "predicted floor": f"max without (limit) (path:pathprobe_throughput_expected_bits_per_second:last{{{sel}, "
        'direction="send"})',
        "predicted peak": f"8 * max without (limit) (pathprobe_throughput_expected_peak_bytes_per_second{{{sel}, "
        'direction="send"})',
    }
    for name, expr in predicted.items():
        sustained = sustained.with_target(query(expr, instant=True, fmt=PromQueryFormat.TABLE, ref=name))
    sustained = sustained.with_transformation(DataTransformerConfig(id_val="merge", options={}))
    return (
        dashboard(
            p,
            "pathprobe-capacity",
            "pathprobe / Capacity review",
            "Sustained throughput per path over 30 days, headroom to the limits, and the time and cost to "
            "move a data set (`pathprobe capacity` does the same from the command line).",
        )
        .with_variable(
            CustomVariable("volume_tb")
            .label("Data set (TB)")
            .values("40,1,10,100,500")
            .current(VariableOption(True, "40", "40"))
        )
        .with_variable(
            CustomVariable("price_per_gb")
            .label("Transfer $/GB")
            .values("0.02,0.01,0.09")
            .current(VariableOption(True, "0.02", "0.02"))
        )
        .with_row(Row("Throughput over 30 days"))
        .with_panel(sustained)
        .with_panel(
            stat.Panel()
            .title("Transfer cost")
            .description("Data set size x price per GB (inter-region transfer is billed per GB moved).")
            .unit("currencyUSD")
            .datasource(DS)
            .span(THIRD)
            .height(5)
            .with_target(query("vector($volume_tb * 1000 * $price_per_gb)", instant=True))
        )
        .with_panel(
            series(
                "Probe bytes per day",
                "Bytes the throughput probes moved per day: the monitoring's own transfer cost.",
                "decbytes",
                query(
                    f'sum by (host) (increase(pathprobe_probe_bytes_sent_total{{{target(p)}, host=~"$host", '
                    'probe="throughput"}[1d]))',
                    "{{host}}",
                ),
                span=THIRD,
            )
        )
        .with_panel(
            series(
                "Probe cost per day",
                "Dollars the probes' transfer cost per day, at the exporters' budget.price_per_gb "
                "of each path class (none where no price is set).",
                "currencyUSD",
                query(
                    f'sum by (host) (increase(pathprobe_probe_cost_dollars_total{{{target(p)}, host=~"$host"}}[1d]))',
                    "{{host}}",
                ),
                span=THIRD,
            )
        )
        .with_row(Row("Headroom and time"))
        .with_panel(
            table.Panel()
            .title("Headroom to each limit")
            .description(
                "Expected rate (the binding limit) minus the 30-day median: how much more the path should give."
            )
            .unit("bps")
            .datasource(DS)
            .decimals(3)
            .span(HALF)
            .height(9)
            .with_target(
                query(
                    "max by (host, peer, streams, limit) "
                    f"(path:pathprobe_throughput_expected_bits_per_second:last{{{sel}, "
                    f'direction="send"}}) - on (host, peer, streams) group_left () max by (host, peer, streams) '
                    f"(quantile_over_time(0.5, {base}[30d]))",
                    instant=True,
                    fmt=PromQueryFormat.TABLE,
                )
            )
        )
        .with_panel(
            table.Panel()
            .title("Time to move the data set")
            .description("Seconds to move $volume_tb TB at each path's 30-day median rate, by stream count.")
            .unit("s")
            .datasource(DS)
            .span(HALF)
            .height(9)
            .with_target(
                query(
                    f"$volume_tb * 1e12 * 8 / max by (host, peer, streams) (quantile_over_time(0.5, {base}[30d]))",
                    instant=True,
                    fmt=PromQueryFormat.TABLE,
                )
            )
        )
        .with_row(Row("The applications' own flows"))
        .with_panel(applications_limited(p))
    )


def applications_limited(p: Params) -> timeseries.Panel:
    """The share of the bytes the hosts' applications sent to each peer region that went while their
    flows were window- or buffer-limited: each path's bytes weighted by its flows' limited share."""
    sel, w = selector(p), "$__rate_interval"
    path = "host, peer, peer_region"
    limited = "pathprobe_tcp_flows_limited_seconds_total"
    share = (
        f'sum by ({path}) (rate({limited}{{{sel}, limit=~"receive_window|send_buffer"}}[{w}]))\n'
        f'  / sum by ({path}) (rate({limited}{{{sel}, limit!="application"}}[{w}]))'
    )
    sent = f"sum by ({path}) (rate(pathprobe_tcp_flows_bytes_acked_total{{{sel}}}[{w}]))"
    return series(
        "Applications' bytes sent window- or buffer-limited, by peer region",
        "Of the bytes this fleet's applications sent to each peer region (their own TCP flows, tcp_info: "
        "pathprobe_tcp_flows_*), the share sent while the flows were limited by the receiver's window or the "
        "sender's buffer (each path's bytes weighted by its flows' limited share of sending time): capacity the "
        "path has and a buffer setting withholds (PathprobeApplicationsWindowLimited names the figure).",
        "percentunit",
        query(
            f"sum by (peer_region) (({share}) * {sent})\n  / sum by (peer_region) ({sent})",
            "{{peer_region}}",
        ),
    )
