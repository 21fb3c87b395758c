"""A kernel filter in front of the iperf3 server: only the config's peers (and
`responders.allow`) reach its port.

iperf3 serves one client at a time and reads a new client's first bytes before it
authenticates (RSA keys or not), so one idle connection from anyone blocks every peer's
test for as long as it stays open (iperf3 3.12's --idle-timeout does not end it). The
request/response and echo responders check the allow list themselves and count what they
refuse (pathprobe_responder_requests_total{result="not_allowed"}); iperf3 cannot, so
nftables does it before the connection exists. One table of its own, replaced in one
transaction (`nft -f`): applying twice is the same as once, removing leaves the host's
other rules alone.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess

from .allow import AllowList
from .config import Config

TABLE = "pathprobe"


class FirewallError(RuntimeError):
    pass


def ruleset(cfg: Config) -> str:
    """The nftables script for this config (a whole table, replacing any earlier one)."""
    allowed = AllowList.of(cfg).networks
    v4 = sorted({str(n) for n in allowed if n.version == 4})
    v6 = sorted({str(n) for n in allowed if n.version == 6})
    # IPv4-mapped IPv6 peers reach the port over IPv4.
    v4 += sorted(
        {
            f"{n.network_address.ipv4_mapped}/{n.prefixlen - 96}"
            for n in allowed
            if isinstance(n, ipaddress.IPv6Network) and n.network_address.ipv4_mapped
        }
    )
    ports = cfg.iperf3.ports
    port = str(ports[0]) if len(ports) == 1 else f"{ports[0]}-{ports[-1]}"

    def elements(items: list[str]) -> str:
        return f" elements = {{ {', '.join(items)} }};" if items else ""

    return (
        f"table inet {TABLE} {{}}\n"
        f"delete table inet {TABLE}\n"
        f"table inet {TABLE} {{\n"
        f"  set peers4 {{ type ipv4_addr; flags interval; auto-merge;{elements(v4)} }}\n"
        f"  set peers6 {{ type ipv6_addr; flags interval; auto-merge;{elements(v6)} }}\n"
        "  chain input {\n"
        "    type filter hook input priority filter - 10; policy accept;\n"
        '    iifname "lo" accept\n'
        f"    meta l4proto {{ tcp, udp }} th dport {port} ip saddr != @peers4 counter drop\n"
        f"    meta l4proto {{ tcp, udp }} th dport {port} ip6 saddr != @peers6 counter drop\n"
        "  }\n"
        "}\n"
    )


def _nft(script: str) -> None:
    nft = shutil.which("nft")
    if nft is None:
        raise FirewallError("nft not found: install nftables")
    proc = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise FirewallError(f"nft refused the ruleset: {proc.stderr.strip()}")


def apply(cfg: Config) -> None:
    _nft(ruleset(cfg))


def remove() -> None:
    _nft(f"table inet {TABLE} {{}}\ndelete table inet {TABLE}\n")
