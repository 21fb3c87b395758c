"""What a path should reach: the smallest limit that applies, and which one binds.

Two bounds for every test (issue: burst vs baseline):
- the FLOOR (`Expected.bits_per_second`, alias `floor_bits_per_second`, binding limit
  `limit`): uses each instance's BASELINE bandwidth. An instance that has spent its
  network I/O credits still reaches it, so an alert on it never pages a healthy host,
  and a path below it is broken;
- the PEAK (`peak_bits_per_second`, `peak_limit`): uses each instance's PEAK ("up to")
  bandwidth, what a test may reach while credits last: context, not an alert threshold.
Fixed-bandwidth instances have baseline = peak, so the two are equal there.

The rules (per-flow, the inter-region share, Transit Gateway) come from data/limits.yaml,
each row citing the AWS page and the date read; instance bandwidth and vCPUs come from
the generated table of AWS's own data (instance_types.py, data/instance_types.json); the
path's config adds overrides and placement; the buffer bounds come from the hosts'
tcp_rmem/tcp_wmem max and the RTT measured on the path. docs/SOURCES.md has the facts.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import instance_types, yamlfile
from .config import Config, PathClass, Peer

GBPS = 1e9
# The share of a socket buffer that TCP can keep in flight. Before Linux 6.6 the
# receiver advertised buffer / 2^tcp_adv_win_scale less (1: half): on kernel 6.1,
# 6291456 B x 0.5 x 8 / 8 ms = 3.1 Gbps, as measured (docs/SOURCES.md). Since
# 6.6 the kernel uses each connection's measured payload/truesize ratio instead;
# on this project's lab (kernel 6.18, veth, MTU 1500) in-flight data measured 0.78
# of the smaller of the receiver's tcp_rmem max and the sender's tcp_wmem max.
SHARE_SINCE_6_6 = 0.78
# Before 6.6: the advertised share is 1 - 2^-tcp_adv_win_scale, and the scale's default is 1.
ADV_WIN_SCALE_DEFAULT = 1
# The sender's side is not governed by tcp_adv_win_scale on any kernel: its in-flight data
# is limited by tcp_wmem max x payload/truesize, the ratio 6.6+ also advertises. The lab's
# 0.78 is the only measurement of it the project has (MTU 1500; MTU 9001 is likely higher).
SEND_SHARE = SHARE_SINCE_6_6


@dataclass(frozen=True)
class LimitKind:
    """One limit a test can meet (the `limit` label's values): its wording for a reader; whether
    it is only a floor (AWS documents it as one to plan on, but paths were measured above it: a
    48-vCPU instance 71 Gbps inter-region against a documented 37.5, docs/SOURCES.md; left out of
    the ceiling, Expected.ceiling_*, kept in the floor); whether it is one of the test's own ends
    (ends.py: the test measured a host, not the path)."""

    wording: str
    floor_only: bool = False
    own_end: bool = False


LIMIT_KINDS = {
    "per_flow": LimitKind("the per-flow limit"),
    "instance": LimitKind("the instance bandwidth"),
    "region_cap": LimitKind("the inter-region cap", floor_only=True),
    "transit_gateway": LimitKind("the Transit Gateway attachment limit"),
    "receive_window": LimitKind("the receive window"),
    "send_buffer": LimitKind("the send buffer"),
    "target_rate": LimitKind("the UDP target rate"),
    "override": LimitKind("the configured expected rate"),
    "receiver_cpu": LimitKind("the receiving host's CPU", own_end=True),
    "sender_cpu": LimitKind("the sending host's CPU", own_end=True),
    "receiver_drops": LimitKind("the receiver's UDP socket buffer", own_end=True),
}
FLOOR_ONLY = frozenset(name for name, kind in LIMIT_KINDS.items() if kind.floor_only)


class Source(BaseModel):
    """Where a figure comes from: the AWS page (title, URL), the date of the version read,
    and, when it was read second hand, the article that quoted it."""

    model_config = ConfigDict(extra="forbid")
    title: str = Field(min_length=1)
    url: str = Field(pattern=r"^https://")
    read: dt.date
    via: str = ""

    def cited(self) -> str:
        return f'"{self.title}", {self.url}, {self.read.isoformat()}' + (f" ({self.via})" if self.via else "")


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gbps: float = Field(gt=0)
    note: str = ""
    source: Source


class _RegionCap(BaseModel):
    model_config = ConfigDict(extra="forbid")
    share: float = Field(gt=0, le=1)
    min_vcpus: int = Field(ge=1)
    small_instance_gbps: float = Field(gt=0)
    # The newer wording of the page: ">= min_vcpus: share x bandwidth or the small figure,
    # whichever is larger"; false: the older wording (share x bandwidth). See limits.yaml.
    larger_of_share_and_small: bool = False
    note: str = ""
    source: Source

    def gbps(self, vcpus: int, bandwidth_gbps: float) -> float:
        if vcpus < self.min_vcpus:
            return self.small_instance_gbps
        shared = bandwidth_gbps * self.share
        return max(shared, self.small_instance_gbps) if self.larger_of_share_and_small else shared


class _TgwHistory(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gbps: float = Field(gt=0)
    basis: str
    source: Source


class _Tgw(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gbps: float = Field(gt=0)
    history: list[_TgwHistory] = Field(min_length=1)

    def source(self) -> Source:
        """The source of the figure used (the latest history row with that figure)."""
        rows = [h for h in self.history if h.gbps == self.gbps] or self.history
        return max(rows, key=lambda h: h.source.read).source


class Article(BaseModel):
    """A measurement published in an article (no AWS page states it): its title, where, and when."""

    model_config = ConfigDict(extra="forbid")
    title: str = Field(min_length=1)
    publisher: str = Field(min_length=1)
    published: dt.date

    def cited(self) -> str:
        return f'"{self.title}", {self.publisher}, {self.published.isoformat()}'


class _HostCpu(BaseModel):
    model_config = ConfigDict(extra="forbid")
    receive_gbps_per_vcpu: float = Field(gt=0)
    note: str = ""
    article: Article


class LimitsTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    per_flow: dict[str, _Row]
    region_cap: _RegionCap
    transit_gateway: _Tgw
    host_cpu: dict[str, _HostCpu] = Field(default_factory=dict)  # by architecture


@cache
def table(path: Path | None = None) -> LimitsTable:
    if path is not None:
        return yamlfile.load_model(path, LimitsTable)
    with resources.as_file(resources.files("pathprobe") / "data" / "limits.yaml") as default:
        return yamlfile.load_model(default, LimitsTable)


@dataclass(frozen=True)
class Expected:
    """What a test should reach. `bits_per_second`/`limit`/`candidates`: the FLOOR (instance
    baselines), the figure alerts compare with; `peak_*`: the same with instance peaks
    (context: what a test may reach while burst credits last). The names of its limits are
    LIMIT_KINDS'."""

    bits_per_second: float
    limit: str
    candidates: Mapping[str, float]
    peak_bits_per_second: float = math.nan  # default: the floor
    peak_limit: str = ""  # default: the floor's limit
    peak_candidates: Mapping[str, float] = field(default_factory=dict)  # default: the floor's
    # Instance types named for the path (this host's, the peer's) that the instance-type
    # table does not know: their bandwidth is left out, never guessed.
    unknown_instance_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if math.isnan(self.peak_bits_per_second):
            object.__setattr__(self, "peak_bits_per_second", self.bits_per_second)
        if not self.peak_limit:
            object.__setattr__(self, "peak_limit", self.limit)
        if not self.peak_candidates:
            object.__setattr__(self, "peak_candidates", dict(self.candidates))

    @property
    def floor_bits_per_second(self) -> float:
        return self.bits_per_second

    @property
    def ceiling_limit(self) -> str:
        """The peak's binding limit among those that are ceilings (not FLOOR_ONLY)."""
        c = {k: v for k, v in self.peak_candidates.items() if k not in FLOOR_ONLY} or dict(self.peak_candidates)
        return min(c, key=lambda k: c[k])

    @property
    def ceiling_bits_per_second(self) -> float:
        """The most a test may reach: the peak without the limits measured to be floors."""
        return self.peak_candidates[self.ceiling_limit]


def kernel_window_share(release: str, adv_win_scale: int = ADV_WIN_SCALE_DEFAULT) -> float:
    """The advertised share of tcp_rmem max for a kernel family, not this host's (a plan
    for hosts that do not exist yet): 1 - 2^-scale before 6.6, SHARE_SINCE_6_6 after.
    Raises ValueError for a release without major.minor (never guess the family)."""
    m = re.match(r"(\d+)\.(\d+)", release)
    if m is None:
        raise ValueError(f"{release!r} is not a kernel release (e.g. 6.1, 6.8.0-1015-aws)")
    return window_share(f"{m[1]}.{m[2]}", adv_win_scale)


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


def receiver_cpu_bound(
    receiver: instance_types.InstanceType | None, stream_threads: int, limits: LimitsTable | None = None
) -> float | None:
    """Bits/s the receiving instance's vCPUs carry for an iperf3 test whose receiver runs
    `stream_threads` threads (one per stream from iperf3 3.16, one per process before); None for
    an unknown type or an architecture without a published figure (never guessed)."""
    t = limits or table()
    rows = [t.host_cpu[a] for a in (receiver.architectures if receiver else ()) if a in t.host_cpu]
    if receiver is None or not rows:
        return None
    return min(receiver.vcpus, stream_threads) * rows[0].receive_gbps_per_vcpu * GBPS


def buffer_bound(buffer_bytes: int, rtt_seconds: float, streams: int, share: float) -> float:
    """Bits/s that `streams` TCP flows can carry with this buffer (tcp_rmem or tcp_wmem max) at this RTT."""
    return buffer_bytes * share * 8 / rtt_seconds * streams


def _instance_bounds(
    peer: Peer, t: LimitsTable, ends: list[instance_types.InstanceType], which: str, scale: float
) -> dict[str, float]:
    """The instance's and the inter-region bound, from each end's baseline (`which`: the floor)
    or its peak bandwidth in Gbps, or the overrides."""
    o = peer.limits
    bounds: dict[str, float] = {}
    ends_gbps = [(e.vcpus, (e.card.baseline_gbps if which == "baseline" else e.card.peak_gbps)) for e in ends]
    override = o.instance_bits_per_second
    if which == "peak" and o.instance_peak_bits_per_second:
        override = o.instance_peak_bits_per_second
    if override:
        bounds["instance"] = override
    elif ends_gbps:
        bounds["instance"] = min(gbps for _, gbps in ends_gbps) * GBPS / scale
    if peer.path_class == PathClass.inter_region:
        if o.region_cap_bits_per_second:
            bounds["region_cap"] = o.region_cap_bits_per_second
        elif ends_gbps:
            bounds["region_cap"] = min(t.region_cap.gbps(v, gbps) for v, gbps in ends_gbps) * GBPS / scale
    return bounds


def expected(  # noqa: PLR0913, PLR0917 - the model's inputs, each one a limit's; the callers pass them by position
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
    types: instance_types.Table | None = None,
    send_share: float | None = None,
    receiver_cpu: float | None = None,
) -> Expected:
    """The floor and the peak of one test from this host (`host_instance`) to `peer`.
    `send_share`: the share of tcp_wmem max in flight (None: `share`, as the live review has it);
    `receiver_cpu`: what the receiving host's vCPUs carry (receiver_cpu_bound), a limit of its own."""
    t = limits or table()
    o = peer.limits
    if o.expected_bits_per_second:
        return Expected(o.expected_bits_per_second, "override", {"override": o.expected_bits_per_second})
    common: dict[str, float] = {}
    per_flow = o.per_flow_bits_per_second or t.per_flow[o.placement or "default"].gbps * GBPS / scale
    common["per_flow"] = per_flow * streams
    if peer.path_class == PathClass.transit_gateway:
        common["transit_gateway"] = o.transit_gateway_bits_per_second or t.transit_gateway.gbps * GBPS / scale
    if protocol == "tcp" and rtt_seconds:
        share = share or window_share()
        if receiver_rmem_max:
            common["receive_window"] = buffer_bound(receiver_rmem_max, rtt_seconds, streams, share)
        if sender_wmem_max:
            common["send_buffer"] = buffer_bound(sender_wmem_max, rtt_seconds, streams, send_share or share)
    if protocol == "udp" and udp_target:
        common["target_rate"] = udp_target
    if receiver_cpu:
        common["receiver_cpu"] = receiver_cpu

    named = [name for name in (host_instance, peer.instance_type) if name]
    types = types or instance_types.load()
    ends = [e for e in (types.get(name) for name in named) if e is not None]
    unknown = tuple(dict.fromkeys(name for name in named if types.get(name) is None))
    floor = common | _instance_bounds(peer, t, ends, "baseline", scale)
    peak = common | _instance_bounds(peer, t, ends, "peak", scale)
    limit = min(floor, key=lambda k: floor[k])
    peak_limit = min(peak, key=lambda k: peak[k])
    return Expected(floor[limit], limit, floor, peak[peak_limit], peak_limit, peak, unknown)


def unknown_instance_types(cfg: Config, types: instance_types.Table | None = None) -> list[str]:
    """check-config's problems for instance types the table does not know (field path and
    the type): the model leaves their bandwidth out, so say so rather than guess."""
    types = types or instance_types.load()
    named = [("host.instance_type", cfg.host.instance_type)]
    named += [(f"peers.{i}.instance_type", p.instance_type) for i, p in enumerate(cfg.peers)]
    return [
        f"{where}: unknown instance type {name!r} (not in the instance-type table: {types.cited()}); "
        "its bandwidth limits are left out. Check the name, or import a newer table (pathprobe limits import)"
        for where, name in named
        if name and types.get(name) is None
    ]


def describe(name: str, limits: LimitsTable | None = None, types: instance_types.Table | None = None) -> dict[str, Any]:
    """What the model uses for one instance type, each figure with its source and date
    (`pathprobe limits show`). Keys carry their units. Raises KeyError for an unknown type."""
    t = limits or table()
    types = types or instance_types.load()
    e = types.get(name)
    if e is None:
        raise KeyError(name)
    api = f"instance-type table ({types.source})"
    data_date = types.as_of.isoformat()

    def fig(value: float, source: str, date: str, note: str = "") -> dict[str, Any]:
        return {"bits_per_second": value, "source": source, "date": date, **({"note": note} if note else {})}

    cap = t.region_cap
    cap_src, cap_date = cap.source.cited(), cap.source.read.isoformat()
    card = f"NetworkInfo.NetworkCards[{e.card.index}]"
    figures = {
        "baseline_bits_per_second": fig(e.baseline_bits_per_second, f"{api}: {card}.BaselineBandwidthInGbps",
                                        data_date, "the alerting floor's instance figure"),
        "peak_bits_per_second": fig(e.peak_bits_per_second, f"{api}: {card}.PeakBandwidthInGbps", data_date,
                                    "while network I/O credits last; context, not an alert threshold"),
        "inter_region_cap_floor_bits_per_second": fig(cap.gbps(e.vcpus, e.baseline_bits_per_second / GBPS) * GBPS,
                                                      cap_src, cap_date, cap.note),
        "inter_region_cap_peak_bits_per_second": fig(cap.gbps(e.vcpus, e.peak_bits_per_second / GBPS) * GBPS,
                                                     cap_src, cap_date, cap.note),
        "transit_gateway_bits_per_second": fig(t.transit_gateway.gbps * GBPS, t.transit_gateway.source().cited(),
                                               t.transit_gateway.source().read.isoformat(), "per VPC attachment"),
    }  # fmt: skip
    for placement, row in t.per_flow.items():
        figures[f"per_flow_{placement}_bits_per_second"] = fig(
            row.gbps * GBPS, row.source.cited(), row.source.read.isoformat(), row.note
        )
    return {
        "instance_type": name,
        "default_vcpus": e.vcpus,
        "ena_support": e.ena,
        "network_performance": e.performance,
        "burst": e.burst,
        "baseline_bits_per_second": e.baseline_bits_per_second,
        "peak_bits_per_second": e.peak_bits_per_second,
        "default_network_card": e.card.index,
        "network_cards": [
            {
                "index": c.index,
                "baseline_bits_per_second": c.baseline_gbps * GBPS,
                "peak_bits_per_second": c.peak_gbps * GBPS,
            }
            for c in e.cards
        ],
        "total_baseline_bits_per_second": e.total_baseline_bits_per_second,
        "total_peak_bits_per_second": e.total_peak_bits_per_second,
        "figures": figures,
        "table": {"source": types.source, "as_of": data_date, "generated": types.generated.isoformat()},
    }


def host_buffer_max(which: str) -> int | None:
    """This host's tcp_rmem or tcp_wmem maximum (which: "rmem" or "wmem")."""
    try:
        return int(Path(f"/proc/sys/net/ipv4/tcp_{which}").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return None
