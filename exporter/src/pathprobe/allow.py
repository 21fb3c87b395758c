"""Who the responders answer: configured peers plus extra CIDRs."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class AllowList:
    def __init__(self, networks: Iterable[Network | str]):
        self.networks = tuple(ipaddress.ip_network(n, strict=False) for n in networks)

    def allows(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self.networks)

    def __repr__(self) -> str:
        return f"AllowList({', '.join(map(str, self.networks))})"
