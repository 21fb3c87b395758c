"""Tests bound by their own ends, in the lab, through Prometheus and Alertmanager: a host whose
iperf3 gets a small share of a CPU (a cgroup's quota, its exporter left alone), and a receiver whose
UDP socket buffer overflows because its iperf3, as small, cannot read it. Their tests read low and
name the host's CPU or its drops; for ten minutes no path or culprit alert fires about their paths,
and the host-scope warning does, naming the host and the remedy. Two pairs of hosts, each a mesh of
two, as the fire drills' pairs are."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import scrape, start_exporter, topology, value, wait_for
from pathprobe import promql
from pathprobe_lab import demo, net
from pathprobe_lab.configs import METRICS_PORT, exporter_config, lab_alert_params, rotation_seconds
from pathprobe_lab.topology import address

ALERTS = Path(__file__).parents[1] / "alerts"
# The iperf3 of each pair's second host gets 0.005 of a CPU: a few tens of Mbit/s where the path
# carries 500 (c6gn.xlarge at the lab's scale), a test bound by that host alone.
SMALL = 0.005
LAB = topology(f"""
hosts:
  - {{name: cpu-a, region: ap-northeast-1, zone: ap-northeast-1a, instance_type: c6gn.xlarge}}
  - {{name: cpu-b, region: ap-northeast-3, zone: ap-northeast-3a, instance_type: c6gn.xlarge, iperf3_cpu: {SMALL}}}
  - {{name: udp-a, region: ap-southeast-1, zone: ap-southeast-1a, instance_type: c6gn.xlarge}}
  - {{name: udp-b, region: ap-northeast-2, zone: ap-northeast-2a, instance_type: c6gn.xlarge, iperf3_cpu: {SMALL}}}
paths:
  - {{between: [ap-northeast-1, ap-northeast-3], one_way_delay: 4ms}}
  - {{between: [ap-southeast-1, ap-northeast-2], one_way_delay: 4ms}}
""")
PAIRS = {"cpu": ("cpu-a", "cpu-b"), "udp": ("udp-a", "udp-b")}
# TCP tests of 1 and 4 streams for the CPU pair; one UDP test at 200 Mbit/s for the other.
TESTS = {
    "cpu": {"streams": [1, 4], "duration_seconds": 2, "omit_seconds": 1},
    "udp": {"protocols": ["udp"], "streams": [1], "udp_bitrate": "200M", "duration_seconds": 2, "omit_seconds": 0},
}
SLOT = 26.0  # as the fire drills': two tests of 1 + 2 s with their margins in each half
ROTATION = rotation_seconds(LAB.model_copy(update={"hosts": LAB.hosts[:2]}), SLOT)
WATCHED_SECONDS = 600.0  # how long the paths must stay silent
PROM_PORT, AM_PORT, WEBHOOK_PORT = 19290, 19293, 19298
HOST_BOUND = "PathprobeThroughputTestHostBound"


@dataclass(frozen=True)
class Lab:
    prom: str
    log: Path
    started: float


def metrics(host: str) -> str:
    return f"{address(next(i for i, h in enumerate(LAB.hosts, start=1) if h.name == host))}:{METRICS_PORT}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    work = tmp_path_factory.mktemp("host-bound")
    net.up(LAB)
    try:
        for pair, (a, b) in PAIRS.items():
            for host, peer in ((a, b), (b, a)):
                cfg = exporter_config(LAB, host, work, SLOT, {"throughput": TESTS[pair]})
                cfg["peers"] = [p for p in cfg["peers"] if p["name"] == peer]
                start_exporter(host, cfg, work)
        log = work / "alerts.log"
        log.touch()
        webhook = demo.start_webhook(log, WEBHOOK_PORT)
        meshes = {host: pair for pair, hosts in PAIRS.items() for host in hosts}
        routing, params = ALERTS / "alertmanager.yml", lab_alert_params(ROTATION)
        prom, _ = demo.start_monitoring(LAB, work, PROM_PORT, AM_PORT, routing, params, WEBHOOK_PORT, meshes)
        yield Lab(prom, log, time.monotonic())
        webhook.shutdown()
    finally:
        net.down()


def alerts(log: Path) -> list[dict]:
    return [a for line in log.read_text().splitlines() for a in json.loads(line)["alerts"]]


def of(alerts: list[dict], pair: str) -> list[dict]:
    hosts = set(PAIRS[pair])
    return [a for a in alerts if {a["labels"].get("host"), a["labels"].get("peer")} & hosts]


@pytest.mark.lab
def test_a_small_host_names_its_own_cpu_or_drops_and_no_path_alert_fires_for_ten_minutes(lab: Lab) -> None:
    # Each end's figures on /metrics: cpu-a's tests to cpu-b measured cpu-b's quota; cpu-b's own
    # tests measured it as their sender; udp-a's UDP test counted what udp-b dropped.
    def ends_seen() -> dict[str, object] | None:
        cpu_a, cpu_b, udp_a = scrape(metrics("cpu-a")), scrape(metrics("cpu-b")), scrape(metrics("udp-a"))
        seen = {
            "cpu-a receiver_cpu": value(
                cpu_a, "pathprobe_throughput_host_bound_info", limit="receiver_cpu", remedy="cpu_quota"
            ),
            "cpu-a usable": value(cpu_a, "pathprobe_throughput_end_usable_cpus", end="receiver", streams="4"),
            "cpu-b sender_cpu": value(cpu_b, "pathprobe_throughput_host_bound_info", limit="sender_cpu"),
            "udp-a drops": value(udp_a, "pathprobe_throughput_udp_receiver_dropped_datagrams"),
            "udp-a receiver_drops": value(udp_a, "pathprobe_throughput_host_bound_info", limit="receiver_drops"),
        }
        return seen if all(v is not None for v in seen.values()) else None

    seen = wait_for("each pair's tests naming their small host", ends_seen, timeout=6 * ROTATION)
    assert seen["cpu-a usable"] == pytest.approx(SMALL), seen  # the quota, read in cpu-b's namespace
    assert seen["udp-a drops"] > 0, seen  # type: ignore[operator]

    # The host-scope warning reaches the webhook for each pair's test from its first host to the small
    # one, naming the small host and the remedy. (The small hosts' own tests warn too: a starved UDP
    # sender sends in bursts when it gets the CPU back, and the other end's socket buffer overflows.)
    def warned(host: str, limit: str) -> dict | None:
        found = [
            a
            for a in alerts(lab.log)
            if a["labels"]["alertname"] == HOST_BOUND
            and a["labels"]["host"] == host
            and a["labels"].get("limit") == limit
        ]
        return found[0] if found else None

    cpu = wait_for("the CPU pair's host-scope warning", lambda: warned("cpu-a", "receiver_cpu"), timeout=6 * ROTATION)
    assert cpu["labels"]["scope"] == "host" and cpu["labels"]["severity"] == "warning"
    assert "the receiver's CPU (cpu-b)" in cpu["annotations"]["description"], cpu
    assert "held to a CPU quota (cgroup)" in cpu["annotations"]["description"]
    udp = wait_for("the UDP pair's host-scope warning", lambda: warned("udp-a", "receiver_drops"), timeout=6 * ROTATION)
    assert "the receiver's UDP socket buffer (udp-b)" in udp["annotations"]["description"], udp

    # Ten minutes in all, and nothing but that warning about either pair's paths.
    left = WATCHED_SECONDS - (time.monotonic() - lab.started)
    if left > 0:
        time.sleep(left)  # the window itself: what must not happen cannot be waited for
    others = {a["labels"]["alertname"] for pair in PAIRS for a in of(alerts(lab.log), pair)} - {HOST_BOUND}
    assert not others, (others, history(lab.prom))


def history(prom: str) -> list[str]:
    """Each test's verdicts and ends over the window, for a failure's message."""
    out = []
    for name in ("pathprobe_throughput_host_bound_info", "pathprobe_throughput_end_runnable_ratio",
                 "pathprobe_throughput_end_cpu_ratio", "path:pathprobe_throughput_expected_ratio:last"):  # fmt: skip
        for s in promql.query(prom, f"{name}[{int(WATCHED_SECONDS) + 60}s]"):
            m = s["metric"]
            labels = " ".join(f"{k}={m[k]}" for k in ("host", "peer", "streams", "end", "limit") if k in m)
            values = sorted({round(float(v), 3) for _, v in s["values"]})
            out.append(f"{name} {labels}: {values}")
    return out
