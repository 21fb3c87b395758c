"""Probers, one module each: rtt (TCP request/response), echo (UDP echo: loss, RTT, one-way
delays; the `loss` kind), mtu (path MTU), throughput (iperf3). base.py holds the shape they
share; kinds.KINDS names each kind's prober."""

from .base import REASONS, ProbeFailure, Prober, ProberFactory, Reason, Target, reason_of_oserror
from .echo import EchoProber
from .iperf3_test import ThroughputResult, ThroughputTest
from .mtu import MtuProber
from .rtt import RttProber
from .throughput import ThroughputProber

__all__ = [
    "REASONS",
    "EchoProber",
    "MtuProber",
    "ProbeFailure",
    "Prober",
    "ProberFactory",
    "Reason",
    "RttProber",
    "Target",
    "ThroughputProber",
    "ThroughputResult",
    "ThroughputTest",
    "reason_of_oserror",
]
