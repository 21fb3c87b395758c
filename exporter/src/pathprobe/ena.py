"""The ENA driver's allowance counters: packets an EC2 instance queued or dropped because the
INSTANCE exceeded one of its allowances (bandwidth in/out, packets per second, connection
tracking, link-local services), not because of the path.

They come from `ethtool -S IFACE` on instances with the ENA driver (see "Monitor network
performance for ENA settings on your EC2 instance", Amazon EC2 User Guide, docs/SOURCES.md
[AWS-ENA]). Elsewhere (the lab, other drivers) they do not exist: `read()` returns None and
the exporter exports nothing for them, never zeros.
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
_LINE = re.compile(r"^\s*([A-Za-z0-9_]+):\s*(\d+)\s*$")


def parse(text: str) -> dict[str, int] | None:
    """The allowance counters in `ethtool -S` output; None when it has none of them."""
    found = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) in ALLOWANCES:
            found[m.group(1)] = int(m.group(2))
    return found or None


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
    """The counters that rose between two readings, by how much."""
    if not before or not after:
        return {}
    return {k: after[k] - before[k] for k in after if k in before and after[k] > before[k]}


def explain(rises: dict[str, int]) -> str:
    """In words, for the capacity review and logs."""
    return (
        "the instance's allowance, not the path: "
        + ", ".join(f"{name} rose by {n}" for name, n in sorted(rises.items()))
        + " during the test"
    )
