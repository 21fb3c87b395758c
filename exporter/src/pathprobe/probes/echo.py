"""UDP echo prober: loss, duplicates, reordering, jitter and RTT from a low-rate stream
(wire format: wire.py).

A packet counts as lost only when no echo came within the timeout; an echo that
arrives after that counts as late, a second echo of the same packet as a duplicate,
an echo older than the newest one seen as reordered. A packet answered by an ICMP
error (port or host unreachable) counts as a failure with that reason, not as lost.

Packets go out over `flows` sockets in turn, each with its own source port, so that
they take every member path of an ECMP group; each flow's recent loss is kept apart
(FlowHealth), and a path with one failing flow shows as partially failed. The
responder's count of requests received on a flow splits its loss by direction: of the
first n packets of a flow (n: the newest one answered), n - received were lost on the
way there, received - answered (less those still in flight) on the way back.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from .. import stamps, wire
from ..config import LossSettings
from .base import BACKOFF_SECONDS, PACE_SECONDS, EchoSink, FlowHealth, OneWay, Pacer, Target, reason_of_oserror

# At most this often: the loss totals and the flows' health go to the sink (_account), and the held
# echoes are looked at for an overdue follow-up (_expire).
ACCOUNT_EVERY_SECONDS = 1.0
# The clock offset reported is that of the least-delayed of this many recent exchanges (as
# NTP's clock filter picks its sample): queueing on either way adds error to the others.
OFFSET_SAMPLES = 64
# Sends per flow whose transmit stamp is still awaited: the stamp comes within the send()
# itself or, behind a shaper's queue, within the packet's time in it.
STAMP_KEYS_KEPT = 64
# Jitter gain of RFC 3550 (interarrival jitter), applied to successive RTTs.
JITTER_GAIN = 1 / 16


class LeastDelayed:
    """The least-delayed of the last `size` exchanges (delay, offset): a monotonic queue, in which
    each exchange is pushed and popped once, instead of a scan of all of them at every echo."""

    def __init__(self, size: int) -> None:
        self.size, self.added = size, 0
        self.queue: deque[tuple[int, float, float]] = deque()  # (number, delay, offset), delays rising

    def add(self, delay: float, offset: float) -> tuple[float, float]:
        """Add an exchange; returns the least-delayed one's (delay, offset) of the window."""
        queue = self.queue
        while queue and queue[-1][1] >= delay:
            queue.pop()  # never the least delayed again: this one is newer and no slower
        queue.append((self.added, delay, offset))
        self.added += 1
        if queue[0][0] < self.added - self.size:
            queue.popleft()
        return queue[0][1], queue[0][2]


@dataclass(slots=True)
class _Sample:
    """An echo's figures, held until the flow's next answer follows it up (wire.ECHO_FOLLOW_UP)
    with how long the responder took from its clock read to its send: time that is not the network's."""

    seq: int
    arrived: float  # perf_counter
    rtt: float
    one_way: OneWay | None


class _Flow:
    """One source port's packets: counts for the per-direction split, and its health."""

    def __init__(self) -> None:
        self.sent = 0  # packets sent on this flow
        self.answered = 0  # of them, echoed (in time or late)
        self.newest = 0  # the highest flow index (1-based) echoed so far
        self.reflected = 0  # the responder's received count in that echo
        self.health = FlowHealth()
        self.stamps: stamps.AwaitedStamps[int] = stamps.AwaitedStamps(STAMP_KEYS_KEPT)  # seqs sent
        self.held: _Sample | None = None  # the last echo's, until the next answer follows it up


class EchoProber:
    def __init__(self, target: Target, settings: LossSettings, sink: EchoSink):
        self.target, self.settings, self.sink = target, settings, sink
        self._seq = 0
        # seq -> (send time, flow, the packet's 1-based index in its flow), in send order
        self._outstanding: OrderedDict[int, tuple[float, int, int]] = OrderedDict()
        self._flows = [_Flow() for _ in range(settings.flows)]
        self._index: dict[int, tuple[int, int]] = {}  # recent seq -> (flow, index), for late echoes
        self._by_direction = (0, 0)
        self._accounted = self._held_checked = -ACCOUNT_EVERY_SECONDS
        self._answered: OrderedDict[int, None] = OrderedDict()  # recent seqs, for duplicates
        self._expired: OrderedDict[int, None] = OrderedDict()  # recent lost seqs, for late echoes
        self._newest = -1
        self._last_rtt: float | None = None
        self._jitter = 0.0
        self._memory = max(1024, int(settings.rate_pps * settings.timeout_seconds * 4))
        self._offsets = LeastDelayed(OFFSET_SAMPLES)
        self._offset: float | None = None  # the clock offset the sink was last told
        self._marks: tuple[int, int, int | None] | None = None  # the marks it was last told (sent, forward, reverse)
        self._stamping = False  # whether the flows' sockets give transmit stamps
        self._sent_ns: dict[int, int] = {}  # seq -> the kernel's transmit stamp, of packets in flight
        # A held echo whose follow-up has not come by then (the flow's next answer lost) counts as it is.
        self._follow_up_wait = settings.timeout_seconds + 2 * settings.flows / settings.rate_pps

    # --- receiving
    def _take_sent_stamps(self, sock: socket.socket, flow: int, most: int = 256) -> None:
        """A flow's transmit stamps (up to `most`), each to the packet in flight it stamps."""
        if self._stamping:
            awaited = self._flows[flow].stamps
            for key, when in stamps.sent_times(sock, most):
                seq = awaited.stamped(key)
                if seq is not None and seq in self._outstanding:
                    self._sent_ns[seq] = when

    def _read(self, sock: socket.socket, flow: int) -> None:
        """One datagram a call, on the pacer's grid (Pacer.read_on_grid): a flow's socket rarely holds
        two (the pacer reads it again if so), and a read that finds it empty costs a system call and
        an exception. The arrival is the kernel's stamp, not this read's time."""
        if self._flows[flow].stamps:  # a stamp not taken at its send: first, as an echo read below may answer it
            self._take_sent_stamps(sock, flow)
        try:
            data, ancdata, _, addr = sock.recvmsg(2048, stamps.CMSG_SPACE + socket.CMSG_SPACE(4))
        except (BlockingIOError, InterruptedError):
            self._take_sent_stamps(sock, flow)  # woken by the error queue alone (a stamp nobody awaits)
            return
        except OSError as exc:  # an ICMP error on a flow's socket: it answers that flow's oldest packet
            oldest = next((seq for seq, (_, f, _) in self._outstanding.items() if f == flow), None)
            if oldest is not None:
                del self._outstanding[oldest]
                self._sent_ns.pop(oldest, None)
            self.sink.failure(reason_of_oserror(exc))
            return
        self.datagram_received(data, addr, stamps.kernel_time(ancdata), wire.received_tos(ancdata))

    def datagram_received(self, data: bytes, addr: tuple[str, int], arrived_ns: int | None = None,
                          tos: int | None = None) -> None:  # fmt: skip
        now = time.perf_counter()
        arrived_ns = arrived_ns or time.time_ns()
        if data[:4] == wire.ECHO_REFUSED and len(data) >= wire.ECHO_REFUSAL.size:
            _, seq = wire.ECHO_REFUSAL.unpack_from(data)
            if self._outstanding.pop(seq, None) is not None:
                self.sink.failure("not_allowed")
            return
        if data[:4] != wire.ECHO_MAGIC or len(data) < wire.ECHO_HEADER.size:
            return
        _, seq, read_sent_ns, hold_ns, reflected = wire.ECHO_HEADER.unpack_from(data)
        outstanding = self._outstanding.pop(seq, None)
        kernel_sent_ns = self._sent_ns.pop(seq, None)
        sent_ns = stamps.sent_time(read_sent_ns, kernel_sent_ns, arrived_ns)
        if outstanding is None:
            if seq in self._answered:
                self.sink.duplicate()
            elif seq in self._expired:
                self.sink.late()
                if seq in self._index:
                    self._echoed(*self._index[seq], reflected)
            return
        sent_at, flow, index = outstanding
        f = self._flows[flow]
        f.health.record(lost=False)
        self._echoed(flow, index, reflected)
        if seq < self._newest:
            self.sink.reordered()
        self._newest = max(self._newest, seq)
        self._remember(self._answered, seq)
        rtt = stamps.network_rtt(sent_ns, arrived_ns, now - sent_at, hold_ns)
        on_clock = (read_sent_ns, stamps.arrival_on_clock(read_sent_ns, kernel_sent_ns, arrived_ns, now - sent_at))
        sample = _Sample(seq, now, rtt, self._clocks(sent_ns, arrived_ns, hold_ns, data, on_clock))
        if len(data) >= wire.ECHO_MARK_OFFSET + wire.ECHO_MARK.size:
            read, forward = wire.ECHO_MARK.unpack_from(data, wire.ECHO_MARK_OFFSET)
            if read:
                marks = (self.settings.dscp, forward >> 2, None if tos is None else tos >> 2)
                if marks != self._marks or marks[1] != marks[0] or marks[2] not in (None, marks[1]):
                    self._marks = marks  # the sink counts changed marks: told of each, and of any other news
                    self.sink.marks(*marks)
        self._follow_up(f, sample, data)

    def _follow_up(self, f: _Flow, sample: _Sample, echo: bytes) -> None:
        """The flow's held echo, less the stretch this echo's follow-up gives it (as it is without
        one: an older responder); this echo held in turn, for the flow's next answer, when it has
        room for a follow-up, else observed now."""
        if len(echo) < wire.ECHO_FOLLOW_UP_OFFSET + wire.ECHO_FOLLOW_UP.size:
            self._observe(sample, 0.0)
            return
        previous, stretch = wire.ECHO_FOLLOW_UP.unpack_from(echo, wire.ECHO_FOLLOW_UP_OFFSET)  # + 1 each (0: none)
        if f.held is not None:
            followed_up = stretch and f.held.seq == previous - 1
            self._observe(f.held, (stretch - 1) / 1e9 if followed_up else 0.0)
        f.held = sample

    def _observe(self, sample: _Sample, stretch: float) -> None:
        """An echo's RTT and one-way delays to the sink, less its answer's `stretch` (seconds from
        the responder's clock read to its send, where a follow-up said it)."""
        rtt = max(0.0, sample.rtt - stretch)
        jitter = None
        if self._last_rtt is not None:
            jitter = self._jitter = self._jitter + (abs(rtt - self._last_rtt) - self._jitter) * JITTER_GAIN
        self._last_rtt = rtt
        one_way = sample.one_way
        if one_way is not None and stretch:
            one_way = one_way._replace(reverse=one_way.reverse - stretch)
        self.sink.received(rtt, time.perf_counter() - sample.arrived, jitter, one_way)

    def _release_held(self, now: float, everything: bool = False) -> None:
        """Held echoes whose follow-up is overdue, as they are (all of them: `everything`)."""
        for f in self._flows:
            if f.held is not None and (everything or now - f.held.arrived > self._follow_up_wait):
                self._observe(f.held, 0.0)
                f.held = None

    def _clocks(self, sent_ns: int, arrived_ns: int, hold_ns: int, echo: bytes, on_clock: tuple[int, int]
                ) -> OneWay | None:  # fmt: skip
        """From an echo's stamps, when its responder stamps (wire.py): the peer's clock offset (to
        the sink now), and each direction's delay (returned, with the peer's bound and how far apart
        the clocks are at least): out, to the request's arrival there (its answer's stamp less the
        hold, which starts at the kernel's arrival stamp); back, from the answer's stamp. This
        host's send and arrival stamps are the kernel's where the sockets give them; `on_clock`: the
        send and the arrival on the clock this process reads, for the offset."""
        if len(echo) < wire.ECHO_CLOCKS_OFFSET + wire.ECHO_CLOCKS.size:
            return None
        took_ns, answered_ns = wire.ECHO_CLOCKS.unpack_from(echo, wire.ECHO_CLOCKS_OFFSET)
        if took_ns == 0:
            return None
        # The offset as NTP's on-wire method takes it, on the clock each end's process reads (the
        # responder's reads; here, the send's and the arrival on it: stamps.arrival_on_clock, so that
        # the wait for the pacer's pass to read it is not in the exchange).
        sent_on_clock, back_on_clock = on_clock
        offset, delay = stamps.clock_offset(sent_on_clock, took_ns, answered_ns, back_on_clock)
        best_delay, best_offset = self._offsets.add(delay, offset)
        if best_offset != self._offset:
            self._offset = best_offset
            self.sink.clock_offset(best_offset)
        peer_bound = None
        if len(echo) >= wire.ECHO_BOUND_OFFSET + wire.ECHO_BOUND.size:
            (bound_ns,) = wire.ECHO_BOUND.unpack_from(echo, wire.ECHO_BOUND_OFFSET)
            peer_bound = bound_ns / 1e9 if bound_ns else None
        # The offset's own error is at most half its exchange's delay: beyond that, the clocks are apart.
        clocks_apart = max(0.0, abs(best_offset) - best_delay / 2)
        forward, reverse = (answered_ns - hold_ns - sent_ns) / 1e9, (arrived_ns - answered_ns) / 1e9
        return OneWay(forward, reverse, peer_bound, clocks_apart)

    def _echoed(self, flow: int, index: int, reflected: int) -> None:
        f = self._flows[flow]
        f.answered += 1
        if reflected and index > f.newest:  # zero: a responder that does not count
            f.newest, f.reflected = index, reflected
        self._account()

    def _account(self, force: bool = False) -> None:
        """Lost packets by direction and the flows' health, to the sink (totals: the split
        of a packet is known only once a later echo on its flow reports the responder's count).
        At most once a second: it walks the packets in flight."""
        now = time.perf_counter()
        if not force and now - self._accounted < ACCOUNT_EVERY_SECONDS:
            return
        self._accounted = now
        forward = reverse = 0
        for i, f in enumerate(self._flows):
            if not f.newest:
                continue
            in_flight = sum(1 for _, flow, n in self._outstanding.values() if flow == i and n < f.newest)
            forward += max(0, f.newest - f.reflected)
            reverse += max(0, f.reflected - f.answered - in_flight)
        # Never backwards (a packet reordered past a later one can lower the estimate by one).
        self._by_direction = (max(forward, self._by_direction[0]), max(reverse, self._by_direction[1]))
        self.sink.lost_by_direction(*self._by_direction)
        self.sink.flows_failing(
            sum(f.health.failing() for f in self._flows), max(f.health.loss_ratio() for f in self._flows)
        )

    # --- sending and expiry
    def _remember(self, table: OrderedDict[int, None], seq: int) -> None:
        table[seq] = None
        while len(table) > self._memory:
            table.popitem(last=False)

    def _expire(self, now: float, everything: bool = False) -> None:
        # A held echo waits seconds for its follow-up: a look a second, not one at every send.
        if everything or now - self._held_checked >= ACCOUNT_EVERY_SECONDS:
            self._held_checked = now
            self._release_held(now, everything)
        expired = False
        while self._outstanding:
            seq, (sent_at, flow, _) = next(iter(self._outstanding.items()))
            if not everything and now - sent_at < self.settings.timeout_seconds:
                break
            del self._outstanding[seq]
            self._sent_ns.pop(seq, None)
            self._remember(self._expired, seq)
            self._flows[flow].health.record(lost=True)
            self.sink.lost(now - sent_at)
            expired = True
        if expired:
            self._account(force=everything)

    def track(self, seq: int, now: float) -> int:
        """Note packet `seq` as sent at `now` (perf_counter); returns its flow."""
        flow = seq % len(self._flows)
        f = self._flows[flow]
        f.sent += 1
        self._outstanding[seq] = (now, flow, f.sent)
        self._index[seq] = (flow, f.sent)
        self._index.pop(seq - self._memory, None)
        return flow

    def _open(self) -> list[socket.socket] | None:
        """One connected socket per flow (the kernel gives each its own source port)."""
        t = self.target
        socks: list[socket.socket] = []
        try:
            for _ in range(self.settings.flows):
                sock = wire.probe_socket(t.address, socket.SOCK_DGRAM, t.source)
                socks.append(sock)
                wire.mark(sock, t.address, self.settings.dscp)
                wire.receive_tos(sock, t.address)
                stamps.enable(sock)
                self._stamping = stamps.enable_sent(sock)
                sock.connect((t.address, t.port))
        except OSError as exc:
            for sock in socks:
                sock.close()
            self.sink.failure(reason_of_oserror(exc))
            return None
        return socks

    def _send(self, socks: list[socket.socket]) -> None:
        """The next packet, on the next flow in turn; what timed out first expires."""
        now = time.perf_counter()
        self._expire(now)
        flow = self.track(self._seq, now)
        size = self.settings.size_bytes
        try:
            socks[flow].send(wire.echo_packet(self._seq, size, time.time_ns()))
            self._flows[flow].stamps.sent(self._seq)  # a stamp that does not fit: sent_time
            # Stamped within send() unless queued: taken now, it wakes no one (wire.Connection.write);
            # one read, not one more to find the queue empty.
            self._take_sent_stamps(socks[flow], flow, most=1)
        except BlockingIOError:
            pass  # a full send buffer drops the packet: it counts as lost
        except OSError as exc:
            self._outstanding.pop(self._seq, None)
            self.sink.failure(reason_of_oserror(exc))
        self.sink.sent(size)
        self._seq += 1

    async def run(self, count: int | None = None) -> None:
        """Send `count` packets (forever when None) at the configured rate. Never raises:
        a socket that cannot be opened (e.g. no route yet) is reported, then retried
        after a back-off; a one-shot run (`count`) then ends."""
        loop = asyncio.get_running_loop()
        pacer = Pacer.of(loop)
        while (socks := self._open()) is None:
            if count is not None:
                return
            await asyncio.sleep(BACKOFF_SECONDS)
        for flow, sock in enumerate(socks):
            pacer.read_on_grid(sock, functools.partial(self._read, sock, flow))
        try:
            await pacer.repeat(1 / self.settings.rate_pps, functools.partial(self._send, socks), count)
            # One-shot: wait for the last echoes (no sends now: read here), then count what is missing as lost.
            deadline = loop.time() + self.settings.timeout_seconds
            while self._outstanding and loop.time() < deadline:
                await asyncio.sleep(min(PACE_SECONDS, self.settings.timeout_seconds))
                pacer.read_ready()
            self._expire(time.perf_counter(), everything=True)
        finally:
            for sock in socks:
                pacer.stop_reading(sock)
                sock.close()
