"""Probers, one module each: rtt (TCP request/response), echo (UDP echo: loss and RTT),
throughput (iperf3). See base.py for the shape they share."""

from .base import REASONS, ProbeFailure, Reason, Target, reason_of_oserror
from .echo import EchoProber
from .mtu import MtuProber
from .rtt import RttProber
from .throughput import ThroughputProber, ThroughputResult, ThroughputTest

__all__ = [
    "REASONS",
    "EchoProber",
    "MtuProber",
    "ProbeFailure",
    "Reason",
    "RttProber",
    "Target",
    "ThroughputProber",
    "ThroughputResult",
    "ThroughputTest",
    "reason_of_oserror",
]
