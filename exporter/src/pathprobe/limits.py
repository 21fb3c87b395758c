"""What a path should reach: the smallest limit that applies, and which one binds.

Limits come from data/limits.yaml (each row sourced and dated) and the path's
config (overrides, placement); the receive-window bound comes from the
receiver's tcp_rmem max and the RTT measured on the path.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from . import yamlfile
from .config import PathClass, Peer

GBPS = 1e9
# The share of a socket buffer that TCP can keep in flight. Before Linux 6.6 the
# receiver advertised buffer / 2^tcp_adv_win_scale less (1: half): on kernel 6.1,
# 6291456 B x 0.5 x 8 / 8 ms = 3.1 Gbps, as measured (docs/SOURCES.md). Since
# 6.6 the kernel uses each connection's measured payload/truesize ratio instead;
# on this project's lab (kernel 6.18, veth, MTU 1500) in-flight data measured 0.78
# of the smaller of the receiver's tcp_rmem max and the sender's tcp_wmem max.
SHARE_SINCE_6_6 = 0.78


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
    # per_flow, instance, region_cap, transit_gateway, receive_window, send_buffer, target_rate, override
    limit: str
    candidates: dict[str, float]


def window_share(release: str | None = None, adv_win_scale: int | None = None) -> float:
    """The usable share of a TCP buffer on this kernel (see SHARE_SINCE_6_6)."""
    release = release if release is not None else os.uname().release
    try:
        major, minor = (int(x) for x in release.split(".")[:2])
    except ValueError:
        return SHARE_SINCE_6_6
    if (major, minor) >= (6, 6):
        return SHARE_SINCE_6_6
    if adv_win_scale is None:
        try:
            adv_win_scale = int(Path("/proc/sys/net/ipv4/tcp_adv_win_scale").read_text())
        except (OSError, ValueError):
            adv_win_scale = 1
    return 1 - 2.0**-adv_win_scale if adv_win_scale > 0 else 2.0**adv_win_scale


def buffer_bound(buffer_bytes: int, rtt_seconds: float, streams: int, share: float) -> float:
    """Bits/s that `streams` TCP flows can carry with this buffer (tcp_rmem or tcp_wmem max) at this RTT."""
    return buffer_bytes * share * 8 / rtt_seconds * streams


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
    sender_wmem_max: int | None = None,
    share: float | None = None,
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
    if protocol == "tcp" and rtt_seconds:
        share = share or window_share()
        if receiver_rmem_max:
            c["receive_window"] = buffer_bound(receiver_rmem_max, rtt_seconds, streams, share)
        if sender_wmem_max:
            c["send_buffer"] = buffer_bound(sender_wmem_max, rtt_seconds, streams, share)
    if protocol == "udp" and udp_target:
        c["target_rate"] = udp_target
    limit = min(c, key=lambda k: c[k])
    return Expected(c[limit], limit, c)


def host_buffer_max(which: str) -> int | None:
    """This host's tcp_rmem or tcp_wmem maximum (which: "rmem" or "wmem")."""
    try:
        return int(Path(f"/proc/sys/net/ipv4/tcp_{which}").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return None
