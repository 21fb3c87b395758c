"""The byte counters and limited times of the TCP sockets connected to one address and port,
as `ss -ti` shows them, read in-process from the kernel's sock_diag netlink interface
(linux/inet_diag.h): a steady-state test reads them ten times a second, and starting `ss` each
time costs a process.

A small reader of our own rather than pyroute2's DiagSocket: dump requests with a filter of one
or more address conditions and a few fields of tcp_info, about 100 lines, against a new dependency that every
host's wheelhouse (the Ansible role, Graviton included) would have to carry. `ss` stays the
fallback where netlink is refused (parse_ss).

`remotes_on_port`: the remote addresses of the sockets on one local port, for the iperf3
servers' watch every 2 s, which read all of /proc/net/tcp (every probe's and responder's
connection of the host) to find them."""

from __future__ import annotations

import errno
import ipaddress
import itertools
import os
import re
import socket
import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class SocketBytes:
    """One TCP socket's byte counters (tcp_info), what held its sending back, and its RTT."""

    sent: int  # put on the wire, retransmissions included (tcpi_bytes_sent)
    acked: int  # acknowledged by the peer (tcpi_bytes_acked)
    received: int  # received from the peer (tcpi_bytes_received)
    # The kernel's sending-time chronographs (microseconds; `ss` shows them in ms): time with data in
    # flight (tcpi_busy_time), and the parts of it with the peer's advertised receive window full
    # (tcpi_rwnd_limited) and with this socket's send buffer full, its writer waiting (tcpi_sndbuf_limited).
    busy_us: int = 0
    rwnd_limited_us: int = 0
    sndbuf_limited_us: int = 0
    rtt_us: int = 0  # the sender's smoothed RTT (tcpi_rtt, microseconds; `ss`: "rtt:74.3/2.1" in ms)


NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_REQ_BYTECODE, INET_DIAG_INFO = 1, 2
INET_DIAG_BC_JMP, INET_DIAG_BC_S_COND, INET_DIAG_BC_D_COND = 1, 7, 8
TCP_ESTABLISHED, TCP_LISTEN = 1, 10
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_INET_DIAG_MSG_SIZE = 72  # family, state, timer, retrans, the 48-byte socket id, five u32s
_DST = 24  # the socket id's destination address in inet_diag_msg (after 4 bytes, ports, 16 of source)
# tcp_info (linux/tcp.h): the offsets of tcpi_bytes_acked, tcpi_bytes_received, tcpi_bytes_sent,
# and of tcpi_busy_time, tcpi_rwnd_limited, tcpi_sndbuf_limited (u64 each; Linux 4.10 on); of tcpi_rtt (u32).
_ACKED, _RECEIVED, _SENT, _BUSY, _RTT = 120, 128, 200, 168, 68
_SEQUENCE = itertools.count(1)


def _request(address: str, port: int) -> bytes:
    """A dump of the established TCP sockets whose destination is address:port, with tcp_info."""
    ip = ipaddress.ip_address(address)
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    cond = struct.pack("=BBxxi", family, ip.max_prefixlen, port) + ip.packed
    return _dump_request(family, INET_DIAG_BC_D_COND, [cond], 1 << TCP_ESTABLISHED, 1 << (INET_DIAG_INFO - 1))


def _dump_request(family: int, op: int | None, conds: list[bytes], states: int, extensions: int) -> bytes:
    """A dump of `family`'s TCP sockets in `states` (a bit per TCP state), filtered by the kernel
    on any of `conds`, or unfiltered (`op` None). The bytecode is `ss`'s for "a or b or ...": `op`
    on each condition, whose match goes on to a jump to the end (accepted) and whose miss skips that
    jump to the next condition; past the last one, out of the program, is rejected (a match's step
    is one byte long in inet_diag_bc_op, so the long jumps are the misses')."""
    attribute = b""
    if op is not None:
        ops = [struct.pack("=BBH", op, 4 + len(c), 4 + len(c) + 4) + c for c in conds]
        bytecode = ops[-1]
        for cond in reversed(ops[:-1]):
            bytecode = cond + struct.pack("=BBH", INET_DIAG_BC_JMP, 4, 4 + len(bytecode)) + bytecode
        attribute = struct.pack("=HH", 4 + len(bytecode), INET_DIAG_REQ_BYTECODE) + bytecode
    # inet_diag_req_v2: family, protocol, extensions (a bit per attribute, from 1), pad, states, socket id.
    request = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, extensions, states)
    request += bytes(48) + attribute
    return (
        _HEADER.pack(_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, next(_SEQUENCE), 0)
        + request
    )


def _tcp_info(message: bytes) -> SocketBytes | None:
    """The counters from one inet_diag_msg's INET_DIAG_INFO attribute."""
    offset = _INET_DIAG_MSG_SIZE
    while offset + 4 <= len(message):
        length, kind = struct.unpack_from("=HH", message, offset)
        if length < 4:
            break
        if kind == INET_DIAG_INFO and length - 4 >= _SENT + 8:
            acked, received = struct.unpack_from("=QQ", message, offset + 4 + _ACKED)
            (sent,) = struct.unpack_from("=Q", message, offset + 4 + _SENT)
            busy, rwnd, sndbuf = struct.unpack_from("=QQQ", message, offset + 4 + _BUSY)
            (rtt,) = struct.unpack_from("=I", message, offset + 4 + _RTT)
            return SocketBytes(sent, acked, received, busy, rwnd, sndbuf, rtt)
        offset += (length + 3) & ~3
    return None


def tcp_sockets(address: str, port: int) -> list[SocketBytes]:
    """The counters of this network namespace's established TCP sockets to address:port.
    OSError where the kernel refuses the request (then read `ss`: parse_ss)."""
    return [info for info in map(_tcp_info, dump(_request(address, port))) if info is not None]


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def remotes_on_port(port: int, states: int) -> list[Address]:
    """The remote addresses of this network namespace's TCP sockets on local `port` in `states`
    (a bit per TCP state: 1 << TCP_LISTEN, 1 << TCP_ESTABLISHED), an IPv4-mapped one as IPv4;
    OSError where the kernel refuses the request."""
    cond = struct.pack("=BBxxi", socket.AF_UNSPEC, 0, port)  # any address, this port
    found: list[Address] = []
    for family, size in ((socket.AF_INET, 4), (socket.AF_INET6, 16)):
        for message in dump(_dump_request(family, INET_DIAG_BC_S_COND, [cond], states, 0)):
            ip = ipaddress.ip_address(message[_DST : _DST + size])
            found.append(ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip)
    return found


def dump(request: bytes) -> list[bytes]:
    """Every inet_diag_msg (with its attributes) the kernel answers a sock_diag dump request with.
    OSError where the kernel refuses it."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(1.0)
        sock.send(request)
        found: list[bytes] = []
        while True:
            data = sock.recv(65536)  # a dump datagram is at most 32 KiB (netlink_dump); a larger buffer only costs
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
                if length < _HEADER.size:
                    raise OSError(errno.EPROTO, f"sock_diag: a message of {length} bytes")
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    (error,) = struct.unpack_from("=i", data, offset + _HEADER.size)
                    raise OSError(-error, f"sock_diag: {errno.errorcode.get(-error, '')} {os.strerror(-error)}")
                found.append(data[offset + _HEADER.size : offset + length])
                offset += (length + 3) & ~3


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# A filter's bytecode is one netlink attribute (at most 65,535 bytes; a jump's length is 16 bits):
# 3,200 IPv4 conditions or 2,000 IPv6 ones. Past that the dump is unfiltered: the reader's own
# classification still applies.
_FILTER_BYTES = 64_000


def established_request(family: int, destinations: list[Network] | None = None) -> bytes:
    """A dump of one address family's established TCP sockets with tcp_info: every one, or where
    `destinations` is given, those whose remote address is in one of them, chosen by the kernel (an
    IPv4 network also matches its IPv4-mapped IPv6 sockets), so that a host's thousands of other
    sockets are neither copied nor parsed."""
    if destinations == []:
        raise ValueError("no destination to filter on: nothing to dump")
    states, extensions = 1 << TCP_ESTABLISHED, 1 << (INET_DIAG_INFO - 1)
    conds = [struct.pack("=BBxxi", *_family(n), -1) + n.network_address.packed for n in destinations or ()]
    if destinations is None or sum(8 + len(c) for c in conds) > _FILTER_BYTES:
        return _dump_request(family, None, [], states, extensions)
    return _dump_request(family, INET_DIAG_BC_D_COND, conds, states, extensions)


def _family(network: Network) -> tuple[int, int]:
    return (socket.AF_INET if network.version == 4 else socket.AF_INET6), network.prefixlen


# `ss -tinH` prints each socket's TCP info on one line: "... bytes_sent:130 bytes_acked:123 bytes_received:45 ...
# busy:1200ms rwnd_limited:800ms(66.7%) sndbuf_limited:100ms(8.3%)" (the times in whole milliseconds)
# and "rtt:74.301/2.15" (smoothed RTT / its variation, in milliseconds).
_SS_FIELD = {
    name: re.compile(rf"\b{name}:(\d+)")
    for name in ("bytes_sent", "bytes_acked", "bytes_received", "busy", "rwnd_limited", "sndbuf_limited")
}
_SS_RTT = re.compile(r"\brtt:([\d.]+)/")


def parse_ss(text: str) -> list[SocketBytes]:
    """The counters of each socket `ss -tinH` printed (a counter it does not show is 0)."""

    def field(line: str, name: str) -> int:
        m = _SS_FIELD[name].search(line)
        return int(m[1]) if m else 0

    def ms(line: str, name: str) -> int:
        return field(line, name) * 1000

    def rtt_us(line: str) -> int:
        m = _SS_RTT.search(line)
        return round(float(m[1]) * 1000) if m else 0

    return [
        SocketBytes(
            field(line, "bytes_sent"),
            field(line, "bytes_acked"),
            field(line, "bytes_received"),
            ms(line, "busy"),
            ms(line, "rwnd_limited"),
            ms(line, "sndbuf_limited"),
            rtt_us(line),
        )
        for line in text.splitlines()
        if "bytes_" in line
    ]
