"""Who the responders answer: configured peers plus extra CIDRs."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Config

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class AllowList:
    def __init__(self, networks: Iterable[Network | str]):
        self.networks = tuple(ipaddress.ip_network(n, strict=False) for n in networks)

    @classmethod
    def of(cls, cfg: Config) -> AllowList:
        """The config's peers and `responders.allow`: whom every responder (and the firewall) admits."""
        return cls([*(str(p.address) for p in cfg.peers), *cfg.responders.allow])

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
