"""UDP echo accounting (pure logic: datagrams fed straight to the protocol object)."""

import asyncio
import contextlib
import socket
import time
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pathprobe.allow import AllowList
from pathprobe.clock import one_way_untrusted
from pathprobe.probe_settings import EchoSettings
from pathprobe.probes import EchoProber, Target
from pathprobe.probes.echo import OffsetFilter, OneWay
from pathprobe.probes.report import ReportSink, RttReport, describe_one_way
from pathprobe.responders.echo import EchoResponder
from pathprobe.wire import ECHO_CLOCKS, ECHO_CLOCKS_OFFSET, ECHO_HOLD_OFFSET, ECHO_REFLECTED
from pathprobe.wire import ECHO_HEADER as HEADER
from pathprobe.wire import ECHO_MAGIC as MAGIC
from pathprobe.wire import ECHO_REFUSAL as REFUSAL
from pathprobe.wire import ECHO_REFUSED as REFUSED
from pathprobe.wire import echo_packet as packet


def client(timeout: float = 1.0) -> tuple[EchoProber, RttReport]:
    report = RttReport("udp", 0.01, 64)
    settings = EchoSettings(rate_pps=100, size_bytes=64, timeout_seconds=timeout)
    return EchoProber(Target("198.18.1.2", 9470), settings, ReportSink(report)), report


def one_ways(c: EchoProber) -> list[OneWay]:
    """Each answered echo's one-way delays, as the prober hands them to its sink, from now on."""
    seen: list[OneWay] = []

    def received(_rtt: float, _age: float = 0.0, _jitter: float | None = None, one_way: OneWay | None = None) -> None:
        if one_way is not None:
            seen.append(one_way)

    c.sink.received = received  # type: ignore[method-assign]
    return seen


def clocks() -> tuple[int, float]:
    """The wall clock (ns) and the monotonic one (s), read together: an echo's exchange delay on the
    first may exceed its elapsed time on the second by a millisecond at most (echo.DELAY_SLACK_SECONDS),
    so a test that read them statements apart, preempted in between, had its echo's clocks refused."""
    return time.time_ns(), time.perf_counter()


def send(c: EchoProber, seq: int, at: float) -> None:
    c.track(seq, at)
    c.sink.sent(64)


def test_loss_duplicates_reordering_and_late_echoes() -> None:
    c, r = client(timeout=1.0)
    now = time.perf_counter()
    for seq in range(5):
        send(c, seq, now)
    c.datagram_received(packet(0, 64, 0), ("x", 1))
    c.datagram_received(packet(2, 64, 0), ("x", 1))
    c.datagram_received(packet(1, 64, 0), ("x", 1))  # older than 2: reordered
    c.datagram_received(packet(1, 64, 0), ("x", 1))  # again: duplicate
    c._expire(now + 2.0)  # 3 and 4 time out
    c.datagram_received(packet(4, 64, 0), ("x", 1))  # after its timeout: late, not received
    assert (r.sent, r.received, r.lost, r.reordered, r.duplicates, r.late) == (5, 3, 2, 1, 1, 1)


def test_nothing_is_lost_before_its_timeout() -> None:
    c, r = client(timeout=1.0)
    now = time.perf_counter()
    send(c, 0, now)
    c._expire(now + 0.5)
    assert r.lost == 0
    c._expire(now + 1.01)
    assert r.lost == 1


def test_refusal_is_not_allowed_not_loss() -> None:
    c, r = client()
    send(c, 7, time.perf_counter())
    c.datagram_received(REFUSAL.pack(REFUSED, 7), ("x", 1))
    c._expire(time.perf_counter() + 10)
    assert r.failures == {"not_allowed": 1} and r.lost == 0


def test_garbage_datagrams_are_ignored() -> None:
    c, r = client()
    c.datagram_received(b"hello", ("x", 1))
    c.datagram_received(b"PPUE", ("x", 1))
    assert r.received == 0


def test_jitter_follows_rtt_changes() -> None:
    c, r = client()
    base, sent_ns = time.perf_counter(), time.time_ns()
    for seq in range(3):
        # RTTs of 10, 20 and 30 ms by the stamps, whatever this process waited for a CPU between reads.
        send(c, seq, base - 0.010 * (seq + 1))
        c.datagram_received(packet(seq, 64, sent_ns), ("x", 1), arrived_ns=sent_ns + 10_000_000 * (seq + 1))
    assert r.jitter_seconds == pytest.approx(0.010 / 16 + (0.010 - 0.010 / 16) / 16, rel=0.05)


def test_the_clock_offset_is_the_median_of_the_least_delayed_echoes_one_corrupt_answer_moves_it_not() -> None:
    offsets: list[float] = []
    c, _ = client()
    c.sink.clock_offset = offsets.append  # type: ignore[method-assign]
    resp = EchoResponder(AllowList(["0.0.0.0/0"]), max_pps_per_source=100, count=lambda *_: None)
    echoes: list[bytes] = []
    resp.sendto = lambda data, addr, *_: echoes.append(data)  # type: ignore[method-assign]
    # 40 exchanges of 2 ms (same clock both ends: the offset is half the apparent delay, 1 ms), one
    # of 500 ms, and one whose answer says the responder's clock is an hour ahead (its delay as short).
    for seq, sent_ago_ms in enumerate([2] * 20 + [500] + [2] * 20):
        wall, mono = clocks()
        send(c, seq, mono - sent_ago_ms / 1000)
        resp.datagram_received(packet(seq, 64, wall - sent_ago_ms * 1_000_000), ("198.18.1.2", 4000))
        echo = bytearray(echoes[-1])
        if seq == 30:
            took, answered = ECHO_CLOCKS.unpack_from(echo, ECHO_CLOCKS_OFFSET)
            ECHO_CLOCKS.pack_into(echo, ECHO_CLOCKS_OFFSET, took + 3600 * 10**9, answered + 3600 * 10**9)
        c.datagram_received(bytes(echo), ("198.18.1.2", 9470))
    c._account(force=True)
    assert 0.0005 < offsets[-1] < 0.0015, offsets


def test_an_answer_read_late_gives_the_offset_of_its_arrival() -> None:
    """An answer read 80 ms after it arrived (it waited for the pacer's pass): with the kernel's
    transmit and receive stamps, the offset is that of the exchange, not of the read; without a
    transmit stamp, the read's clock is all there is (the wait shows as half of it, as before)."""
    for kernel_stamped, expected in ((True, 0.005), (False, 0.005 - 0.040)):
        offsets: list[float] = []
        c, _ = client()
        c.sink.clock_offset = offsets.append  # type: ignore[method-assign]
        now_ns, mono = clocks()
        read_sent = now_ns - 100_000_000  # sent 100 ms ago; the kernel stamped it 10 us later
        send(c, 0, mono - 0.1)
        if kernel_stamped:
            c._sent_ns[0] = read_sent + 10_000
        took = read_sent + 10_000 + 10_000_000 + 5_000_000  # 10 ms out, on a clock 5 ms ahead
        echo = bytearray(packet(0, 64, read_sent))
        ECHO_CLOCKS.pack_into(echo, ECHO_CLOCKS_OFFSET, took, took + 100_000)  # answered 0.1 ms later
        arrived = read_sent + 10_000 + 20_100_000  # 10 ms back: here 80 ms before this read
        c.datagram_received(bytes(echo), ("198.18.1.2", 9470), arrived_ns=arrived)
        assert offsets == [pytest.approx(expected, abs=0.002)], kernel_stamped


@given(
    st.lists(
        st.tuples(st.floats(0, 1, allow_nan=False), st.floats(-10, 10, allow_nan=False)), min_size=1, max_size=200
    ),
    st.integers(1, 70),
    st.integers(1, 10),
)
def test_the_offset_filter_takes_the_median_of_the_least_delayed_of_its_window(
    exchanges: list[tuple[float, float]], size: int, quorum: int
) -> None:
    f = OffsetFilter(size, quorum)
    for delay, offset in exchanges:
        f.add(delay, offset)
    estimate = f.estimate()
    assert estimate is not None
    window = sorted(exchanges[-size:])[:quorum]
    offsets = sorted(o for _, o in window)
    assert offsets[0] <= estimate[0] <= offsets[-1]  # a median of those: one outlier of three moves it not
    assert estimate[1] == window[-1][0]  # the largest delay among them: the offset's error is at most half


def test_an_echo_without_the_responders_clocks_gives_no_offset() -> None:
    offsets: list[float] = []
    c, _ = client()
    c.sink.clock_offset = offsets.append  # type: ignore[method-assign]
    send(c, 0, time.perf_counter())
    c.datagram_received(packet(0, 64, time.time_ns()), ("x", 1))  # an older responder: zeros there
    send(c, 1, time.perf_counter())
    c.datagram_received(packet(1, 36, time.time_ns()), ("x", 1))  # no room for them
    assert offsets == []


class FakeTransport:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple[str, int]]] = []

    def sendto(self, data: bytes, addr: tuple[str, int], *_: object) -> None:
        self.sent.append((data, addr))


def test_responder_allows_refuses_and_rate_limits() -> None:
    counts: list[str] = []
    resp = EchoResponder(AllowList(["198.18.1.0/24"]), max_pps_per_source=5, count=counts.append)
    t = FakeTransport()
    resp.sendto = t.sendto  # type: ignore[method-assign]
    for seq in range(8):
        resp.datagram_received(packet(seq, 64, 0), ("198.18.1.2", 4000))
    resp.datagram_received(packet(0, 64, 0), ("198.19.9.9", 4000))
    resp.datagram_received(b"junk", ("198.18.1.2", 4000))
    assert counts.count("accepted") == 5 and counts.count("rate_limited") == 3
    assert counts.count("not_allowed") == 1 and counts.count("malformed") == 1
    refusal = t.sent[-1][0]
    assert refusal[:4] == REFUSED and len(refusal) < 64  # never amplifies


def test_allow_list_handles_mapped_ipv6_and_junk() -> None:
    allow = AllowList(["198.18.0.0/15", "2001:db8::/32"])
    assert allow.allows("::ffff:198.18.3.4")
    assert allow.allows("2001:db8::1")
    assert not allow.allows("198.20.0.1")
    assert not allow.allows("not-an-address")


def test_rtt_leaves_out_the_responders_hold_time() -> None:
    c, r = client()
    now = time.perf_counter()
    send(c, 0, now - 0.050)  # 50 ms ago by the monotonic clock
    sent_ns = time.time_ns() - 30_000_000
    # On the wire 30 ms by the kernel's stamps, 2 ms of which the responder held it.
    c.datagram_received(packet(0, 64, sent_ns, hold_ns=2_000_000), ("x", 1), arrived_ns=sent_ns + 30_000_000)
    assert r.rtts == [pytest.approx(0.028, abs=1e-6)]


def test_responder_fills_in_its_hold_time_and_keeps_the_rest() -> None:
    resp = EchoResponder(AllowList(["198.18.1.0/24"]), max_pps_per_source=5, count=lambda _: None)
    t = FakeTransport()
    resp.sendto = t.sendto  # type: ignore[method-assign]
    request = packet(3, 64, 123, hold_ns=0)
    resp.datagram_received(request, ("198.18.1.2", 4000), arrived_ns=time.time_ns() - 1_000_000)
    reply = t.sent[0][0]
    magic, seq, clock, hold, received = HEADER.unpack_from(reply)
    assert (magic, seq, clock, received, len(reply)) == (MAGIC, 3, 123, 1, 64)
    assert 1_000_000 <= hold < 1_000_000_000


def client_with(flows: int, timeout: float = 1.0) -> tuple[EchoProber, RttReport]:
    report = RttReport("udp", 0.01, 64)
    settings = EchoSettings(rate_pps=100, size_bytes=64, timeout_seconds=timeout, flows=flows)
    return EchoProber(Target("198.18.1.2", 9470), settings, ReportSink(report)), report


def test_loss_splits_by_direction_from_the_responders_counts() -> None:
    # One flow, 10 packets: #3 never reaches the responder, #6's echo never comes back.
    c, r = client_with(flows=1)
    now = time.perf_counter()
    reflected = 0
    for seq in range(10):
        send(c, seq, now)
        if seq == 3:
            continue
        reflected += 1
        if seq != 6:
            c.datagram_received(packet(seq, 64, 0, received=reflected), ("x", 1))
    c._expire(now + 2.0, everything=True)
    assert (r.lost, r.lost_forward, r.lost_reverse) == (2, 1, 1)


def test_one_dead_flow_of_eight_shows_as_a_failing_flow() -> None:
    c, r = client_with(flows=8)
    now = time.perf_counter()
    for seq in range(160):  # 20 packets per flow; flow 5 gets no echo at all
        send(c, seq, now)
        if seq % 8 != 5:
            c.datagram_received(packet(seq, 64, 0, received=seq // 8 + 1), ("x", 1))
    c._expire(now + 2.0, everything=True)
    assert r.lost == 20 and r.lost / r.sent == 1 / 8
    assert r.flows_failing == 1 and r.worst_flow_loss_ratio == 1.0
    assert r.lost_reverse == 0  # the responder's count on flow 5 never came back: unknown, not guessed


def test_datagrams_the_full_queue_dropped_are_counted_as_overload() -> None:
    counts: Counter[str] = Counter()

    def count(result: str, n: int = 1) -> None:
        counts[result] += n

    async def flood() -> int:
        resp = EchoResponder(AllowList(["127.0.0.0/8"]), max_pps_per_source=1e9, count=count)
        await resp.start("127.0.0.1", 0)
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sent = 0
            # The event loop does not run while this sends: the socket's queue fills and overflows.
            for seq in range(20000):
                with contextlib.suppress(BlockingIOError):
                    sender.sendto(packet(seq, 0, 1400), resp.sockname())
                    sent += 1
            # The kernel reports its drop count with the next datagram it queues: one more, once drained.
            deadline = time.monotonic() + 10
            while counts["accepted"] < sent and time.monotonic() < deadline:
                before = counts["accepted"]
                await asyncio.sleep(0.2)
                if counts["accepted"] == before:
                    break
            sender.sendto(packet(sent, 0, 1400), resp.sockname())
            sent += 1
            while sum(counts.values()) < sent and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return sent
        finally:
            sender.close()
            resp.close()

    sent = asyncio.run(flood())
    assert counts["dropped_queue_full"] > 0, counts
    assert counts["accepted"] + counts["dropped_queue_full"] == sent, counts


def test_a_refusing_port_counts_each_packet_once() -> None:
    # Regression: each ICMP "port unreachable" answered the oldest packet of any
    # flow, and packets were counted refused and lost both. Loopback sends an ICMP error per packet.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the probe runs
    report = RttReport("udp", 0.005, 64)
    settings = EchoSettings(rate_pps=200, size_bytes=64, timeout_seconds=0.5, flows=4)
    asyncio.run(EchoProber(Target("127.0.0.1", port), settings, ReportSink(report)).run(count=40))
    assert report.sent == 40
    assert report.failures["refused"] + report.lost == 40, (report.failures, report.lost)
    assert report.failures["refused"] >= 36  # every one, but for a reply lost to a full queue


def test_each_echo_gives_both_one_way_delays_and_the_responders_bound() -> None:
    """The responder's stamps (its kernel's arrival, its clock as it answered) against this host's
    send and arrival stamps: each direction's delay, and the clock error bound it states."""
    c, _ = client()
    seen = one_ways(c)
    resp = EchoResponder(AllowList(["0.0.0.0/0"]), max_pps_per_source=100, count=lambda *_: None, bound=lambda: 50e-6)
    echoes: list[bytes] = []
    resp.sendto = lambda data, addr, *_: echoes.append(data)  # type: ignore[method-assign]
    for seq, size in enumerate((64, 52)):  # room for the bound, and only for the clocks
        wall, mono = clocks()
        sent = wall - 10_000_000
        send(c, seq, mono - 0.010)
        resp.datagram_received(packet(seq, size, sent), ("198.18.1.2", 4000), arrived_ns=sent + 3_000_000)
        _, answered = ECHO_CLOCKS.unpack_from(echoes[-1], ECHO_CLOCKS_OFFSET)
        c.datagram_received(echoes[-1], ("198.18.1.2", 9470), arrived_ns=answered + 2_000_000)
    assert [w[:3] for w in seen] == [(0.003, 0.002, 50e-6), (0.003, 0.002, None)]


def test_a_pause_while_an_echo_is_read_leaves_its_clocks_possible() -> None:
    """The prober reads the monotonic and the wall clock together as an echo comes: read statements
    apart, a pause between them (a preempted process) was in the exchange's wall-clock delay but not
    in its elapsed time, and past a millisecond the echo's clocks were refused as impossible (one CI
    run lost an echo's one-way delays so)."""
    c, _ = client()
    seen = one_ways(c)
    resp = EchoResponder(AllowList(["0.0.0.0/0"]), max_pps_per_source=100, count=lambda *_: None)
    echoes: list[bytes] = []
    resp.sendto = lambda data, addr, *_: echoes.append(data)  # type: ignore[method-assign]
    mark = c._recent.mark

    def paused(*args: int) -> None:  # a pause inside the prober's handling of the echo
        time.sleep(0.005)
        mark(*args)

    c._recent.mark = paused  # type: ignore[method-assign]
    wall, mono = clocks()
    send(c, 0, mono - 0.010)
    resp.datagram_received(packet(0, 64, wall - 10_000_000), ("198.18.1.2", 4000))
    c.datagram_received(echoes[-1], ("198.18.1.2", 9470))
    assert len(seen) == 1


@pytest.mark.parametrize(("skew", "caught"), [(0.005, False), (-0.025, False), (0.050, True), (-0.035, True)])
def test_a_clock_off_by_less_than_the_delay_it_hides_in_is_not_caught(skew: float, caught: bool) -> None:
    """The limit of one-way delays from two ends: a responder whose clock is `skew` ahead of true,
    on a path 30 ms out and 44 ms back, with 1 us bounds stated at each end. The echoes put the
    clocks apart (beyond the on-wire estimate's own error, half the exchange's delay) only once the
    skew exceeds the delay it hides in: the reverse one when ahead, the forward one when behind,
    the point where that delay comes out negative. Below that, the two delays read shifted by the
    skew, one up and one down, and are exported."""
    out, back = 0.030, 0.044
    c, _ = client()
    seen = one_ways(c)
    resp = EchoResponder(AllowList(["0.0.0.0/0"]), max_pps_per_source=100, count=lambda *_: None)
    echoes: list[bytes] = []
    resp.sendto = lambda data, addr, *_: echoes.append(data)  # type: ignore[method-assign]
    wall, mono = clocks()
    sent = wall - round((out + back) * 1e9)  # so that the answer arrives about now
    send(c, 0, mono - (out + back))
    resp.datagram_received(packet(0, 64, sent), ("198.18.1.2", 4000))
    echo = bytearray(echoes[-1])
    arrived_there = sent + round(out * 1e9)
    took = arrived_there + round(skew * 1e9)  # the responder's clock reads, held no time
    ECHO_REFLECTED.pack_into(echo, ECHO_HOLD_OFFSET, 0, 1)
    ECHO_CLOCKS.pack_into(echo, ECHO_CLOCKS_OFFSET, took, took)
    c.datagram_received(bytes(echo), ("198.18.1.2", 9470), arrived_ns=arrived_there + round(back * 1e9))
    ((forward, reverse, _, apart),) = seen
    assert forward == pytest.approx(out + skew, abs=1e-9) and reverse == pytest.approx(back - skew, abs=1e-9)
    negative = min(forward, reverse) < 0
    assert negative == caught and (apart > 2e-6) == caught, (forward, reverse, apart)
    assert one_way_untrusted(2e-6, apart, negative, [forward, reverse], 0.1) == ("clocks_disagree" if caught else "")


@pytest.mark.parametrize("dscp", [0, 46])
def test_marks_are_reflected_by_the_responder_over_real_sockets(dscp: int) -> None:
    """The prober marks its echoes (46: EF), the responder reads the mark each arrived with, writes it
    into the answer and sends the answer with it; loopback keeps both: nothing changed, so the sink
    is told once (it counts changed marks: it hears of every echo whose mark changed, and of news)."""
    seen: list[tuple[int, int, int | None]] = []
    report = RttReport("udp", 0.005, 64)
    sink = ReportSink(report)
    sink.marks = lambda sent, forward, reverse: seen.append((sent, forward, reverse))  # type: ignore[method-assign]

    async def run() -> None:
        resp = EchoResponder(AllowList(["127.0.0.0/8"]), max_pps_per_source=1e9, count=lambda *_: None)
        await resp.start("127.0.0.1", 0)
        try:
            settings = EchoSettings(rate_pps=100, size_bytes=64, timeout_seconds=0.5, flows=2, dscp=dscp)
            await EchoProber(Target("127.0.0.1", resp.sockname()[1]), settings, sink).run(count=10)
        finally:
            resp.close()

    asyncio.run(run())
    assert report.received >= 9
    assert seen == [(dscp, dscp, dscp)]


def test_a_rewritten_mark_is_seen_in_its_direction() -> None:
    """Pure: an echo sent with EF (46) reaches the responder as CS0 (bleached on the way out); the
    answer, sent with CS0, comes back as CS0."""
    seen: list[tuple[int, int, int | None]] = []
    c, _ = client()
    c.settings = EchoSettings(rate_pps=100, size_bytes=64, timeout_seconds=1.0, dscp=46)
    c.sink.marks = lambda sent, forward, reverse: seen.append((sent, forward, reverse))  # type: ignore[method-assign]
    resp = EchoResponder(AllowList(["0.0.0.0/0"]), max_pps_per_source=100, count=lambda *_: None)
    sent: list[tuple[bytes, list[tuple[int, int, bytes]]]] = []
    resp.sendto = lambda data, addr, ancillary=None, *_: sent.append((data, ancillary or []))  # type: ignore[method-assign]
    send(c, 0, time.perf_counter())
    resp.datagram_received(packet(0, 64, time.time_ns()), ("198.18.1.2", 4000), tos=0)
    answer, ancillary = sent[-1]
    assert ancillary == [(socket.IPPROTO_IP, socket.IP_TOS, bytes([0]))]  # the answer leaves with the mark it got
    c.datagram_received(answer, ("198.18.1.2", 9470), tos=0)
    assert seen == [(46, 0, 0)]


def one_off(own: float | None, peer: float | None, delays: list[tuple[float, float]], apart: float = 0.0) -> RttReport:
    """A one-off run's report (`pathprobe probe loss`, the capacity review) fed echoes' delays."""
    report = RttReport("udp", 0.01, 64, own_bound=own)
    sink = ReportSink(report)
    for forward, reverse in delays:
        sink.received(forward + reverse, one_way=OneWay(forward, reverse, peer, apart))
    return report


def test_a_one_off_run_reports_one_way_delays_only_as_its_clocks_allow() -> None:
    trusted = one_off(1e-6, 1e-6, [(0.030, 0.044), (0.031, 0.045), (0.030, 0.044)]).one_way()
    assert trusted is not None and trusted["untrusted"] is None
    assert trusted["forward_seconds"]["p50"] == 0.030 and trusted["reverse_seconds"]["p50"] == 0.044
    assert trusted["error_bound_seconds"] == 2e-6
    assert describe_one_way(trusted).startswith("one-way p50 forward 30 ms, reverse 44 ms")
    # Each reason withholds the figures, and says which.
    cases = {
        "no_bound": one_off(None, 1e-6, [(0.030, 0.044)]),  # this host states none
        "clocks_disagree": one_off(1e-6, 1e-6, [(0.030, 0.044)], apart=5e-6),  # further apart than the bounds
        "bound_too_wide": one_off(0.002, 0.002, [(0.030, 0.044)]),  # 4 ms of error on 30 ms: above 10%
    }
    for reason, report in cases.items():
        got = report.one_way()
        assert got is not None and got["untrusted"] == reason and got["forward_seconds"] is None, (reason, got)
        assert describe_one_way(got).startswith(f"one-way delays withheld ({reason})")
    negative = one_off(1e-6, 1e-6, [(0.030, 0.044), (-0.001, 0.075)]).one_way()
    assert negative is not None and negative["untrusted"] == "clocks_disagree"
    assert RttReport("tcp", 0.01, 1).one_way() is None


def test_the_recent_packets_ring_forgets_a_seq_once_a_later_one_takes_its_slot() -> None:
    from pathprobe.probes.recent import ANSWERED, EXPIRED, IN_FLIGHT, Recent

    recent = Recent(4)
    for seq in range(6):
        recent.sent(seq, seq % 2, seq // 2 + 1)
    recent.mark(3, ANSWERED)
    recent.mark(4, EXPIRED)
    recent.mark(0, EXPIRED)  # slot taken over by 4: nothing
    assert [recent.state(s) for s in range(7)] == [None, None, IN_FLIGHT, ANSWERED, EXPIRED, IN_FLIGHT, None]
    assert recent.flow_index(5) == (1, 3)
    assert recent.flow_index(1) is None


def test_the_offset_kept_between_exchanges_is_the_one_worked_out_afresh() -> None:
    # OffsetFilter keeps its estimate while the least-delayed exchanges stay the same: with ties,
    # a window that wraps and reads skipped, it must equal the median of the least-delayed of now.
    import random
    import statistics

    from pathprobe.probes.echo import OffsetFilter

    rng = random.Random(5)
    for size, quorum in ((8, 1), (16, 4), (64, 8)):
        f = OffsetFilter(size, quorum)
        for _ in range(2000):
            f.add(round(rng.uniform(0, 0.01), rng.choice([3, 9])), rng.choice([0.5, rng.uniform(-1, 1)]))
            best = sorted(f.exchanges)[:quorum]
            if rng.random() < 0.7:
                assert f.estimate() == (statistics.median(sorted(o for _, o in best)), best[-1][0])
