"""One throughput test: its settings and iperf3 command line (ThroughputTest), and what it measured
(ThroughputResult), with its own ends (ends.py). The prober (throughput.py) and the runner of its
processes (iperf3_run.py) both read them."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import ends, iperf3
from ..config import Iperf3Settings
from ..probe_settings import ThroughputSettings
from ..strict import default
from .base import Target
from .steady import Detector

# iperf3's reporting interval for a steady-state test.
INTERVAL_SECONDS = 0.1


@dataclass(frozen=True)
class ThroughputTest:
    """The settings of one iperf3 client test (the throughput prober's settings model)."""

    protocol: str = "tcp"
    streams: int = 1
    direction: str = "send"  # send: this host -> peer; receive: peer -> this host (-R)
    duration_seconds: float = default(ThroughputSettings, "duration_seconds")
    omit_seconds: float = default(ThroughputSettings, "omit_seconds")
    congestion: str | None = None
    udp_bitrate: float = default(ThroughputSettings, "udp_bitrate")
    window_bytes: int | None = None
    connect_timeout_seconds: float = 3
    # RSA authentication (client side).
    username: str | None = None
    password_file: Path | None = None
    public_key_file: Path | None = None
    legacy_rsa_padding: bool = False
    # Stop a TCP test at its steady state (probes/steady.py); duration_seconds is then its most.
    steady_state: Detector | None = None
    rtt_hint_seconds: float | None = None  # the path's RTT, for the detector's window
    binary: str = default(Iperf3Settings, "binary")
    # Time a test may overrun duration + omit before it is killed (connecting included).
    margin_seconds: float = 5.0
    # When (time.monotonic()) its processes are killed at the latest: a scheduled test's turn's end,
    # so that one started late cannot run into the next half, where its host or peer is in another
    # test. None: only max_seconds after they started.
    kill_at: float | None = None
    dscp: int = 0  # iperf3 --dscp: the mark of the test's packets (the data connections')
    # The peer's rr port: its responder reports its end of the test (probes/peer_end.py); None: not asked.
    report_port: int | None = None
    # The most iperf3 processes the test may be split over (iperf3.processes; iperf3_run.split).
    processes: int = 1

    @property
    def steady(self) -> Detector | None:
        """The detector, for a test that stops at its steady state (TCP only)."""
        return self.steady_state if self.protocol == "tcp" else None

    def command(self, target: Target) -> list[str]:
        # A steady-state test reads intervals live: text (-J prints only at the end), fixed units.
        output = ["-i", f"{INTERVAL_SECONDS:g}", "--forceflush", "-f", "k"] if self.steady else ["-J"]
        omit = 0 if self.steady else self.omit_seconds
        cmd = [
            self.binary, "-c", target.address, "-p", str(target.port), *output,
            "-t", f"{self.duration_seconds:g}", "-O", f"{omit:g}",
            "-P", str(self.streams),
            "--connect-timeout", str(int(self.connect_timeout_seconds * 1000)),
        ]  # fmt: skip
        if target.source is not None:
            cmd += ["-B", target.source]
        if self.protocol == "udp":
            # -b is per stream in iperf3; the configured rate is the total.
            cmd += ["-u", "-b", f"{self.udp_bitrate / self.streams:.0f}"]
        if self.direction == "receive":
            cmd.append("-R")
        if self.congestion and self.protocol == "tcp":
            cmd += ["-C", self.congestion]
        if self.window_bytes:
            cmd += ["-w", str(self.window_bytes)]
        if self.dscp:
            cmd += ["--dscp", str(self.dscp)]
        if self.username and self.public_key_file:
            cmd += [
                "--username",
                self.username,
                "--rsa-public-key-path",
                str(self.public_key_file),
                *iperf3.client_options(self.binary, self.legacy_rsa_padding),
            ]
        return cmd

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.password_file:
            env["IPERF3_PASSWORD"] = self.password_file.read_text().strip()
        return env

    def max_seconds(self) -> float:
        """The longest a test may take before it is killed (connecting included in the margin)."""
        return (0 if self.steady else self.omit_seconds) + self.duration_seconds + self.margin_seconds


@dataclass
class ThroughputResult:
    # Settings the result was measured with: two numbers are never compared blind.
    protocol: str
    streams: int
    direction: str
    duration_seconds: float
    omit_seconds: float
    congestion: str | None
    target_bits_per_second: float | None
    # Measurements.
    receiver_bytes_per_second: float
    sender_bytes_per_second: float
    bytes_transferred: int
    retransmits: int | None = None
    udp_packets: int | None = None
    udp_lost: int | None = None
    udp_loss_ratio: float | None = None
    jitter_seconds: float | None = None
    timestamp: float = 0.0  # when its iperf3 processes ended (Unix seconds)
    started_timestamp: float = 0.0  # when they started: with `timestamp`, the span the data moved in
    iperf3_version: str = ""
    # A steady-state test: whether it converged (False: it ran to duration_seconds), and how
    # long it ran (duration_seconds is then the time it took); None for a fixed-length test.
    converged: bool | None = None
    # A steady-state send test read through the sockets: the shares of its sending time with the
    # receiver's window full and with the send buffer full (steady.limited_shares); None otherwise.
    receive_window_limited_ratio: float | None = None
    send_buffer_limited_ratio: float | None = None
    # A TCP test: the mean over the test of its sending streams' smoothed RTT (the sender's kernel),
    # where reported: from the sockets (steady.sender_rtt) or iperf3's report (a fixed-length test).
    sender_rtt_seconds: float | None = None
    # The test's own ends (ends.py): what each end's iperf3 and host used and could use (None: not
    # known), and what of them bound the result (ends.Bound's limit and remedy).
    sender_end: ends.EndFigures | None = None
    receiver_end: ends.EndFigures | None = None
    bound: str = "unknown"
    remedy: str = ""
    # Why the peer's report of its end was set aside, where it was (probes/peer_end.py): that end unknown.
    peer_report_rejected: str | None = None
    # The test as iperf3 reported it, for the evidence store (evidence.py): each interval's rate and
    # retransmits with each stream's (its cwnd and RTT, in iperf3's units: bytes, microseconds), and
    # iperf3's own CPU figures (cpu_utilization_percent: host_total, remote_total, ...).
    intervals: list[dict[str, Any]] = field(default_factory=list)
    iperf3_cpu_percent: dict[str, float] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def host_bound(self) -> bool:
        """Whether the test measured one of its own ends (its CPU, its receive buffer), not the path."""
        return self.bound in ends.HOST_LIMITS

    def udp_receiver_drops(self) -> int | None:
        """Datagrams the receiving host dropped for a full socket buffer during a UDP test."""
        return self.receiver_end.udp_receive_drops if self.receiver_end is not None else None

    def udp_path_loss_ratio(self) -> float | None:
        """A UDP test's loss less what the receiving host dropped itself (None where its drops are not known)."""
        drops = self.udp_receiver_drops()
        if self.udp_lost is None or not self.udp_packets or drops is None:
            return None
        return max(0, self.udp_lost - drops) / self.udp_packets

    def moved_bytes(self) -> int:
        """Bytes the test put on the wire: iperf3 leaves the omitted seconds out of its count."""
        return int(self.bytes_transferred * (self.duration_seconds + self.omit_seconds) / self.duration_seconds)
