"""AWS's bandwidth structure on each lab host that names an instance type, at the lab's scale.

On the host's own link (egress, as AWS applies them at the instance):
- the instance's bandwidth: a token bucket filling at the BASELINE, emptied at up to the
  PEAK (TBF `rate`/`burst`/`peakrate`): a host bursts while its bucket holds credits and
  falls to the baseline once they are spent, like network I/O credits;
- the inter-region aggregate (region_cap): one HTB class for every destination in
  another region, one for the rest;
- the Transit Gateway attachment: one HTB class for the destinations of its
  transit_gateway paths (the attachment's bandwidth; such a path has no region_cap);
- the per-flow limit: under each, leaf classes capped at it, one per flow (5-tuple
  hashed by nftables, see apply()).
The figures come from the same tables the exporter's model uses (the instance-type table
and limits.yaml), divided by the topology's scale, and raised by the TCP/IP and Ethernet
header share so that what iperf3 measures (payload) is the figure, as on AWS where a
single flow measures 4.96 of its 5 Gbps. Hosts without an instance type get none of
this: their paths are shaped only by the topology's per-path rates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pathprobe import instance_types, limits
from pathprobe.config import PathClass

from .state import in_ns, ns, sh
from .topology import LabHost, Topology, resolve

# An MTU-sized TCP segment (with timestamps) is 1448 payload bytes in a 1514-byte frame.
WIRE_PER_PAYLOAD = 1514 / 1448
# TBF's second bucket (for the peak rate) must hold the largest packet: a 64 KiB GSO frame, whose
# length to a qdisc counts every segment's headers (45 segments of 1448: 65,536 + 44 x 66 bytes).
# A frame longer than the bucket is cut into MTU-sized packets (sch_tbf.c, tbf_segment): every
# path then carried ~40 times as many packets, and the delay line, which runs the kernel's
# forwarding of what it releases, queued them for tens of ms whenever two tests ran at once.
PEAK_BUCKET_BYTES = 2 * 65536
# Leaf classes per aggregate: flows hash into them (a collision shares one per-flow cap; with
# 4 flows that happens about 2% of the time, and only matters when the per-flow cap binds).
FLOW_CLASSES = 256
# A software shaper sends only while this VM runs it. When the VM's host takes its vCPUs away
# (steal: 20-30% on this 2-core CI machine on 2026-11-27, in stretches of 5-38 ms), the shaper
# catches up afterwards on the credit its bucket holds, and the rest of the stall is lost to the
# path. With 256 kB buckets (4 ms at 500 Mbit/s), 21 lab tests at 13-30% steal read a median
# 1.1% and up to 3.9% below their cap (a CI run: 6.4%); with 40 ms of the class's rate, 10 at
# 12-22% steal read within 0.1%. A flow may then start up to 40 ms ahead of its cap: within the
# start that every test leaves out. Aggregates only (and the router's path rates): a per-flow
# leaf keeps 256 kB, because a window-bound flow sends its window in bursts and a leaf passes as
# much of each burst as its bucket holds unpaced; with 40 ms leaves, one flow on the 74 ms path
# read 8% above its send-buffer bound, which the model takes from AWS measurements (+2-3% with 256 kB).
CATCH_UP_SECONDS = 0.04
LEAF_BUCKET_BYTES = 256 * 1024
NFT_TABLE = "pathprobe_lab_caps"


@dataclass(frozen=True)
class HostCaps:
    """Payload bits/s at the lab's scale; None where the instance type is unknown."""

    per_flow: float
    baseline: float | None
    peak: float | None
    region_cap: float | None
    burst_bytes: int
    transit_gateway: float | None = None  # the VPC attachment, where the host has transit_gateway paths

    def describe(self) -> str:
        def rate(v: float | None) -> str:
            return f"{v / 1e6:g} Mbit/s" if v else "none (unknown instance type)"

        return (
            f"per flow {rate(self.per_flow)}, instance {rate(self.baseline)} baseline / {rate(self.peak)} peak "
            f"({self.burst_bytes / 2**20:g} MiB of credits), other regions {rate(self.region_cap)}"
            + (f", transit gateway {rate(self.transit_gateway)}" if self.transit_gateway else "")
        )


def host_caps(topo: Topology, host: LabHost) -> HostCaps | None:
    if not host.instance_type:
        return None
    table = limits.table()
    per_flow = host.per_flow_cap or table.per_flow["default"].gbps * limits.GBPS / topo.scale
    tgw = None
    if transit_gateway_destinations(topo, host):
        tgw = host.transit_gateway_cap or table.transit_gateway.gbps * limits.GBPS / topo.scale
    e = instance_types.load().get(host.instance_type)
    if e is None:
        return HostCaps(per_flow, None, None, None, host.burst_bytes, tgw)
    return HostCaps(
        per_flow,
        e.baseline_bits_per_second / topo.scale,
        e.peak_bits_per_second / topo.scale,
        table.region_cap.gbps(e.vcpus, e.card.baseline_gbps) * limits.GBPS / topo.scale,
        host.burst_bytes,
        tgw,
    )


def transit_gateway_destinations(topo: Topology, host: LabHost) -> list[str]:
    """The subnets of the hosts this one reaches through a Transit Gateway."""
    paths = resolve(topo)
    return [
        f"198.18.{j}.0/24"
        for j, h in enumerate(topo.hosts, start=1)
        if h is not host and paths[(host.name, h.name)].path_class == PathClass.transit_gateway
    ]


def apply(topo: Topology, only: str | None = None) -> None:
    """Each AWS host's eth0 (or `only` that host's, so that changing one host's caps leaves every
    other host's queues and flows alone): TBF (instance) > HTB: in-region and other-region aggregates, each with
    FLOW_CLASSES leaf classes capped at the per-flow rate; nftables gives each connection a leaf
    of its own by setting the packets' priority (HTB takes a class named by skb->priority; this
    kernel has no fq qdisc nor flow/fw classifiers, so this is how a per-flow cap is built here).
    Leaves are dealt round-robin to connections (a conntrack mark) rather than by hashing the
    5-tuple: with a hash, two of a four-stream test's flows share a leaf about once in 40 tests
    and the test reads three quarters of its cap, a limit AWS does not have."""
    for host in topo.hosts:
        caps = host_caps(topo, host)
        if caps is None or only not in (None, host.name):
            continue
        name = ns(host.name)
        tgw = transit_gateway_destinations(topo, host)
        others = [
            f"198.18.{j}.0/24"
            for j, h in enumerate(topo.hosts, start=1)
            if h.region != host.region and f"198.18.{j}.0/24" not in tgw
        ]
        region_cap = caps.region_cap if others else None
        batch = []
        parent = "root"
        if caps.baseline and caps.peak:
            batch.append(
                f"qdisc add dev eth0 root handle 1: tbf rate {_bits(caps.baseline)} "
                f"burst {caps.burst_bytes + PEAK_BUCKET_BYTES} peakrate {_bits(caps.peak)} "
                f"mtu {PEAK_BUCKET_BYTES} latency 200ms"
            )
            parent = "parent 1:1"
        link = caps.peak or caps.per_flow * 64
        batch.append(f"qdisc add dev eth0 {parent} handle 2: htb default 3")
        aggregates = [(1, link)] + ([(2, region_cap)] if region_cap else [])
        aggregates += [(4, caps.transit_gateway)] if caps.transit_gateway else []
        for minor, rate in aggregates:
            batch.append(f"class add dev eth0 parent 2: classid 2:{minor} htb rate {_bits(rate)} {_ceil(rate)}")
            for k in range(FLOW_CLASSES):
                # Leaves borrow everything above a token rate, so the aggregate above them binds.
                batch.append(
                    f"class add dev eth0 parent 2:{minor} classid 2:{minor * 0x1000 + k:x} htb "
                    f"rate 1mbit ceil {_bits(caps.per_flow)} {_buckets(LEAF_BUCKET_BYTES)}"
                )
        batch.append(f"class add dev eth0 parent 2:1 classid 2:3 htb rate 1mbit {_ceil(link)}")
        sh(["tc", "-n", name, "qdisc", "del", "dev", "eth0", "root"], check=False)
        sh(["tc", "-n", name, "-batch", "-"], input_text="\n".join(batch) + "\n")
        # A connection's first packet out takes the next leaf of its aggregate (the mark is the
        # leaf's class id); every packet of it then goes to that leaf.
        new_flow = f"meta l4proto {{ tcp, udp }} ct mark 0 ct mark set numgen inc mod {FLOW_CLASSES} offset"
        rules = [f"ip daddr {{ {', '.join(tgw)} }} {new_flow} {0x24000:#x}"] if tgw else []
        if region_cap:
            rules.append(f"ip daddr {{ {', '.join(others)} }} {new_flow} {0x22000:#x}")
        rules.append(f"ip daddr 198.18.0.0/15 {new_flow} {0x21000:#x}")
        rules.append("meta l4proto { tcp, udp } ct mark != 0 meta priority set ct mark map @leaf")
        leaves = ", ".join(
            f"{minor * 0x1000 + 0x20000 + k:#x} : {minor * 0x1000 + 0x20000 + k:#x}"
            for minor, _ in aggregates
            for k in range(FLOW_CLASSES)
        )
        script = (
            f"table inet {NFT_TABLE} {{}}\ndelete table inet {NFT_TABLE}\n"
            f"table inet {NFT_TABLE} {{\n  map leaf {{ type mark : classid; elements = {{ {leaves} }} }}\n"
            "  chain post {\n    type filter hook postrouting priority 0; policy accept;\n"
            + "".join(f"    {r}\n" for r in rules)
            + "  }\n}\n"
        )
        sh(in_ns(name, ["nft", "-f", "-"]), input_text=script)


def status(topo: Topology, host: LabHost) -> dict[str, object] | None:
    """The caps of a host and what its qdiscs hold (`lab status`)."""
    caps = host_caps(topo, host)
    if caps is None:
        return None
    shown = sh(in_ns(ns(host.name), ["tc", "qdisc", "show", "dev", "eth0"]), check=False).stdout.split("\n")
    return {**asdict(caps), "qdiscs": [line.strip() for line in shown if line.strip()]}


def htb_buckets(ceil_bits_per_second: float) -> str:
    """An HTB class's burst and cburst: CATCH_UP_SECONDS at its ceiling, at least a leaf's."""
    return _buckets(max(LEAF_BUCKET_BYTES, round(ceil_bits_per_second / 8 * CATCH_UP_SECONDS)))


def _buckets(size_bytes: int) -> str:
    return f"burst {size_bytes} cburst {size_bytes} quantum 200000"


def _ceil(payload_bits_per_second: float) -> str:
    return f"ceil {_bits(payload_bits_per_second)} {htb_buckets(payload_bits_per_second * WIRE_PER_PAYLOAD)}"


def _bits(payload_bits_per_second: float) -> str:
    return f"{payload_bits_per_second * WIRE_PER_PAYLOAD:.0f}bit"
