"""Fleet sizing without traffic: for 50, 200 and 1,000 hosts across 5, 12 and 30
regions, per peer-selection policy (exporter/src/pathprobe/mesh.py): peers per host, RTT
probes/s per host, series per host, per regional Prometheus and in a global view of
region-pair aggregates, throughput rotation time, and probe bytes per host and day (before
the daily byte budget, 50 GB by default, stops a host).

Run: .venv/bin/python bench/fleet.py [--slot-seconds 120] [--test-gb 0.6] [--tests-per-turn 2]   (a few seconds)

Series per peer and per host are measured on the exporter's own rooms (`series_model`,
default probes: printed first); RTT and UDP echo at their default rates per peer; a global
Prometheus that receives only the region-pair recording rules (alerts/pathprobe.rules.yml, group
pathprobe.region_pairs), 11 series per ordered region pair with the default two tests per path;
hosts spread evenly over regions and three zones per region.
Targets at 1,000 hosts / 30 regions: <= 1 M series per regional Prometheus, <= 100 k in the
global view, every region pair's throughput measured at least every 6 h, <= 500 RTT probes/s
per host.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "exporter" / "src"))
from prometheus_client.parser import text_string_to_metric_families

from pathprobe.config import Config
from pathprobe.exporter import Exporter
from pathprobe.keys import TestKey
from pathprobe.mesh import Member, Policy, links
from pathprobe.metrics import registry
from pathprobe.metrics.rtt import STATES
from pathprobe.plan import plan
from pathprobe.probe_settings import RttSettings
from pathprobe.probes import ThroughputResult
from pathprobe.probes.echo import OneWay
from pathprobe.schedule import Schedule
from pathprobe.web import Snapshot, Stats

# Global view per ordered region pair (intra-region pairs too), default tests (tcp x1 and x8 send):
# paths 1 + ratio 2 + rate 2 + last test 1 + RTT p50 and p99 of tcp and udp 4 + loss 1 (rules.py).
GLOBAL_PER_REGION_PAIR = 11
RTT_PER_SECOND = 1 / RttSettings().interval_seconds
FLEETS = ((50, 5), (200, 12), (1000, 30))
HIER2 = Policy(kind="hierarchical", scope="region", representatives=2)
# name: (policy, peers outside the region exported compact: mesh.compact_outside)
POLICIES = {
    "full_mesh": (Policy(), False),
    "full_mesh, compact outside region": (Policy(), True),
    "hierarchical k=2": (HIER2, False),
    "hierarchical k=2, compact outside region": (HIER2, True),
    "hierarchical zone k=1": (Policy(kind="hierarchical", scope="zone", representatives=1), False),
}


@dataclass(frozen=True)
class SeriesModel:
    """Series of one exporter: `base` of its own, `full` per peer, `compact` per compact peer."""

    base: int
    full: int
    compact: int

    def per_host(self, full_peers: int, compact_peers: int = 0) -> int:
        return self.base + self.full * full_peers + self.compact * compact_peers


def series_model(settings: dict | None = None) -> SeriesModel:
    """Measured on the real rooms, not assumed: an exporter with one peer in its region and
    one outside it (compact), with these config sections (`probes`, `budget`, ...; default:
    the defaults), its rooms filled as healthy probing fills them (every test run, RTT and echo
    samples in both states, every MTU size carried), as /metrics serves it."""
    sides = [("near", "a", "intra_region"), ("far", "b", "inter_region")]
    peers = [
        {"name": name, "address": f"127.0.0.{i + 2}", "region": region, "path_class": cls}
        for i, (name, region, cls) in enumerate(sides)
    ]
    cfg = Config.model_validate(
        {
            "budget": {"state_file": "/nonexistent/budget.json"},
            **(settings or {}),
            "host": {"name": "me", "address": "127.0.0.1", "region": "a"},
            "peers": peers,
            "mesh": {"compact_outside": "region"},
            # A bound stated, as chronyd or ClockBound state one on EC2: one-way delays are exported.
            "clock": {"source": "stated", "error_bound_seconds": 1e-5},
            "tcp_rmem_max_bytes": 6291456,
            "tcp_wmem_max_bytes": 4194304,
            "tcp_window_share": 0.5,
        }
    )
    ex = Exporter(cfg)
    rooms = ex.rooms
    states = STATES if cfg.half_slot_need(with_margin=False) else ("idle",)  # "loaded": only beside tests
    for peer in cfg.peers:
        for state in states:
            ex.load.of = lambda _peer, _now, state=state: state  # type: ignore[method-assign]
            for protocol in ("tcp", "udp") if cfg.probes.loss.enabled else ("tcp",):
                rooms.rtt.observe(peer.name, protocol, 0.01)
        t = cfg.throughput_for(peer)
        for key in t.tests() if t.enabled else []:
            result = ThroughputResult(
                key[0], int(key[1]), key[2], 5, 1, None, None, 6e8, 6e8, 3 * 10**9, retransmits=0, timestamp=1.0
            )
            rooms.throughput.record(TestKey.of(peer.name, key), result)
        for probe in ("rtt", "loss"):
            rooms.outcomes.success(probe, peer.name)
            rooms.outcomes.moved(probe, peer.name, 1)
        echo = ex.recorder("loss", peer.name)
        for state in states:  # one-way delays, idle and loaded, each way, trusted (10 ms against 20 us)
            ex.load.of = lambda _peer, _now, state=state: state  # type: ignore[method-assign]
            echo.received(0.02, jitter=0.0, one_way=OneWay(0.01, 0.01, 1e-5, 0.0))
        echo.marks(0, 0, 0)
        echo.flows_failing(0, 0.0)
        echo.lost_by_direction(0, 0)
        rooms.echo.flows_failing(peer.name, "tcp", 0)
        if cfg.probes.mtu.enabled:
            mtu = ex.recorder("mtu", peer.name)
            for size in cfg.probes.mtu.sizes_for(peer.path_class.value):
                mtu.mtu(size, True, None)
    for responder in ("rr", "echo"):  # it answered its peers
        rooms.host.count_request(responder, "accepted")
    # As /metrics serves it: the snapshot and its trailer (age, render time, refused connections).
    text = Snapshot(registry(ex.rooms), stats=Stats()).get().decode()
    count = {"near": 0, "far": 0, "": 0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            count[sample.labels.get("peer", "") if sample.labels.get("peer") in count else ""] += 1
    return SeriesModel(count[""], count["near"], count["far"])


def fleet(hosts: int, regions: int) -> list[Member]:
    return [
        Member(f"h{i:04d}", f"region-{i % regions:02d}", f"region-{i % regions:02d}{'abc'[(i // regions) % 3]}")
        for i in range(hosts)
    ]


def row(hosts: int, regions: int, name: str, args: argparse.Namespace, model: SeriesModel) -> list[str]:
    policy, compact = POLICIES[name]
    members = fleet(hosts, regions)
    pairs = links(members, policy)
    region = {m.name: m.region for m in members}
    degree: dict[str, int] = defaultdict(int)
    remote: dict[str, int] = defaultdict(int)  # links to other regions
    for a, b in pairs:
        degree[a] += 1
        degree[b] += 1
        if region[a] != region[b]:
            remote[a] += 1
            remote[b] += 1
    per_host = {
        m.name: model.per_host(degree[m.name] - remote[m.name], remote[m.name])
        if compact
        else model.per_host(degree[m.name])
        for m in members
    }
    per_region: dict[str, int] = defaultdict(int)
    for m in members:
        per_region[m.region] += per_host[m.name]
    global_series = GLOBAL_PER_REGION_PAIR * regions**2
    # The exporter's own schedule: round-robin for a full mesh, an edge colouring of the links otherwise.
    names = [m.name for m in members]
    slots = len(Schedule.of(names, args.slot_seconds, None if policy.kind == "full_mesh" else pairs).rounds)
    rotation_h = slots * args.slot_seconds / 3600
    # Each link is tested once per rotation in each direction, `tests_per_turn` tests per turn;
    # per host, before its daily byte budget (50 GB by default) stops it.
    per_host_day = 2 * args.tests_per_turn * args.test_gb * 1e9 * (24 / rotation_h) * len(pairs) / hosts
    inter = [p for p in pairs if region[p[0]] != region[p[1]]]
    rtt = round(RTT_PER_SECOND * max(degree.values()))
    ok = max(per_region.values()) <= 1e6 and global_series <= 1e5 and rotation_h <= 6 and rtt <= 500
    return [
        str(hosts),
        str(regions),
        name,
        f"{sum(degree.values()) / hosts:.1f} / {max(degree.values())}",
        f"{rtt:,}",
        f"{max(per_host.values()):,}",
        f"{max(per_region.values()):,}",
        f"{global_series:,}",
        f"{rotation_h:.1f} h ({slots} slots)",
        f"{per_host_day / 1e9:,.0f} GB",
        f"{len(inter)} inter-region links; targets {'met' if ok else 'missed'}",
    ]


# The budget plan (pathprobe plan, plan.py) of each fleet's busiest host: c6gn.xlarge everywhere,
# the default tests (TCP x1 and x8, 1 + 5 s) and budget (50 GB a day), example prices.
PLAN_INSTANCE = "c6gn.xlarge"
PLAN_PRICES = {"inter_region": 0.02, "intra_region": 0.01}


def busiest_host_config(hosts: int, regions: int, policy: Policy) -> Config:
    """The config of the host with the most throughput links: every other member a peer, each
    path's class by region (intra or inter), this policy for both kinds of probes."""
    members = fleet(hosts, regions)
    degree: dict[str, int] = defaultdict(int)
    for a, b in links(members, policy):
        degree[a] += 1
        degree[b] += 1
    me = max(members, key=lambda m: (degree[m.name], m.name))
    peers = [
        {
            "name": m.name,
            "address": f"10.{i // 250}.{i % 250}.{1 + i // 62500}",
            "region": m.region,
            "zone": m.zone,
            "instance_type": PLAN_INSTANCE,
            "path_class": "intra_region" if m.region == me.region else "inter_region",
        }
        for i, m in enumerate(members)
        if m is not me
    ]
    return Config.model_validate(
        {
            "host": {
                "name": me.name,
                "address": "10.255.255.1",
                "region": me.region,
                "zone": me.zone,
                "instance_type": PLAN_INSTANCE,
            },
            "peers": peers,
            "mesh": {"rtt": policy.model_dump()},
            "budget": {"price_per_gb": PLAN_PRICES, "state_file": "/nonexistent/budget.json"},
        }
    )


def plan_rows() -> list[list[str]]:
    rows = []
    for hosts, regions in FLEETS:
        for name in ("full_mesh", "hierarchical k=2"):
            cfg = busiest_host_config(hosts, regions, POLICIES[name][0])
            cells = [str(hosts), str(regions), name, str(len(cfg.throughput_peers))]
            for steady in (False, True):
                p = plan(cfg, steady_state=steady)
                fits = p.within_budget()
                cells += [
                    f"{p.bytes_per_rotation / 1e9:,.0f} GB",
                    f"{fits.slot_seconds:,.0f} s",
                    f"{fits.rotation_seconds / 3600:,.1f} h",
                    f"{fits.tests_per_peer_per_day:.2f}",
                ]
            cells.append(f"${p.within_budget().cost_per_day:.2f}")
            rows.append(cells)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slot-seconds", type=float, default=120)
    parser.add_argument("--test-gb", type=float, default=0.6, help="GB one test moves (0.6: 5 s at 1 Gbit/s)")
    parser.add_argument("--tests-per-turn", type=int, default=2)
    args = parser.parse_args()
    head = [
        "hosts",
        "regions",
        "policy",
        "peers/host mean/max",
        "RTT probes/s (max host)",
        "series/host (max)",
        "series/regional Prometheus (max)",
        "series, global view",
        "throughput rotation",
        "probe bytes/day/host",
        "notes",
    ]
    model = series_model()
    print(
        f"series per exporter (measured on the rooms, default probes): {model.base} of its own, "
        f"{model.full} per peer, {model.compact} per compact peer (mesh.compact_outside)\n"
    )
    rows = [row(h, r, name, args, model) for h, r in FLEETS for name in POLICIES]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    head = [
        "hosts",
        "regions",
        "policy",
        "throughput peers (busiest host)",
        "fixed: GB per rotation",
        "slot",
        "rotation",
        "tests per peer per day",
        "steady-state: GB per rotation",
        "slot",
        "rotation",
        "tests per peer per day",
        "cost per day",
    ]
    print(
        f"\nwithin the 50 GB daily budget (pathprobe plan; busiest host, {PLAN_INSTANCE}, default tests, "
        f"example prices {PLAN_PRICES}):\n"
    )
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in plan_rows():
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
