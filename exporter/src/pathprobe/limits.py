"""What a path should reach: the smallest limit that applies, and which one binds.

Limits come from data/limits.yaml (each row sourced and dated) and the path's
config (overrides, placement); the receive-window bound comes from the
receiver's tcp_rmem max and the RTT measured on the path.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from . import yamlfile
from .config import PathClass, Peer

GBPS = 1e9
# Linux advertises about half of the receive buffer as window (tcp_adv_win_scale=1);
# FIELD_NOTES section 2: 6291456 B x 0.5 x 8 / 8 ms = 3.1 Gbps, as measured.
USABLE_WINDOW_SHARE = 0.5


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gbps: float
    source: str = ""
    as_of: dt.date | None = None
    checked: bool = True


class _Instance(_Row):
    burst: bool
    vcpus: int


class _RegionCap(BaseModel):
    model_config = ConfigDict(extra="forbid")
    share: float
    min_vcpus: int
    small_instance_gbps: float
    source: str
    as_of: dt.date


class _TgwHistory(_Row):
    basis: str


class _Tgw(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gbps: float
    history: list[_TgwHistory]


class LimitsTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    per_flow: dict[str, _Row]
    region_cap: _RegionCap
    transit_gateway: _Tgw
    instance_types: dict[str, _Instance]


@cache
def table(path: Path | None = None) -> LimitsTable:
    if path is not None:
        return yamlfile.load_model(path, LimitsTable)
    with resources.as_file(resources.files("pathprobe") / "data" / "limits.yaml") as default:
        return yamlfile.load_model(default, LimitsTable)


@dataclass(frozen=True)
class Expected:
    bits_per_second: float
    limit: str  # per_flow, instance, region_cap, transit_gateway, receive_window, target_rate, override
    candidates: dict[str, float]


def receive_window_bound(rmem_max_bytes: int, rtt_seconds: float, streams: int) -> float:
    """Bits/s that `streams` TCP flows can carry with this receive buffer at this RTT."""
    return rmem_max_bytes * USABLE_WINDOW_SHARE * 8 / rtt_seconds * streams


def expected(
    peer: Peer,
    host_instance: str,
    protocol: str,
    streams: int,
    receiver_rmem_max: int | None,
    rtt_seconds: float | None,
    udp_target: float | None = None,
    scale: float = 1.0,
    limits: LimitsTable | None = None,
) -> Expected:
    t = limits or table()
    o = peer.limits
    if o.expected_bits_per_second:
        return Expected(o.expected_bits_per_second, "override", {"override": o.expected_bits_per_second})
    c: dict[str, float] = {}
    per_flow = o.per_flow_bits_per_second or t.per_flow[o.placement or "default"].gbps * GBPS / scale
    c["per_flow"] = per_flow * streams
    ends = [t.instance_types[i] for i in (host_instance, peer.instance_type) if i in t.instance_types]
    if o.instance_bits_per_second:
        c["instance"] = o.instance_bits_per_second
    elif ends:
        c["instance"] = min(e.gbps for e in ends) * GBPS / scale
    if peer.path_class == PathClass.inter_region:
        cap = t.region_cap
        if o.region_cap_bits_per_second:
            c["region_cap"] = o.region_cap_bits_per_second
        elif ends:
            c["region_cap"] = (
                min(e.gbps * cap.share if e.vcpus >= cap.min_vcpus else cap.small_instance_gbps for e in ends)
                * GBPS
                / scale
            )
    if peer.path_class == PathClass.transit_gateway:
        c["transit_gateway"] = o.transit_gateway_bits_per_second or t.transit_gateway.gbps * GBPS / scale
    if protocol == "tcp" and receiver_rmem_max and rtt_seconds:
        c["receive_window"] = receive_window_bound(receiver_rmem_max, rtt_seconds, streams)
    if protocol == "udp" and udp_target:
        c["target_rate"] = udp_target
    limit = min(c, key=lambda k: c[k])
    return Expected(c[limit], limit, c)


def host_rmem_max() -> int | None:
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return None
