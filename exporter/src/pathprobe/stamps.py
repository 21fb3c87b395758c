"""Kernel timestamps, and the network's part of a round trip.

Both probes take the RTT as TWAMP/STAMP reflectors make it: from the kernel's transmit
timestamp of the request to the kernel's receive timestamp of the answer, less how long the
responder held the request (which it reports). Waking a Python process takes 0.1-0.3 ms on
a VM, twice per exchange; without this every RTT would include them. The transmit stamp
matters too: on a busy 2-core lab host the time from the clock read before send() to the
kernel's transmit stamp was 12-15 us at p50 but 50-70 us at p99 (0.4-0.6 ms with the host's
own test queued ahead), a third of the tail allowed on a 0.5 ms path. Where the kernel gives
no stamp, that clock read stands in.
"""

from __future__ import annotations

import socket
import struct
from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")

SO_TIMESTAMPNS = 35  # Linux (x86, arm); the socket module does not name these
TIMESPEC = struct.Struct("=qq")
# Transmit timestamps (Documentation/networking/timestamping.rst): the software stamp taken as
# the packet is handed to the device, returned on the socket's error queue with only a key:
# datagrams count from 0 per socket, streams by the offset of a send's last byte.
SO_TIMESTAMPING = 37
TX_FLAGS = (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)  # TX_SOFTWARE | SOFTWARE | OPT_ID | OPT_TSONLY
TIMESTAMPING = struct.Struct("=qqqqqq")  # software, (deprecated), hardware
EXTENDED_ERR = struct.Struct("=IBBBBII")  # errno, origin, type, code, pad, info, data (the key)
ORIGIN_TIMESTAMPING = 4
RECVERR = {(socket.IPPROTO_IP, 11), (socket.IPPROTO_IPV6, 25)}  # IP_RECVERR, IPV6_RECVERR
# Room for a receive's stamps: SO_TIMESTAMPNS's, and SCM_TIMESTAMPING's on a socket with transmit stamps.
CMSG_SPACE = socket.CMSG_SPACE(TIMESPEC.size) + socket.CMSG_SPACE(TIMESTAMPING.size)
ERRQUEUE_CMSG_SPACE = socket.CMSG_SPACE(TIMESTAMPING.size) + socket.CMSG_SPACE(EXTENDED_ERR.size + 28)


def enable(sock: socket.socket) -> None:
    """Ask for a receive timestamp (CLOCK_REALTIME, ns) with every read."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def enable_sent(sock: socket.socket, restart: bool = False) -> bool:
    """Ask for a transmit timestamp of every send (read them with sent_times()); False where
    the kernel refuses (the caller keeps its own clock reads). `restart`: count the keys from 0
    again (the kernel resets the count when the option is enabled after being disabled)."""
    try:
        if restart:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, 0)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_FLAGS)
    except OSError:
        return False
    return True


def sent_times(sock: socket.socket, most: int = 256) -> list[tuple[int, int]]:
    """(key, transmit time in ns) of the transmit stamps waiting on `sock`'s error queue, up to
    `most` of them: while it holds any, the socket polls as readable (EPOLLERR)."""
    found = []
    for _ in range(most):
        try:
            _, ancdata, _, _ = sock.recvmsg(1, ERRQUEUE_CMSG_SPACE, socket.MSG_ERRQUEUE)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:  # an error queued by something other than a stamp: nothing more to read
            break
        when = key = None
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= TIMESTAMPING.size:
                sec, nsec = TIMESTAMPING.unpack_from(data)[:2]
                when = sec * 1_000_000_000 + nsec
            elif (level, kind) in RECVERR and len(data) >= EXTENDED_ERR.size:
                _, origin, _, _, _, _, data_key = EXTENDED_ERR.unpack_from(data)
                if origin == ORIGIN_TIMESTAMPING:
                    key = data_key
        if when and key is not None:
            found.append((key, when))
    return found


class AwaitedStamps(Generic[T]):
    """A datagram socket's sends whose transmit stamp is awaited, by the key the stamp will carry
    (the socket's sends counted from 0): the newest `kept` of them. A send refused for a full
    buffer may still use a key; the sends after it then get stamps that do not fit (their
    callers check the time)."""

    def __init__(self, kept: int) -> None:
        self.kept, self._sends = kept, 0
        self._by_key: OrderedDict[int, T] = OrderedDict()

    def sent(self, item: T | None) -> None:
        """A send done: `item` awaits its stamp (None: a send whose stamp nobody needs)."""
        if item is not None:
            self._by_key[self._sends % 2**32] = item
            if len(self._by_key) > self.kept:
                self._by_key.popitem(last=False)
        self._sends += 1

    def __len__(self) -> int:
        """Sends whose stamp is still awaited."""
        return len(self._by_key)

    def stamped(self, key: int) -> T | None:
        """The item whose send the stamp with `key` is of, if it is still awaited."""
        return self._by_key.pop(key, None)

    def restart(self) -> None:
        """Keys counted from 0 again (enable_sent(restart=True))."""
        self._by_key.clear()
        self._sends = 0


def sent_time(read_ns: int, kernel_ns: int | None, arrived_ns: int) -> int:
    """A request's send time: the kernel's transmit stamp when there is one that fits between
    the clock read before send() and the answer (a stamp matched to the wrong send cannot),
    else that clock read."""
    return kernel_ns if kernel_ns is not None and read_ns <= kernel_ns <= arrived_ns else read_ns


def arrival_on_clock(read_ns: int, kernel_ns: int | None, arrived_ns: int, elapsed: float, now_ns: int) -> int:
    """An answer's arrival on this process's clock, for a clock offset (which compares the clocks
    processes read: a skewed one, as the lab's libfaketime makes, moves those reads, not the kernel's
    stamps): the clock read before its send plus the round trip between the kernel's transmit and
    receive stamps, when those fit within `elapsed` (the monotonic seconds since the send, the wait
    to read the answer included: a stamp of another send cannot); else `now_ns`, the clock read
    with the monotonic one that `elapsed` ends at (late by that wait). Read later, a preemption
    between the two reads would make the exchange's delay exceed `elapsed` and the echo's clocks
    be refused as impossible."""
    if kernel_ns is not None and 0 < arrived_ns - kernel_ns <= elapsed * 1e9:
        return read_ns + (arrived_ns - kernel_ns)
    return now_ns


def kernel_time(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The receive timestamp in a recvmsg()'s ancillary data, in ns, if there is one."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            sec, nsec = TIMESPEC.unpack_from(data)
            return int(sec * 1_000_000_000 + nsec)
    return None


def clock_offset(sent_ns: int, took_ns: int, answered_ns: int, back_ns: int) -> tuple[float, float]:
    """(the peer's clock minus this host's, the exchange's network delay), in seconds, from one
    exchange's four wall-clock stamps: sent here, taken and answered there, back here (NTP's
    on-wire method, RFC 5905 section 8). The offset is exact when both ways take as long; its
    error is at most half the delay, so the exchange with the least delay is the one to trust."""
    offset = ((took_ns - sent_ns) + (answered_ns - back_ns)) / 2e9
    delay = ((back_ns - sent_ns) - (answered_ns - took_ns)) / 1e9
    return offset, delay


def network_rtt(sent_ns: int, arrived_ns: int, elapsed: float, hold_ns: int) -> float | None:
    """Seconds on the network: wall-clock stamps, less the responder's hold; None where the hold
    the responder reports is not possible (at or beyond the whole round trip: the sample is not
    one, whatever sent it: an older or broken responder, a middlebox that rewrote the bytes).

    A wall-clock step between the two stamps shows as a time outside (0, elapsed],
    where `elapsed` is the monotonic interval (wake-up included); that is then used.
    """
    wire = (arrived_ns - sent_ns) / 1e9
    if not 0 < wire <= elapsed:
        wire = elapsed
    hold = hold_ns / 1e9
    return wire - hold if 0 <= hold < wire else None
