"""Probers, one module each: rtt (TCP request/response), echo (UDP echo: loss and RTT), mtu
(path MTU), throughput (iperf3). See base.py for the shape they share."""

from collections.abc import Callable

from .base import REASONS, ProbeFailure, Prober, Reason, Target, reason_of_oserror
from .echo import EchoProber
from .mtu import MtuProber
from .rtt import RttProber
from .throughput import ThroughputProber, ThroughputResult, ThroughputTest

# Each probe kind (the `probe` label of pathprobe_probe_runs_total) and its prober, all built
# as PROBERS[kind](target, settings, sink).
PROBERS: dict[str, Callable[..., Prober]] = {
    "throughput": ThroughputProber,
    "rtt": RttProber,
    "loss": EchoProber,
    "mtu": MtuProber,
}
CONTINUOUS = ("rtt", "loss", "mtu")  # run per peer until cancelled; throughput runs per test of a turn

__all__ = [
    "CONTINUOUS",
    "PROBERS",
    "REASONS",
    "EchoProber",
    "MtuProber",
    "ProbeFailure",
    "Prober",
    "Reason",
    "RttProber",
    "Target",
    "ThroughputProber",
    "ThroughputResult",
    "ThroughputTest",
    "reason_of_oserror",
]
