"""The config's `probes:` section: each probe kind's settings model, under its kind's name
(kinds.KINDS), with every default."""

from __future__ import annotations

from typing import Annotated, NamedTuple

from pydantic import Field

from .strict import BitsPerSecond, Bytes, Congestion, Direction, Dscp, Protocol, Strict


class SteadyStateSettings(Strict):
    """Stop a TCP test once its rate has settled (probes/steady.py): duration_seconds is then
    the most it runs, and omit_seconds is not used (the detector leaves slow start out). On by
    default: bench/throughput_cost.py measured every row (1-150 ms, 200 and 500 Mbit/s, 1 and 4
    streams) within 2% of a 10 s test's steady state with at most a quarter of its bytes, and the
    bytes of each test decide how often a budget lets a fleet test each path. `enabled: false`
    keeps fixed-length tests (duration_seconds, omit_seconds left out)."""

    enabled: bool = True
    # Two successive windows' mean rates agree within this share.
    tolerance: float = Field(default=0.02, gt=0, lt=0.5)
    # A window spans this many RTTs of the path (the RTT probe's median), and at least min_window_seconds.
    window_rtts: float = Field(default=4, ge=1, le=100)
    min_window_seconds: float = Field(default=0.5, gt=0, le=10)
    min_seconds: float = Field(default=1, ge=0, le=60)


class TestSpec(NamedTuple):
    """One test of a peer's throughput settings."""

    protocol: str
    streams: str
    direction: str


class ThroughputSettings(Strict):
    enabled: bool = True
    protocols: list[Protocol] = Field(default=["tcp"], min_length=1)
    streams: list[Annotated[int, Field(ge=1, le=128)]] = Field(default=[1, 8], min_length=1)
    directions: list[Direction] = Field(default=["send"], min_length=1)
    duration_seconds: float = Field(default=5, gt=0, le=60)
    omit_seconds: float = Field(default=1, ge=0, le=10)
    congestion: Congestion | None = None
    udp_bitrate: BitsPerSecond = 100e6
    # Socket buffer (iperf3 -w); None leaves the kernel's autotuning alone.
    window_bytes: Bytes | None = None
    steady_state: SteadyStateSettings = SteadyStateSettings()
    dscp: Dscp = 0

    def tests(self) -> list[TestSpec]:
        """Every test these settings ask for, in run order."""
        return [TestSpec(p, str(s), d) for p in self.protocols for s in self.streams for d in self.directions]


class ThroughputOverrides(Strict):
    """Per-peer changes to the throughput settings; unset fields keep the global value."""

    enabled: bool | None = None
    protocols: list[Protocol] | None = None
    streams: list[Annotated[int, Field(ge=1, le=128)]] | None = None
    directions: list[Direction] | None = None
    udp_bitrate: BitsPerSecond | None = None
    steady_state: SteadyStateSettings | None = None


# Continuous probes spread over this many flows (source ports), so that they cross every
# member of an ECMP group with high probability (8 flows over 4 paths miss one with p = 0.4%
# ... over 2 paths with p = 0.8%); a peer's responder must accept that many connections
# from one source (responders.rr_max_connections_per_source).
FLOWS_DEFAULT, FLOWS_MAX = 8, 64


# The continuous probes' default rates, per peer: what the rules read needs no more, and 50 peers'
# probing then costs a few percent of a core (bench/exporter_bench.py). RTT once a second, as
# smokeping_prober's default: the rules read the p50 over probes.rtt.quantile_window_seconds (300
# samples); UDP echo 5 packets a second: the loss rule's warning (1% over 10 minutes) is then 30
# lost packets, enough to tell it from half of it (Poisson); each of 8 flows is failing after
# about 26 s of its packets lost.
RTT_INTERVAL_DEFAULT, ECHO_RATE_DEFAULT = 1.0, 5.0


class RttSettings(Strict):
    enabled: bool = True
    interval_seconds: float = Field(default=RTT_INTERVAL_DEFAULT, ge=0.001, le=60)
    # Request size; 8 and more carry the responder's follow-up (wire.RR_FOLLOW_UP) that takes its
    # own send off the RTT: 8 by default (netperf TCP_RR's is 1; both one small segment).
    size_bytes: int = Field(default=8, ge=1, le=65536)
    # An answer whose RTT (its stamps, the responder's hold taken off) exceeds this is a timeout. A
    # request the peer's kernel acknowledged is waited for as long again: a busy responder's answer.
    timeout_seconds: float = Field(default=1.0, gt=0, le=30)
    # TCP connections, used in turn (each has its own source port).
    flows: int = Field(default=FLOWS_DEFAULT, ge=1, le=FLOWS_MAX)
    # The window of pathprobe_rtt_seconds's quantiles (TCP and UDP): the rules name their recordings
    # after it (alert parameter rtt_exporter_window). Shorter windows react sooner and sample less.
    quantile_window_seconds: float = Field(default=300, ge=10, le=3600)
    dscp: Dscp = 0


class EchoSettings(Strict):
    enabled: bool = True
    rate_pps: float = Field(default=ECHO_RATE_DEFAULT, gt=0, le=1000)
    # 36: the echo header (wire.ECHO_HEADER); 80 carries every field the responder fills in (the
    # follow-up that takes its own send off the RTT last).
    size_bytes: int = Field(default=80, ge=36, le=1400)
    # A packet is lost only when no echo came within this time.
    timeout_seconds: float = Field(default=2.0, gt=0, le=30)
    # UDP sockets, used in turn (each has its own source port).
    flows: int = Field(default=FLOWS_DEFAULT, ge=1, le=FLOWS_MAX)
    dscp: Dscp = 0


# IP packet sizes a path of each class should carry (AWS: 9001 inside a VPC, 8500 over
# inter-region VPC peering and Transit Gateway, 1500 over the internet gateway; see
# docs/SOURCES.md). 1500 is always probed.
MTU_BY_PATH_CLASS: dict[str, list[int]] = {
    "intra_region": [1500, 9001],
    "vpc_peering": [1500, 8500],
    "transit_gateway": [1500, 8500],
    "inter_region": [1500],
}


class MtuSettings(Strict):
    enabled: bool = True
    # Each size is probed once per interval: a DF-set UDP echo of exactly that IP size.
    interval_seconds: float = Field(default=10, ge=1, le=3600)
    timeout_seconds: float = Field(default=2.0, gt=0, le=30)
    # IP packet sizes to probe; None: by the peer's path class (MTU_BY_PATH_CLASS).
    sizes: list[Annotated[int, Field(ge=576, le=65535)]] | None = None

    def sizes_for(self, path_class: str) -> list[int]:
        return sorted(set(self.sizes if self.sizes is not None else MTU_BY_PATH_CLASS[path_class]))


class Probes(Strict):
    throughput: ThroughputSettings = ThroughputSettings()
    rtt: RttSettings = RttSettings()
    loss: EchoSettings = EchoSettings()
    mtu: MtuSettings = MtuSettings()
