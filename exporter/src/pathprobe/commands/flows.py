"""`pathprobe flows`: this host's TCP flows to its peers (or to one address) now, each flow's rate,
RTT, retransmits and what limits it, read twice from sock_diag (tcpflows.py) a moment apart;
where a buffer limits it, the tcp_rmem / tcp_wmem max the path's bandwidth-delay product needs."""

from __future__ import annotations

import argparse
import ipaddress
import json
import socket
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from .. import config, flowreader, limits, sockdiag, tcpflows
from ..config import Config
from ..tcpflows import Classifier, Destination, Flow
from ..units import format_bits, format_seconds
from .common import EXIT_PROBE_FAILED, add_duration, bitrate_arg


def add_parser(sub: Any) -> None:
    f = sub.add_parser(
        "flows",
        help="this host's TCP flows to its peers now: rate, RTT, retransmits, what limits each",
        description="Reads the host's established TCP sockets twice (sock_diag, --seconds apart) and prints each "
        "flow to a peer of --config (pathprobe's own probes left out) or to --to ADDRESS: its rate, smoothed RTT, "
        "retransmits and what held its sending back between the two reads (receive_window, send_buffer, network, "
        "application, none). Where a buffer did and the flow ran below the per-flow rate, the tcp_rmem (the "
        "receiver's) or tcp_wmem (this host's) max at which one flow carries the path's per-flow rate at its "
        "RTT. Needs no privilege for this user's own "
        "sockets; as root it reads every process's.",
    )
    f.add_argument("--config", metavar="FILE", help="the exporter's config file: its peers and networks")
    f.add_argument("--to", metavar="ADDRESS", type=ipaddress.ip_address, help="only the flows to this address")
    add_duration(f, "--seconds", default=1.0, help_text="time between the two reads (default 1s)")
    f.add_argument(
        "--rate",
        type=bitrate_arg("--rate"),
        help="the per-flow rate the buffers should carry (default: the peer's limits.per_flow_bits_per_second, "
        "else the per-flow limit of data/limits.yaml)",
    )
    f.add_argument("--json", action="store_true", help="one JSON object: the flows as a list")
    f.set_defaults(func=cmd_flows)


@dataclass(frozen=True)
class Row:
    """One flow between the two reads."""

    peer: str
    local: str
    remote: str
    bits_per_second: float  # acknowledged bytes over the time between the reads
    delivery_bits_per_second: float  # the kernel's last delivery-rate sample
    rtt_seconds: float
    retransmitted: int  # segments, between the reads
    retransmitted_total: int  # over the socket's life
    limited: dict[str, float]  # share of the time between the reads, by limit
    limit: str  # the largest of them, or none
    setting: str  # what would lift a buffer limit, or ""
    needed_bytes: int | None


def _per_flow_rate(cfg: Config | None, peer: str, rate: float | None) -> float:
    if rate is not None:
        return rate
    found = next((p for p in cfg.peers if p.name == peer), None) if cfg else None
    if found is not None and found.limits.per_flow_bits_per_second:
        return found.limits.per_flow_bits_per_second
    placement = found.limits.placement if found is not None else None
    return limits.table().per_flow[placement or "default"].gbps * limits.GBPS


def row(flow: Flow, before: Flow | None, seconds: float, peer: str, rate: float) -> Row:
    """What `flow` did since `before` (None: it opened between the reads) and what limits it."""
    change = tcpflows.delta(flow, before)
    shares = (
        {k: v / seconds for k, v in tcpflows.limited(change, seconds, flow.window_bound).items()} if flow.chrono else {}
    )
    limit = tcpflows.bound(shares)
    setting, needed = "", None
    rtt = flow.rtt_us / 1e6
    bits_per_second = change.acked * 8 / seconds
    # A flow at the target rate already is bound by a buffer that suffices: nothing to lift.
    if limit in ("receive_window", "send_buffer") and rtt > 0 and bits_per_second < rate:
        needed = tcpflows.buffer_needed(rate, rtt, limits.window_share())
        which = "tcp_rmem" if limit == "receive_window" else "tcp_wmem"
        where = "on the receiver" if limit == "receive_window" else "on this host"
        now = limits.host_buffer_max(which.removeprefix("tcp_")) if limit == "send_buffer" else None
        held = f" (now {now})" if now else ""
        setting = f"net.ipv4.{which} max >= {needed} {where}{held}, for {format_bits(rate)} at {format_seconds(rtt)}"
    return Row(
        peer=peer,
        local=f"{flow.local}:{flow.local_port}",
        remote=f"{flow.remote}:{flow.remote_port}",
        bits_per_second=bits_per_second,
        delivery_bits_per_second=flow.delivery_rate * 8,
        rtt_seconds=rtt,
        retransmitted=change.retransmitted,
        retransmitted_total=flow.retransmitted,
        limited=shares,
        limit=limit,
        setting=setting,
        needed_bytes=needed,
    )


def _read(classes: Classifier) -> dict[int, tuple[Flow, Destination]]:
    found = {}
    for family in (socket.AF_INET, socket.AF_INET6):
        for message in sockdiag.dump(sockdiag.established_request(family)):
            _, address, sport, dport = tcpflows.remote_key(message)
            destination = classes.of(address, sport, dport)
            flow = tcpflows.parse(message) if destination is not None else None
            if flow is not None and destination is not None:
                found[flow.cookie] = (flow, destination)
    return found


def _classifier(cfg: Config | None, to: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> Classifier:
    if cfg is None:
        assert to is not None
        return Classifier({str(to): Destination(str(to), "", "")})
    classes = flowreader.classifier(cfg)
    if to is not None:  # only the flows to `to`, named as the config names it
        named = next((p for p in cfg.peers if p.address == to), None)
        d = Destination(named.name, named.region, named.path_class.value) if named else Destination(str(to), "", "")
        classes = Classifier({str(to): d}, (), classes.local_ports, classes.remote_ports)
    return classes


def cmd_flows(args: argparse.Namespace) -> int:
    if args.config is None and args.to is None:
        print("pathprobe flows: give --config FILE (its peers) or --to ADDRESS", file=sys.stderr)
        return 2
    cfg = config.load(args.config) if args.config else None
    classes = _classifier(cfg, args.to)
    try:
        first = _read(classes)
        started = time.monotonic()
        time.sleep(args.seconds)
        second = _read(classes)
        seconds = time.monotonic() - started
    except OSError as exc:
        print(f"pathprobe flows: sock_diag refused to list the TCP sockets: {exc}", file=sys.stderr)
        return EXIT_PROBE_FAILED
    rows = []
    for cookie, (flow, d) in second.items():
        before = first.get(cookie)
        rows.append(row(flow, before[0] if before else None, seconds, d.peer, _per_flow_rate(cfg, d.peer, args.rate)))
    rows.sort(key=lambda r: (r.peer, -r.bits_per_second))
    if args.json:
        print(json.dumps({"seconds": seconds, "flows": [asdict(r) for r in rows]}, indent=2))
        return 0
    print(_table(rows))
    return 0


def _table(rows: list[Row]) -> str:
    if not rows:
        return "no TCP flows to the peers"
    head = ("peer", "local", "remote", "rate", "delivery", "rtt", "retrans", "limit", "to lift it")
    lines = [
        (
            r.peer,
            r.local,
            r.remote,
            format_bits(r.bits_per_second),
            format_bits(r.delivery_bits_per_second),
            format_seconds(r.rtt_seconds),
            f"{r.retransmitted} ({r.retransmitted_total})",
            r.limit + (f" {r.limited[r.limit]:.0%}" if r.limit in r.limited else ""),
            r.setting,
        )
        for r in rows
    ]
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(x, widths, strict=True)).rstrip() for x in [head, *lines]
    )
