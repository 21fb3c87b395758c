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
        # Peers are single addresses: a set lookup keeps a datagram's check O(1) at any mesh size.
        self._hosts = frozenset(n.network_address for n in self.networks if n.num_addresses == 1)
        self._wider = tuple(n for n in self.networks if n.num_addresses > 1)

    def replace(self, other: AllowList) -> None:
        """Admit what `other` admits from now on (a reload; the responders keep this object)."""
        self.networks, self._hosts, self._wider = other.networks, other._hosts, other._wider

    @classmethod
    def of(cls, cfg: Config) -> AllowList:
        """The peers this host probes and `responders.allow`: whom every responder (and the firewall) admits
        (the mesh's links are symmetric: the peers this host probes are those that probe it)."""
        return cls([*(str(p.address) for p in cfg.probed_peers), *cfg.responders.allow])

    @staticmethod
    def address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        """A source address as the responders see it (zone index dropped, IPv4-mapped IPv6
        as IPv4), or None for text that is not an address."""
        try:
            ip = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
            return ip.ipv4_mapped
        return ip

    @classmethod
    def normalize(cls, text: str) -> str:
        return str(cls.address(text) or text)

    def allows(self, address: str) -> bool:
        ip = self.address(address)
        return ip is not None and (ip in self._hosts or any(ip in net for net in self._wider))

    def __repr__(self) -> str:
        return f"AllowList({', '.join(map(str, self.networks))})"
