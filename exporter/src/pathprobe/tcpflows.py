"""The host's own TCP flows to its peers, from sock_diag's dump (sockdiag.py): one inet_diag_msg
and its tcp_info (linux/inet_diag.h, linux/tcp.h) into a `Flow`, a flow's destination into the
peer or configured network it goes to (`Classifier`, pathprobe's own probe and responder sockets
left out), and the time a flow spent limited by what (`limited`). Pure: flowreader.py reads the
kernel, `pathprobe flows` prints."""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

# The limits a flow's sending time divides into: the peer's advertised receive window full
# (tcpi_rwnd_limited), this host's send buffer full (tcpi_sndbuf_limited), the rest of the time
# with data in flight (tcpi_busy_time less both: the congestion window, retransmissions), and the
# time it moved data but had none in flight (the application wrote nothing). LIMIT_KINDS' names
# for the first two.
LIMITS = ("receive_window", "send_buffer", "network", "application")

# inet_diag_msg: family, state, timer, retrans (u8 each), then the socket id: source and
# destination port (big-endian u16), source and destination address (16 bytes each), interface,
# cookie (two u32, low word first); then expires, rqueue, wqueue, uid, inode (u32 each).
_MSG_SIZE = 72
_PORTS = struct.Struct("!HH")
_COOKIE = struct.Struct("=II")
_INET_DIAG_INFO = 2
# tcp_info (linux/tcp.h), the fields read, in one unpack: the app-limited flag (bit 0 of byte 7),
# tcpi_rtt (u32, us) at 68, tcpi_snd_cwnd 80, tcpi_total_retrans 100, tcpi_bytes_acked and
# tcpi_bytes_received (u64) 120 and 128, tcpi_delivery_rate (u64, bytes/s; Linux 4.9 on) 160,
# tcpi_busy_time, tcpi_rwnd_limited, tcpi_sndbuf_limited (u64, us; Linux 4.10 on) 168, 176, 184.
_INFO = struct.Struct("=7xB60xI8xI16xI16xQQ24xQQQQ")
_OLD_INFO = struct.Struct("=7xB60xI8xI16xI16xQQ")  # before 4.9: no rate, no times
_RATE_ONLY = struct.Struct("=7xB60xI8xI16xI16xQQ24xQ")  # 4.9: the rate, no times
_WINDOW = struct.Struct("=16xI208xI")  # tcpi_snd_mss at 16, tcpi_snd_wnd (Linux 5.4 on) at 228


class Flow(NamedTuple):
    """One established TCP socket as its tcp_info shows it; counters over the socket's life.
    A tuple: the reader builds one per socket per read."""

    cookie: int  # the kernel's socket cookie: the same socket between reads
    local_address: bytes
    local_port: int
    remote_address: bytes
    remote_port: int
    app_limited: bool  # the last delivery-rate sample was limited by the application
    rtt_us: int  # smoothed RTT
    cwnd_segments: int
    retransmitted: int  # segments retransmitted (tcpi_total_retrans)
    acked: int  # bytes acknowledged by the peer
    received: int  # bytes received from the peer
    delivery_rate: int = 0  # bytes/s, the kernel's last delivery-rate sample (Linux 4.9 on)
    busy_us: int = 0
    rwnd_limited_us: int = 0
    sndbuf_limited_us: int = 0
    chrono: bool = False  # the kernel keeps the three times (Linux 4.10 on)
    mss: int = 0
    snd_wnd: int = 0  # bytes: the peer's advertised receive window (Linux 5.4 on; 0 before)

    @property
    def window_bound(self) -> bool:
        """The peer's window is no larger than the congestion window (within two segments): the
        window is what bounds the bytes in flight. The kernel counts such time as cwnd-limited
        (its congestion window test comes first, and CUBIC's window does not grow past what is
        sent), not as rwnd_limited, when the receiver reads as fast as data comes."""
        return self.snd_wnd > 0 and self.mss > 0 and (self.cwnd_segments + 2) * self.mss >= self.snd_wnd

    @property
    def local(self) -> str:
        return str(ipaddress.ip_address(self.local_address))

    @property
    def remote(self) -> str:
        return str(ipaddress.ip_address(self.remote_address))


def remote_key(message: bytes) -> tuple[int, bytes, int, int]:
    """(family, the destination address's bytes, local port, remote port) of an inet_diag_msg,
    read before the rest so that flows to no peer cost a slice."""
    family = message[0]
    sport, dport = _PORTS.unpack_from(message, 4)
    return family, message[24 : 28 if family == socket.AF_INET else 40], sport, dport


_QUICK = struct.Struct("=100xI16xQQ32xQ")  # tcpi_total_retrans, tcpi_bytes_acked, _received, tcpi_busy_time
_hint = [_MSG_SIZE + 4]  # where the last message's tcp_info was: a dump's messages carry the same attributes


def _info(message: bytes) -> tuple[int, int] | None:
    """(offset, length) of the tcp_info in an inet_diag_msg's attributes; None without one."""
    at = _hint[0]
    if at + 4 <= len(message):
        length, kind = struct.unpack_from("=HH", message, at - 4)
        if kind == _INET_DIAG_INFO and at - 4 + length <= len(message):
            return at, length - 4
    offset = _MSG_SIZE
    while offset + 4 <= len(message):
        length, kind = struct.unpack_from("=HH", message, offset)
        if length < 4:
            return None
        if kind == _INET_DIAG_INFO:
            _hint[0] = offset + 4
            return offset + 4, length - 4
        offset += (length + 3) & ~3
    return None


def counters(message: bytes) -> tuple[int, tuple[int, ...]] | None:
    """(cookie, the counters that move when a flow does: retransmits, bytes acked and received,
    busy time) of an inet_diag_msg, cheaper than `parse`: a flow whose counters did not move since
    the last read has the same tcp_info figures the reader keeps (its srtt and delivery-rate sample
    change only on an acknowledgement). None where its tcp_info has no busy time (then parse)."""
    found = _info(message) if len(message) >= _MSG_SIZE else None
    if found is None or found[1] < _QUICK.size:
        return None
    low, high = _COOKIE.unpack_from(message, 44)
    return high << 32 | low, _QUICK.unpack_from(message, found[0])


def moved(flow: Flow) -> tuple[int, ...]:
    """`counters`' figures of a parsed flow."""
    return (flow.retransmitted, flow.acked, flow.received, flow.busy_us)


def parse(message: bytes) -> Flow | None:
    """The `Flow` of one inet_diag_msg with its INET_DIAG_INFO attribute; None without one (or
    with a tcp_info shorter than any kernel's)."""
    found = _info(message) if len(message) >= _MSG_SIZE else None
    if found is None:
        return None
    at, size = found
    end = 12 if message[0] == socket.AF_INET else 24
    sport, dport = _PORTS.unpack_from(message, 4)
    low, high = _COOKIE.unpack_from(message, 44)
    head = (high << 32 | low, message[8:end], sport, message[24 : end + 16], dport)
    for layout, chrono in ((_INFO, True), (_RATE_ONLY, False), (_OLD_INFO, False)):
        if size >= layout.size:
            flag, *rest = layout.unpack_from(message, at)
            fields = (*head, bool(flag & 1), *rest)
            missing = len(Flow._fields) - 3 - len(fields)  # what an older kernel does not keep: 0
            window = _WINDOW.unpack_from(message, at) if size >= _WINDOW.size else (0, 0)
            return Flow._make((*fields, *(0,) * missing, chrono, *window))
    return None


class Delta(NamedTuple):
    """What one flow did between two reads."""

    acked: int
    received: int
    retransmitted: int
    busy_us: int
    rwnd_limited_us: int
    sndbuf_limited_us: int


def delta(now: Flow, before: Flow | None) -> Delta:
    """`now` less `before` (the same socket read earlier; None: a socket new since, counted from 0).
    Never negative: a counter that went back (a reused cookie) counts from 0."""

    def d(a: int, b: int) -> int:
        return a - b if a >= b else a

    b = before
    return Delta(
        d(now.acked, b.acked if b else 0),
        d(now.received, b.received if b else 0),
        d(now.retransmitted, b.retransmitted if b else 0),
        d(now.busy_us, b.busy_us if b else 0),
        d(now.rwnd_limited_us, b.rwnd_limited_us if b else 0),
        d(now.sndbuf_limited_us, b.sndbuf_limited_us if b else 0),
    )


def limited(change: Delta, seconds: float, window_bound: bool = False) -> dict[str, float]:
    """Seconds of the `seconds` between two reads that a flow spent limited by each of LIMITS.
    The receive window's and send buffer's are the kernel's own; the network's is the rest of the
    busy time; the application's, for a flow that sent data, the time it had none in flight
    (a flow idle throughout is waiting, not limited: none). `window_bound` (Flow.window_bound): the
    network's share is the receive window's."""
    busy = min(change.busy_us / 1e6, seconds)
    rwnd = min(change.rwnd_limited_us / 1e6, busy)
    sndbuf = min(change.sndbuf_limited_us / 1e6, busy - rwnd)
    network = busy - rwnd - sndbuf
    if window_bound:
        rwnd, network = rwnd + network, 0.0
    return {
        "receive_window": rwnd,
        "send_buffer": sndbuf,
        "network": network,
        "application": seconds - busy if change.acked > 0 else 0.0,
    }


def bound(shares: Mapping[str, float]) -> str:
    """The limit a flow spent the most time under ("none" when it spent none)."""
    top = max(LIMITS, key=lambda k: shares.get(k, 0.0))
    return top if shares.get(top, 0.0) > 0 else "none"


def buffer_needed(bits_per_second: float, rtt_seconds: float, share: float) -> int:
    """The tcp_rmem / tcp_wmem max at which one flow's window carries `bits_per_second` at this
    RTT: the bandwidth-delay product over the share of a buffer TCP keeps in flight
    (limits.window_share), rounded up to a MiB."""
    need = bits_per_second / 8 * rtt_seconds / share
    mib = 1 << 20
    return int(-(-need // mib) * mib)


@dataclass(frozen=True)
class Destination:
    """Where a flow goes: a peer, or a configured network that is not one (labelled alike)."""

    peer: str
    region: str
    path_class: str


class Classifier:
    """A flow's destination by its remote address; pathprobe's own sockets left out by port: its
    probes' connections to peers' responders (`remote_ports`) and peers' probes of this host's
    (`local_ports`)."""

    def __init__(
        self,
        peers: Mapping[str, Destination],
        networks: Iterable[tuple[str, Destination]] = (),
        local_ports: Iterable[int] = (),
        remote_ports: Iterable[int] = (),
    ):
        self.by_address: dict[bytes, Destination] = {}
        for address, destination in peers.items():
            ip = ipaddress.ip_address(address)
            self.by_address[ip.packed] = destination
            if ip.version == 4:  # an IPv6 socket's peer over IPv4 shows as ::ffff:a.b.c.d
                self.by_address[ipaddress.IPv6Address(f"::ffff:{ip}").packed] = destination
        self.networks = [(ipaddress.ip_network(n, strict=False), d) for n, d in networks]
        self.local_ports, self.remote_ports = frozenset(local_ports), frozenset(remote_ports)
        self._seen: dict[bytes, Destination | None] = {}  # addresses matched against networks: each once

    def of(self, address: bytes, local_port: int, remote_port: int) -> Destination | None:
        """The destination of a flow to `address` (its bytes) between these ports; None: not one of ours."""
        if local_port in self.local_ports or remote_port in self.remote_ports:
            return None
        found = self.by_address.get(address)
        if found is not None or not self.networks:
            return found
        if address in self._seen:
            return self._seen[address]
        ip = ipaddress.ip_address(address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        hit = next((d for n, d in self.networks if ip.version == n.version and ip in n), None)
        if len(self._seen) < 65536:  # bounded: a host talking to the whole internet
            self._seen[address] = hit
        return hit
