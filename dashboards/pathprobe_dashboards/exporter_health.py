"""pathprobe / Exporter health: the exporters themselves."""

from __future__ import annotations

from grafana_foundation_sdk.builders import stat
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from pathprobe.monitoring.params import Params

from .common import DS, HALF, QUARTER, dashboard, lines, query, series, steps, target


def build(p: Params) -> Dashboard:
    job = f'{target(p)}, host=~"$host"'
    return (
        dashboard(
            p,
            "pathprobe-exporter",
            "pathprobe / Exporter health",
            "The exporters themselves: up, probe outcomes, byte budget, scrape cost, resources, schedule.",
        )
        .with_row(Row("Mesh"))
        .with_panel(
            stat.Panel()
            .title("Exporters up")
            .description("Exporters Prometheus can scrape now.")
            .unit("short")
            .datasource(DS)
            .span(QUARTER)
            .height(8)
            .with_target(query(f"sum(up{{{job}}})", instant=True))
        )
        .with_panel(
            stat.Panel()
            .title("Schedules in the mesh")
            .description(
                "Distinct schedule fingerprints: 1 when every exporter has the same peer list and slot length."
            )
            .unit("short")
            .datasource(DS)
            .span(QUARTER)
            .height(8)
            .with_target(query(f"count(count by (fingerprint) (pathprobe_schedule_info{{{job}}}))", instant=True))
            .thresholds(steps((None, "green"), (2, "red")))
        )
        .with_panel(
            series(
                "Probe outcomes",
                "Probe attempts per second by probe and result.",
                "ops",
                query(
                    f"sum by (probe, result) (rate(pathprobe_probe_runs_total{{{job}}}[$__rate_interval]))",
                    "{{probe}} {{result}}",
                ),
                span=HALF,
            )
        )
        .with_panel(
            series(
                "Clock offset to peers",
                "Each host's clock minus each peer's, from the UDP echoes' stamps (the least-delayed exchange of the "
                'last 64). The "smallest |offset|" series of a host is the figure '
                f"PathprobeClockOffsetHigh compares with {p.clock_offset_max_seconds:g} s: one host off by that much "
                "starts its throughput turns at the wrong time.",
                "s",
                *lines(
                    (f"pathprobe_clock_offset_seconds{{{job}}}", "{{host}} vs {{peer}}"),
                    (f"min by (host) (abs(pathprobe_clock_offset_seconds{{{job}}}))", "{{host}} smallest |offset|"),
                ),
                span=HALF,
            )
        )
        .with_row(Row("Throughput loop and budget"))
        .with_panel(
            series(
                "Schedule turns, errors and skipped tests",
                "Client turns taken per hour, turns that ended on an unexpected error, and scheduled tests skipped "
                "(budget spent or slot over).",
                "short",
                *lines(
                    (f"increase(pathprobe_schedule_turns_total{{{job}}}[1h])", "turns {{host}}"),
                    (
                        f"sum by (host, reason) (increase(pathprobe_schedule_turn_errors_total{{{job}}}[1h]))",
                        "errors {{host}} {{reason}}",
                    ),
                    (
                        f"sum by (host, reason) (increase(pathprobe_throughput_skipped_total{{{job}}}[1h]))",
                        "skipped {{host}} {{reason}}",
                    ),
                ),
            )
        )
        .with_panel(
            series(
                "Byte budget remaining",
                "Bytes the throughput tests may still move today, per host.",
                "decbytes",
                *lines(
                    (f"pathprobe_budget_remaining_bytes{{{job}}}", "{{host}}"),
                    (f"pathprobe_budget_limit_bytes{{{job}}}", "{{host}} limit"),
                ),
            )
        )
        .with_row(Row("Responders"))
        .with_panel(
            series(
                "Responder requests",
                "What reached each host's responders, by outcome (refusals mean a host outside the peer list).",
                "ops",
                query(
                    f"sum by (host, responder, result) (rate(pathprobe_responder_requests_total{{{job}}}"
                    "[$__rate_interval]))",
                    "{{host}} {{responder}} {{result}}",
                ),
            )
        )
        .with_panel(
            series(
                "iperf3 server",
                "1 while each host's supervised iperf3 server runs; restarts per hour.",
                "short",
                *lines(
                    (f"pathprobe_iperf3_server_up{{{job}}}", "up {{host}}"),
                    (f"increase(pathprobe_iperf3_server_restarts_total{{{job}}}[1h])", "restarts {{host}}"),
                ),
            )
        )
        .with_row(Row("Cost of the exporter"))
        .with_panel(
            series(
                "Scrape duration",
                "Prometheus's scrape time, the snapshot's render time and age.",
                "s",
                query(f"scrape_duration_seconds{{{job}}}", "scrape {{host}}"),
                query(f"pathprobe_scrape_render_seconds{{{job}}}", "render {{host}}", ref="B"),
                query(f"pathprobe_scrape_snapshot_age_seconds{{{job}}}", "snapshot age {{host}}", ref="C"),
            )
        )
        .with_panel(
            series(
                "Event loop lateness",
                "How late each exporter's event loop ran its probes' timer passes (99th percentile and mean): a few "
                "milliseconds on a quiet host. Its responders answer its peers as late; a peer waits a timeout more "
                "for an RTT answer its request's acknowledgement says is coming: a busy host shows here, not as its "
                "paths' timeouts.",
                "s",
                *lines(
                    (
                        f"histogram_quantile(0.99, sum by (host, le) (rate(pathprobe_event_loop_lateness_seconds_bucket"
                        f"{{{job}}}[$__rate_interval])))",
                        "p99 {{host}}",
                    ),
                    (
                        f"rate(pathprobe_event_loop_lateness_seconds_sum{{{job}}}[$__rate_interval]) / "
                        f"rate(pathprobe_event_loop_lateness_seconds_count{{{job}}}[$__rate_interval])",
                        "mean {{host}}",
                    ),
                ),
            )
        )
        .with_panel(
            series(
                "Exporter CPU",
                "CPU time per second (share of one core).",
                "percentunit",
                query(f"rate(process_cpu_seconds_total{{{job}}}[$__rate_interval])", "{{host}}"),
            )
        )
        .with_panel(
            series(
                "Exporter memory",
                "Resident memory.",
                "bytes",
                query(f"process_resident_memory_bytes{{{job}}}", "{{host}}"),
            )
        )
    )
