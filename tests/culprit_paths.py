"""The synthetic paths the culprit tests and bench/rule_cost.py feed to the shipped rules: hosts with
their region, zone and Transit Gateway attachment, the directed paths between them with the labels
the exporters give their series, and bench/fleet.py's 1,000-host fleet served as one exposition
with three faults at once (the rules' windows in seconds, as the lab's)."""

from __future__ import annotations

import http.server
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pathprobe.mesh import Member, links
from pathprobe.monitoring.params import Params
from pathprobe.probe_settings import RTT_INTERVAL_DEFAULT

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from fleet import HIER2, fleet  # bench/ is not a package


@dataclass(frozen=True)
class Host:
    name: str
    region: str
    zone: str
    attachment: str = ""  # its VPC's Transit Gateway attachment


@dataclass(frozen=True)
class Path_:
    src: Host
    dst: Host
    path_class: str

    def labels(self) -> dict[str, str]:
        """The labels of the path's series: the source's target labels and the peer's."""
        return {
            "job": "pathprobe",
            "instance": f"{self.src.name}:9469",
            "host": self.src.name,
            "region": self.src.region,
            "zone": self.src.zone,
            "peer": self.dst.name,
            "peer_region": self.dst.region,
            "path_class": self.path_class,
        }

    def info(self) -> dict[str, str]:
        tgw = self.path_class == "transit_gateway"
        return {
            **self.labels(),
            "peer_zone": self.dst.zone,
            "address": "198.18.0.1",
            "attachment": self.src.attachment if tgw else "",
            "peer_attachment": self.dst.attachment if tgw else "",
        }


def path_class(a: Host, b: Host) -> str:
    if a.attachment and b.attachment and a.attachment != b.attachment:
        return "transit_gateway"
    return "intra_region" if a.region == b.region else "inter_region"


def between(paths: list[Path_], src: str = "", dst: str = "", **where: str) -> list[Path_]:
    """The paths whose source is `src` (a host), destination `dst`, and whose other fields match
    (src_region, dst_region, src_zone, dst_zone, src_attachment, path_class); a zone matches either end."""

    def ok(p: Path_) -> bool:
        checks = {
            "src": p.src.name,
            "dst": p.dst.name,
            "src_region": p.src.region,
            "dst_region": p.dst.region,
            "src_attachment": p.src.attachment,
            "path_class": p.path_class,
        }
        given = {"src": src, "dst": dst, **where}
        zone = given.pop("zone", "")
        return all(checks[k] == v for k, v in given.items() if v) and (not zone or zone in (p.src.zone, p.dst.zone))

    return [p for p in paths if ok(p)]


def fleet_mesh() -> list[Path_]:
    """bench/fleet.py's 1,000 hosts in 30 regions (three zones each), hierarchical with two
    representatives per region pair: each link probed both ways."""
    members: list[Member] = fleet(1000, 30)
    hosts = {m.name: Host(m.name, m.region, m.zone) for m in members}
    return [
        Path_(hosts[a], hosts[b], path_class(hosts[a], hosts[b]))
        for x, y in sorted(links(members, HIER2))
        for a, b in ((x, y), (y, x))
    ]


# --- the 1,000-host fleet as its exporters' series -----------------------------------
# Rules evaluated every 30 s (the shipped default: 1m): on this 2-core machine the culprit group takes
# 16-21 s for the fleet's 34,080 paths, each with its echo and RTT probe counters, with the per-path
# alerts' group (10-17 s) beside it. When an evaluation outlasts the interval, Prometheus skips the
# next, and a culprit's warning, whose Alertmanager wait counts three evaluations (alertmanager.yml),
# went out before its critical form had been evaluated. The per-path alerts' `for` three evaluations,
# well above the culprit's: a culprit needs most of its paths bad, and with a 30 s window the last of
# them crosses its threshold an evaluation after the first (the shipped defaults: 10m against 3m).
FLEET_PARAMS = Params(
    loss_window="30s",
    loss_for="90s",
    unreachable_window="30s",
    unreachable_for="90s",
    culprit_for="5s",
    evaluation_interval="30s",
    baseline_evaluation_interval="30s",
    rtt_baseline_window="15m",
    rtt_baseline_step="30s",
)
FLEET_SCRAPE_INTERVAL = "10s"

ECHOES_PER_SECOND = 10
RTT_PROBES_PER_SECOND = 1 / RTT_INTERVAL_DEFAULT


class FleetExporters:
    """The 1,000 exporters' series as one exposition (labels of each exporter in it: honor_labels):
    UDP echo and RTT probe counters of every path and its peer_info, from the time it started; after
    `fault()`, the faulty paths' loss and the down host's absence (its peers' RTT probes to it time out)."""

    def __init__(self, paths: list[Path_]) -> None:
        self.paths, self.started = paths, time.time()
        self.fault_at: float | None = None
        self.loss: dict[Path_, float] = {}
        self.down = ""

    def fault(self, loss: dict[Path_, float], down: str) -> None:
        self.loss, self.down, self.fault_at = loss, down, time.time()

    def exposition(self) -> bytes:
        now = time.time()
        since_fault = 0.0 if self.fault_at is None else now - self.fault_at
        sent = ECHOES_PER_SECOND * (now - self.started)
        lines = []
        for path in self.paths:
            if path.src.name == self.down and since_fault:
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in path.info().items() if v)
            idle = f'{labels},state="idle"'
            into_down = path.dst.name == self.down and since_fault
            lost = ECHOES_PER_SECOND * since_fault * (1.0 if into_down else self.loss.get(path, 0.0))
            answered = now - self.started - (since_fault if into_down else 0.0)
            lines += [
                f"pathprobe_peer_info{{{labels}}} 1",
                f"pathprobe_udp_packets_sent_total{{{idle}}} {sent:.0f}",
                f"pathprobe_udp_packets_lost_total{{{idle}}} {lost:.0f}",
                f'pathprobe_probe_runs_total{{{labels},probe="rtt",result="ok"}} '
                f"{RTT_PROBES_PER_SECOND * answered:.0f}",
            ]
            if into_down:
                lines.append(
                    f'pathprobe_probe_runs_total{{{labels},probe="rtt",result="timeout"}} '
                    f"{RTT_PROBES_PER_SECOND * since_fault:.0f}"
                )
        return ("\n".join(lines) + "\n").encode()


# Three faults at once, in different parts of the fleet: a host down, a region pair and a zone at
# 3% loss (bench/rule_cost.py applies the same).
FLEET_DOWN, FLEET_LOSSY_ZONE, FLEET_LOSSY_PAIR = "h0031", "region-07b", ("region-02", "region-05")


def fleet_loss(paths: list[Path_]) -> dict[Path_, float]:
    """The lossy paths of the three faults: the region pair's, and the zone's that avoid the down host."""
    loss = {p: 0.03 for p in between(paths, src_region=FLEET_LOSSY_PAIR[0], dst_region=FLEET_LOSSY_PAIR[1])}
    return loss | {p: 0.03 for p in between(paths, zone=FLEET_LOSSY_ZONE) if FLEET_DOWN not in (p.src.name, p.dst.name)}


def serve_exposition(exporters: FleetExporters, port: int) -> http.server.ThreadingHTTPServer:
    """The exporters' exposition on 127.0.0.1:`port`, served by a thread (bench/rule_cost.py serves it too)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = exporters.exposition()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
