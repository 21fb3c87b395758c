"""The ENA driver's allowance counters: packets an EC2 instance queued or dropped because the
INSTANCE exceeded one of its allowances (bandwidth in/out, packets per second, connection
tracking, link-local services), not because of the path.

They come from `ethtool -S IFACE` on instances with the ENA driver (see "Monitor network
performance for ENA settings on your EC2 instance", Amazon EC2 User Guide, docs/SOURCES.md
[AWS-ENA]). Elsewhere (the lab, other drivers) they do not exist: `read()` returns None and
the exporter exports nothing for them, never zeros.

Beside them, ENA Express's counters where the driver has them (the ENA driver's ena_ethtool.c;
"Monitor ENA Express settings on your EC2 instance", Amazon EC2 User Guide): whether SRD is on
(ena_srd_mode), the packets sent over SRD and those that could have been (ena_srd_tx_pkts,
ena_srd_eligible_tx_pkts), those received over it, and how much of its resources are in use. A path
expected at ENA Express's 25 Gbit/s per flow (limits.placement ena_express) whose eligible packets
went out without SRD fell back to ENA's 5 Gbit/s per flow, silently: `srd_share` says how much.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ALLOWANCES = (
    "bw_in_allowance_exceeded",
    "bw_out_allowance_exceeded",
    "pps_allowance_exceeded",
    "conntrack_allowance_exceeded",
    "linklocal_allowance_exceeded",
)
EXPRESS = (
    "ena_srd_mode",  # the driver's flags: bit 0 ENA Express on, bit 1 for UDP too
    "ena_srd_tx_pkts",
    "ena_srd_eligible_tx_pkts",
    "ena_srd_rx_pkts",
    "ena_srd_resource_utilization",  # percent of the SRD connections' memory in use
)
_LINE = re.compile(r"^\s*([A-Za-z0-9_]+):\s*(\d+)\s*$")


def parse(text: str) -> dict[str, int] | None:
    """The allowance counters in `ethtool -S` output, and ENA Express's where it has them; None
    when it has none of the allowance counters."""
    found = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) in (*ALLOWANCES, *EXPRESS):
            found[m.group(1)] = int(m.group(2))
    return found if any(name in found for name in ALLOWANCES) else None


def default_interface(route_table: Path = Path("/proc/net/route")) -> str | None:
    """The interface of the IPv4 default route (where traffic to other regions leaves)."""
    try:
        lines = route_table.read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def interface(configured: str) -> str | None:
    """The interface to read: the configured one (host.interface), else the default route's."""
    return configured or default_interface()


def read(interface: str | None, ethtool: str = "ethtool") -> dict[str, int] | None:
    """The interface's allowance counters now; None where there are none (no ENA, no ethtool)."""
    binary = shutil.which(ethtool)
    if not interface or binary is None:
        return None
    try:
        proc = subprocess.run([binary, "-S", interface], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse(proc.stdout) if proc.returncode == 0 else None


def rose(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int]:
    """The allowance counters that rose between two readings, by how much."""
    if not before or not after:
        return {}
    return {k: after[k] - before[k] for k in ALLOWANCES if k in after and k in before and after[k] > before[k]}


def srd_share(before: dict[str, int] | None, after: dict[str, int] | None) -> float | None:
    """The share of the packets eligible for SRD that went over it between two readings (0-1);
    None where the driver has no ENA Express counters or no eligible packet went out."""
    names = ("ena_srd_tx_pkts", "ena_srd_eligible_tx_pkts")
    if not before or not after or any(k not in d for k in names for d in (before, after)):
        return None
    eligible = after["ena_srd_eligible_tx_pkts"] - before["ena_srd_eligible_tx_pkts"]
    sent = after["ena_srd_tx_pkts"] - before["ena_srd_tx_pkts"]
    return min(1.0, max(0.0, sent / eligible)) if eligible > 0 else None


def explain(rises: dict[str, int]) -> str:
    """In words, for the capacity review and logs."""
    return (
        "the instance's allowance, not the path: "
        + ", ".join(f"{name} rose by {n}" for name, n in sorted(rises.items()))
        + " during the test"
    )
