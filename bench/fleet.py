"""Fleet sizing without traffic (issue 16): for 50, 200 and 1,000 hosts across 5, 12 and 30
regions, per peer-selection policy (exporter/src/pathprobe/mesh.py): peers per host, RTT
probes/s per host, series per host, per regional Prometheus and in a global view of
region-pair aggregates, throughput rotation time, and probe bytes per host and day (before
the daily byte budget, 50 GB by default, stops a host).

Run: .venv/bin/python bench/fleet.py [--slot-seconds 120] [--test-gb 0.6] [--tests-per-turn 2]   (a few seconds)

Assumptions, stated: 93 series per peer and 100 per host (bench/exporter_bench.py measured
46,663 exposition lines at 500 peers, default probes); RTT and UDP echo at 10/s each per peer
(the defaults); a global Prometheus that receives only the region-pair recording rules
(alerts/pathprobe.rules.yml, group pathprobe.region_pairs), 11 series per ordered region pair
with the default two tests per path; hosts spread evenly over regions and three zones per region.
Targets at 1,000 hosts / 30 regions: <= 1 M series per regional Prometheus, <= 100 k in the
global view, every region pair's throughput measured at least every 6 h, <= 500 RTT probes/s
per host.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "exporter" / "src"))
from pathprobe.mesh import Member, Policy, links
from pathprobe.schedule import Schedule

# Global view per ordered region pair (intra-region pairs too), default tests (tcp x1 and x8 send):
# paths 1 + ratio 2 + rate 2 + last test 1 + RTT p50 and p99 of tcp and udp 4 + loss 1 (rules.py).
SERIES_PER_PEER, SERIES_PER_HOST, GLOBAL_PER_REGION_PAIR = 93, 100, 11
RTT_PER_SECOND = 10
FLEETS = ((50, 5), (200, 12), (1000, 30))
POLICIES = {"full_mesh": Policy(), "hierarchical k=2": Policy(kind="hierarchical", scope="region", representatives=2),
            "hierarchical zone k=1": Policy(kind="hierarchical", scope="zone", representatives=1)}  # fmt: skip


def fleet(hosts: int, regions: int) -> list[Member]:
    return [Member(f"h{i:04d}", f"region-{i % regions:02d}", f"region-{i % regions:02d}{'abc'[(i // regions) % 3]}")
            for i in range(hosts)]  # fmt: skip


def row(hosts: int, regions: int, name: str, policy: Policy, args: argparse.Namespace) -> list[str]:
    members = fleet(hosts, regions)
    pairs = links(members, policy)
    degree: dict[str, int] = defaultdict(int)
    for a, b in pairs:
        degree[a] += 1
        degree[b] += 1
    region = {m.name: m.region for m in members}
    per_host = {m.name: SERIES_PER_HOST + SERIES_PER_PEER * degree[m.name] for m in members}
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
    rtt = RTT_PER_SECOND * max(degree.values())
    ok = max(per_region.values()) <= 1e6 and global_series <= 1e5 and rotation_h <= 6 and rtt <= 500
    return [str(hosts), str(regions), name, f"{sum(degree.values()) / hosts:.1f} / {max(degree.values())}",
            f"{rtt}", f"{max(per_host.values()):,}", f"{max(per_region.values()):,}", f"{global_series:,}",
            f"{rotation_h:.1f} h ({slots} slots)", f"{per_host_day / 1e9:,.0f} GB",
            f"{len(inter)} inter-region links; targets {'met' if ok else 'missed'}"]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slot-seconds", type=float, default=120)
    parser.add_argument("--test-gb", type=float, default=0.6, help="GB one test moves (0.6: 5 s at 1 Gbit/s)")
    parser.add_argument("--tests-per-turn", type=int, default=2)
    args = parser.parse_args()
    head = ["hosts", "regions", "policy", "peers/host mean/max", "RTT probes/s (max host)", "series/host (max)",
            "series/regional Prometheus (max)", "series, global view", "throughput rotation", "probe bytes/day/host",
            "notes"]  # fmt: skip
    rows = [row(h, r, name, p, args) for h, r in FLEETS for name, p in POLICIES.items()]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
