"""The Python delay line: the reference that bench/lab_fidelity.py measures the lab's compiled
one (lab/delayline/delayline.c) against; the lab runs it only with PATHPROBE_LAB_DELAY_LINE=python.
Under the demo's load it costs 25-35% of a core and its service time shows as RTT on idle paths,
which is why the lab no longer runs it.

iptables sends each delayed path's packets to its own queue; this process holds
every packet for the queue's one-way delay and then accepts it. It speaks the
nfnetlink_queue protocol directly (no Python netfilter-queue library sets F_GSO):
- copy mode META: payloads never come to userspace, only ids;
- F_GSO: GSO super-packets are queued whole (far fewer packets);
- one batch verdict per queue per wake-up accepts every due packet at once,
  which is correct because all packets of a queue have the same delay (FIFO);
- a large receive buffer and NETLINK_NO_ENOBUFS;
- each packet's hold runs from the kernel's receive timestamp (NFQA_TIMESTAMP), so
  this process's own wake-up latency is not added to the path's delay.
One process serves all queues of the lab over one socket.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys
import time

from pathprobe import stamps

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_TIMESTAMP = 4
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NF_ACCEPT = 1
PR_SET_TIMERSLACK = 29
SPIN_SECONDS = 0.0003
# SCHED_FIFO 10: above every ordinary process (the exporters, iperf3, ksoftirqd), below the
# kernel's real-time threads; its RT throttling (sched_rt_runtime_us) keeps 5% of a core for the rest.
REALTIME_PRIORITY = 10
MAX_CATCH_UP = 0.005  # a larger gap is a clock step, not a late wake-up

NLMSGHDR = struct.Struct("=IHHII")
NFGENMSG = struct.Struct("=BBH")  # family, version, res_id (big-endian, packed by hand)
NLATTR = struct.Struct("=HH")
TIMESTAMP = struct.Struct("!QQ")  # seconds, microseconds (CLOCK_REALTIME)


def _attr(kind: int, payload: bytes) -> bytes:
    body = NLATTR.pack(NLATTR.size + len(payload), kind) + payload
    return body + b"\0" * (-len(body) % 4)


def _msg(msg_type: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = NFGENMSG.pack(socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0) + body


def _clocks() -> tuple[float, float]:
    """The real-time and the monotonic clock, after the messages they date were read, the real one
    first: a pause between the reads makes a hold end late by it, never early (as delayline.c)."""
    real = time.time()
    return real, time.monotonic()


class DelayLine:
    def __init__(self, delays: dict[int, float], maxlen: int = 65536):
        self.delays = delays
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 * 2**20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        # The kernel stamps packets on receive only while some socket asks for stamps
        # (a global switch); hold one open so that every queued packet has NFQA_TIMESTAMP.
        self._stamps_on = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        stamps.enable(self._stamps_on)
        self.held: dict[int, collections.deque[tuple[float, int]]] = {q: collections.deque() for q in delays}
        for seq, queue in enumerate(delays, start=1):
            self._configure(queue, maxlen, seq)

    def _configure(self, queue: int, maxlen: int, seq: int) -> None:
        attrs = (
            _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))
            + _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
            + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
            + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO))
            + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
        )
        self.sock.send(_msg(NFQNL_MSG_CONFIG, queue, attrs, NLM_F_REQUEST | NLM_F_ACK, seq))
        while True:  # wait for this request's ack; packets may already be arriving
            data = self.sock.recv(65536)
            real, now = _clocks()
            for msg_type, mseq, payload in _messages(data):
                if msg_type == NLMSG_ERROR and mseq == seq:
                    err = -struct.unpack_from("=i", payload)[0]
                    if err:
                        raise OSError(err, f"binding NFQUEUE {queue}: {os.strerror(err)}")
                    return
                self._on_message(msg_type, payload, now, real)

    def _on_message(self, msg_type: int, payload: bytes, now: float, real: float) -> None:
        if msg_type != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            return
        queue = socket.ntohs(NFGENMSG.unpack_from(payload)[2])
        held = self.held.get(queue)
        packet_id = None
        waited = 0.0
        pos = NFGENMSG.size
        while pos + NLATTR.size <= len(payload):
            length, kind = NLATTR.unpack_from(payload, pos)
            if length < NLATTR.size:
                break
            if kind & 0x7FFF == NFQA_PACKET_HDR:
                packet_id = struct.unpack_from("!I", payload, pos + NLATTR.size)[0]
            elif kind & 0x7FFF == NFQA_TIMESTAMP:
                sec, usec = TIMESTAMP.unpack_from(payload, pos + NLATTR.size)
                waited = real - sec - usec / 1e6
            pos += (length + 3) & ~3
        if held is not None and packet_id is not None:
            # The packet's delay runs from when the kernel queued it, not from when this
            # process woke up to read it (a wake-up takes 0.05-0.2 ms on a VM).
            held.append((now + self.delays[queue] - min(max(waited, 0.0), MAX_CATCH_UP), packet_id))

    def _release(self, now: float) -> float | None:
        """Accept every due packet; return the time until the next one is due."""
        wait: float | None = None
        for queue, held in self.held.items():
            last = None
            while held and held[0][0] <= now:
                last = held.popleft()[1]
            if last is not None:
                self.sock.send(
                    _msg(NFQNL_MSG_VERDICT_BATCH, queue, _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, last)))
                )
            if held:
                due = held[0][0] - now
                wait = due if wait is None else min(wait, due)
        return wait

    def run(self) -> None:
        self.sock.setblocking(False)
        wait: float | None = None
        while True:
            # Timer wake-ups come late by a few hundred microseconds on a VM, so sleep until
            # SPIN_SECONDS before the next release and poll from there. select() takes
            # microseconds; poll()/epoll round up to whole milliseconds.
            timeout = None if wait is None else max(0.0, wait - SPIN_SECONDS) if wait > SPIN_SECONDS else 0.0
            readable, _, _ = select.select([self.sock], [], [], timeout)
            if readable:
                while True:
                    try:
                        data = self.sock.recv(2**20)
                    except BlockingIOError:
                        break
                    real, now = _clocks()
                    for msg_type, _, payload in _messages(data):
                        self._on_message(msg_type, payload, now, real)
            wait = self._release(time.monotonic())


def _messages(data: bytes) -> list[tuple[int, int, bytes]]:
    out = []
    pos = 0
    while pos + NLMSGHDR.size <= len(data):
        length, msg_type, _, seq, _ = NLMSGHDR.unpack_from(data, pos)
        if length < NLMSGHDR.size:
            break
        out.append((msg_type, seq, data[pos + NLMSGHDR.size : pos + length]))
        pos += (length + 3) & ~3
    return out


def _tighten_timers() -> None:
    """Wake-ups are the delay's error: ask for 1 ns timer slack instead of the default 50 us,
    and for a real-time priority, so that the lab's exporters, iperf3 and Prometheus on the
    same cores do not delay a release. Measured with ping over the lab's 0.5 ms path while
    the demo ran (idle half-slots only): p99/p50 1.52 without it, 1.08-1.10 with it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    except OSError as exc:  # not root, or RT time not granted (a container): the delay is less precise
        print(f"delay line: no real-time priority ({exc}); releases may be late under load", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="NFQUEUE delay line (run inside the lab's router namespace)")
    parser.add_argument("--queues", required=True, help='JSON object {"queue number": one-way delay seconds}')
    args = parser.parse_args(argv)
    delays = {int(q): float(d) for q, d in json.loads(args.queues).items()}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _tighten_timers()
    line = DelayLine(delays)
    print("ready", flush=True)  # `lab up` waits for this line
    line.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
