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
import statistics
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from .. import stamps, wire
from ..probe_settings import EchoSettings
from .base import BACKOFF_SECONDS, Reason, Rejection, Target, reason_of_oserror
from .flows import FlowHealth
from .pacer import PACE_SECONDS, Pacer
from .recent import ANSWERED, EXPIRED, Recent

# At most this often: the loss totals and the flows' health go to the sink (_account), and the held
# echoes are looked at for an overdue follow-up (_expire).
ACCOUNT_EVERY_SECONDS = 1.0
# The clock offset reported: the median offset of the OFFSET_QUORUM least-delayed of the last
# OFFSET_SAMPLES exchanges. Queueing on either way adds error to an exchange's offset (its error is at
# most half its delay), so the least-delayed are the ones to trust, as NTP's clock filter takes them
# (RFC 5905 section 10); the median of several keeps one corrupt answer among them (a clock centuries
# ahead with a plausible delay) from setting the offset, as one sample alone would.
OFFSET_SAMPLES, OFFSET_QUORUM = 64, 8
# A responder's clock a day or more from this host's is not one its stamps can be taken from.
PLAUSIBLE_OFFSET_SECONDS = 86400.0
# An exchange's on-wire delay may exceed what this host measured of it by a clock read's jitter.
DELAY_SLACK_SECONDS = 0.001
# A stated clock error bound beyond this is not one (the config's own bound is at most 10 s).
PLAUSIBLE_BOUND_SECONDS = 10.0
# A flow's received count may fall behind an earlier answer's by reordering on the way there; by
# more than this, the responder's count started again (a restart) or is broken.
COUNT_REORDER_SLACK = 64
# Sends per flow whose transmit stamp is still awaited: the stamp comes within the send()
# itself or, behind a shaper's queue, within the packet's time in it.
STAMP_KEYS_KEPT = 64
# Jitter gain of RFC 3550 (interarrival jitter), applied to successive RTTs.
JITTER_GAIN = 1 / 16


class OneWay(NamedTuple):
    """One echo's one-way delays (each off by the clocks' offset), the bound the peer's responder
    states, and how far apart the clocks are at least (the on-wire offset less its own error)."""

    forward: float
    reverse: float
    peer_bound: float | None
    clocks_apart: float


class EchoSink(Protocol):
    """Outcomes of the UDP echo prober, packet by packet."""

    def sent(self, size: int) -> None: ...
    # An answered echo, in one call (its figures are recorded under one load state): its RTT, the
    # RTT variation so far (None before a second answer), its one-way delays where the responder
    # stamps; age: seconds since it came back (a two-step responder's follow-up comes with the next answer).
    def received(
        self, rtt: float, age: float = 0.0, jitter: float | None = None, one_way: OneWay | None = None
    ) -> None: ...
    def lost(self, age: float) -> None: ...  # age: seconds since the packet was sent
    def duplicate(self) -> None: ...
    def reordered(self) -> None: ...
    def late(self) -> None: ...
    def failure(self, reason: Reason) -> None: ...
    # A field of an answer not taken (probes.base.REJECTIONS); `answered`: an echo that came back with
    # no figure that could be taken (it is no loss, and no sample).
    def rejected(self, reason: Rejection, answered: bool = False) -> None: ...
    def flows_failing(self, count: int, worst_loss_ratio: float) -> None: ...
    def lost_by_direction(self, forward: int, reverse: int) -> None: ...
    def clock_offset(self, seconds: float) -> None: ...  # the peer's clock minus this host's
    # What an echo's clock stamps say of the two clocks (its OneWay's bound and clocks_apart) where its
    # delays were not taken (a hold beyond the round trip): whether the peer's delays may be trusted.
    def clocks(self, peer_bound: float | None, clocks_apart: float) -> None: ...
    # The DSCP an echo was sent with, the one it reached the peer with, and the one the answer
    # (sent with that) came back with (None where this host's socket did not say).
    def marks(self, sent: int, forward: int, reverse: int | None) -> None: ...


class OffsetFilter:
    """The clock offset of the last `size` exchanges (delay, offset): the median offset of the
    `quorum` least-delayed, and the largest delay among those (the offset's error is at most half
    of it). Kept from one exchange to the next while the least-delayed stay the same (most
    exchanges are not among them, nor is the one they push out): worked out again, a sort of
    them all, only when they change, not at every echo."""

    def __init__(self, size: int = OFFSET_SAMPLES, quorum: int = OFFSET_QUORUM) -> None:
        self.quorum = quorum
        self.exchanges: deque[tuple[float, float]] = deque(maxlen=size)
        # (the estimate, the last of the least-delayed in sort order) while they are the same
        self._kept: tuple[tuple[float, float], tuple[float, float]] | None = None

    def add(self, delay: float, offset: float) -> None:
        exchange, kept = (delay, offset), self._kept
        full = len(self.exchanges) == self.exchanges.maxlen
        if kept is not None and not (exchange > kept[1] and (not full or self.exchanges[0] > kept[1])):
            self._kept = None  # it is among the least-delayed, or pushes one of them out
        self.exchanges.append(exchange)

    def estimate(self) -> tuple[float, float] | None:
        """(the offset, the largest delay of the exchanges it is the median of); None before any."""
        if self._kept is not None:
            return self._kept[0]
        if not self.exchanges:
            return None
        best = sorted(self.exchanges)[: self.quorum]
        offsets = sorted(offset for _, offset in best)
        estimate = statistics.median(offsets), best[-1][0]
        if len(best) == self.quorum:  # fewer: each new exchange is among them
            self._kept = (estimate, best[-1])
        return estimate


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
        # Its split by direction, once its responder's count is not to be believed: (forward, reverse)
        # as they stood then, no longer moved by its answers.
        self.withheld: tuple[int, int] | None = None

    def split(self, in_flight: int) -> tuple[int, int]:
        """Its packets lost on the way there and on the way back, as far as its answers tell."""
        if self.withheld is not None:
            return self.withheld
        if not self.newest:
            return 0, 0
        return max(0, self.newest - self.reflected), max(0, self.reflected - self.answered - in_flight)


class EchoProber:
    def __init__(self, target: Target, settings: EchoSettings, sink: EchoSink):
        self.target, self.settings, self.sink = target, settings, sink
        self._seq = 0
        # seq -> (send time, flow, the packet's 1-based index in its flow), in send order
        self._outstanding: OrderedDict[int, tuple[float, int, int]] = OrderedDict()
        self._flows = [_Flow() for _ in range(settings.flows)]
        self._by_direction = (0, 0)
        self._accounted = self._held_checked = -ACCOUNT_EVERY_SECONDS
        self._newest = -1
        self._last_rtt: float | None = None
        self._jitter = 0.0
        # The recent packets, for duplicates and late echoes (their flow's counts)
        self._recent = Recent(max(1024, int(settings.rate_pps * settings.timeout_seconds * 4)))
        self._offsets = OffsetFilter()
        self._offset: tuple[float, float] | None = None  # the filter's estimate the sink was last told
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

    def datagram_received(
        self, data: bytes, addr: tuple[str, int], arrived_ns: int | None = None, tos: int | None = None
    ) -> None:
        now, now_ns = time.perf_counter(), time.time_ns()  # together: see stamps.arrival_on_clock
        arrived_ns = arrived_ns or now_ns
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
            self._not_awaited(seq, reflected)
            return
        sent_at, flow, index = outstanding
        f = self._flows[flow]
        f.health.record(lost=False)
        if seq < self._newest:
            self.sink.reordered()
        self._newest = max(self._newest, seq)
        self._recent.mark(seq, ANSWERED)
        rtt = stamps.network_rtt(sent_ns, arrived_ns, now - sent_at, hold_ns)
        on_clock = (
            read_sent_ns,
            stamps.arrival_on_clock(read_sent_ns, kernel_sent_ns, arrived_ns, now - sent_at, now_ns),
        )
        one_way = self._clocks(sent_ns, arrived_ns, hold_ns, data, on_clock, now - sent_at)
        self._echoed(flow, index, reflected)  # after its clocks: the first echo's offset is told at once
        if rtt is None:
            # A hold beyond the round trip: no RTT and no one-way delay (both subtract it), though the
            # echo came (no loss) and its clock stamps, which the hold is not in, gave their offset
            # and say how far apart the clocks are.
            self.sink.rejected("hold_beyond_rtt", answered=True)
            if one_way is not None:
                self.sink.clocks(one_way.peer_bound, one_way.clocks_apart)
            return
        self._read_marks(data, tos)
        self._follow_up(f, _Sample(seq, now, rtt, one_way), data)

    def _not_awaited(self, seq: int, reflected: int) -> None:
        """An echo of a packet no longer in flight: a duplicate, or one that came after its timeout."""
        state = self._recent.state(seq)
        if state == ANSWERED:
            self.sink.duplicate()
        elif state == EXPIRED:
            self.sink.late()
            sent = self._recent.flow_index(seq)
            if sent is not None:
                self._echoed(*sent, reflected)

    def _read_marks(self, echo: bytes, tos: int | None) -> None:
        """The DSCP mark the echo reached the responder with (in it) and came back with (`tos`)."""
        if len(echo) < wire.ECHO_MARK_OFFSET + wire.ECHO_MARK.size:
            return
        read, forward = wire.ECHO_MARK.unpack_from(echo, wire.ECHO_MARK_OFFSET)
        if read:
            marks = (self.settings.dscp, forward >> 2, None if tos is None else tos >> 2)
            if marks != self._marks or marks[1] != marks[0] or marks[2] not in (None, marks[1]):
                self._marks = marks  # the sink counts changed marks: told of each, and of any other news
                self.sink.marks(*marks)

    def _follow_up(self, f: _Flow, sample: _Sample, echo: bytes) -> None:
        """The flow's held echo, less the stretch this echo's follow-up gives it (as it is without
        one: an older responder); this echo held in turn, for the flow's next answer, when it has
        room for a follow-up, else observed now."""
        if len(echo) < wire.ECHO_FOLLOW_UP_OFFSET + wire.ECHO_FOLLOW_UP.size:
            self._observe(sample, 0.0)
            return
        previous, stretch = wire.ECHO_FOLLOW_UP.unpack_from(echo, wire.ECHO_FOLLOW_UP_OFFSET)  # + 1 each (0: none)
        if f.held is not None:
            seconds = (stretch - 1) / 1e9 if stretch and f.held.seq == previous - 1 else 0.0
            if not 0 <= seconds < f.held.rtt:  # not a part of that round trip: the responder's error
                self.sink.rejected("follow_up_out_of_bounds")
                seconds = 0.0
            self._observe(f.held, seconds)
        f.held = sample

    def _observe(self, sample: _Sample, stretch: float) -> None:
        """An echo's RTT and one-way delays to the sink, less its answer's `stretch` (seconds from
        the responder's clock read to its send, where a follow-up said it)."""
        rtt = sample.rtt - stretch
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

    def _clocks(  # noqa: PLR0913, PLR0917 - an echo's stamps, each a figure of the exchange
        self, sent_ns: int, arrived_ns: int, hold_ns: int, echo: bytes, on_clock: tuple[int, int], elapsed: float
    ) -> OneWay | None:
        """From an echo's stamps, when its responder stamps (wire.py): the peer's clock offset (to
        the sink now), and each direction's delay (returned, with the peer's bound and how far apart
        the clocks are at least): out, to the request's arrival there (its answer's stamp less the
        hold, which starts at the kernel's arrival stamp); back, from the answer's stamp. This
        host's send and arrival stamps are the kernel's where the sockets give them; `on_clock`: the
        send and the arrival on the clock this process reads, for the offset; `elapsed`: the monotonic
        seconds from the send to the read. Stamps that no clock could have given are not taken."""
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
        if answered_ns < took_ns or abs(offset) >= PLAUSIBLE_OFFSET_SECONDS:
            self.sink.rejected("clock_implausible")
            return None
        if not -DELAY_SLACK_SECONDS <= delay <= elapsed + DELAY_SLACK_SECONDS:
            self.sink.rejected("delay_impossible")
            return None
        self._offsets.add(delay, offset)
        estimate = self._offsets.estimate()
        assert estimate is not None
        peer_bound = None
        if len(echo) >= wire.ECHO_BOUND_OFFSET + wire.ECHO_BOUND.size:
            (bound_ns,) = wire.ECHO_BOUND.unpack_from(echo, wire.ECHO_BOUND_OFFSET)
            peer_bound = bound_ns / 1e9 if bound_ns else None
            if peer_bound is not None and peer_bound > PLAUSIBLE_BOUND_SECONDS:
                self.sink.rejected("bound_implausible")
                peer_bound = None
        # The offset's own error is at most half its exchanges' delay: beyond that, the clocks are apart.
        clocks_apart = max(0.0, abs(estimate[0]) - estimate[1] / 2)
        forward, reverse = (answered_ns - hold_ns - sent_ns) / 1e9, (arrived_ns - answered_ns) / 1e9
        return OneWay(forward, reverse, peer_bound, clocks_apart)

    def _echoed(self, flow: int, index: int, reflected: int) -> None:
        f = self._flows[flow]
        f.answered += 1
        if reflected and index > f.newest and f.withheld is None:  # zero: a responder that does not count
            if reflected > f.sent or reflected + COUNT_REORDER_SLACK < f.reflected:
                # A count the responder cannot have (more than was sent on the flow), or one that fell
                # (it started again, or is broken): its answers no longer split the flow's loss.
                f.withheld = f.split(self._in_flight(flow, f.newest))
                self.sink.rejected("count_beyond_sent" if reflected > f.sent else "count_not_monotonic")
            else:
                f.newest, f.reflected = index, reflected
        self._account()

    def _in_flight(self, flow: int, below: int) -> int:
        """The flow's packets still in flight among its first `below`."""
        return sum(1 for _, f, n in self._outstanding.values() if f == flow and n < below)

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
            there, back = f.split(self._in_flight(i, f.newest) if f.newest and f.withheld is None else 0)
            forward, reverse = forward + there, reverse + back
        # Never backwards (a packet reordered past a later one can lower the estimate by one).
        self._by_direction = (max(forward, self._by_direction[0]), max(reverse, self._by_direction[1]))
        self.sink.lost_by_direction(*self._by_direction)
        estimate = self._offsets.estimate()
        if estimate is not None and estimate != self._offset:
            self._offset = estimate
            self.sink.clock_offset(estimate[0])
        self.sink.flows_failing(
            sum(f.health.failing() for f in self._flows), max(f.health.loss_ratio() for f in self._flows)
        )

    # --- sending and expiry
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
            self._recent.mark(seq, EXPIRED)
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
        self._recent.sent(seq, flow, f.sent)
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
