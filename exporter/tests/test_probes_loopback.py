"""The probes and responders over loopback sockets, in one event loop."""

import asyncio
import socket
from collections import Counter

import pytest

from pathprobe import stamps
from pathprobe.allow import AllowList
from pathprobe.config import LossSettings, MtuSettings, RttSettings
from pathprobe.probes import EchoProber, MtuProber, RttProber, Target
from pathprobe.probes.report import ReportSink, RttReport
from pathprobe.responders.echo import EchoResponder
from pathprobe.responders.rr import RrResponder
from pathprobe.wire import MAX_BUFFERED, READ_SIZE, Connection


async def probe(port: int, count: int) -> RttReport:
    report = RttReport("tcp", 0.001, 1)
    settings = RttSettings(interval_seconds=0.001, size_bytes=1, timeout_seconds=2.0)
    await RttProber(Target("127.0.0.1", port), settings, ReportSink(report)).run(count=count)
    return report


def test_exchanges_and_refusals_are_counted() -> None:
    async def scenario() -> tuple[RttReport, RttReport, list[str]]:
        counts: list[str] = []
        server = await RrResponder(AllowList(["127.0.0.0/8"]), 16, counts.append).start("127.0.0.1", 0)
        port = server.listener.getsockname()[1]
        ok = await probe(port, 20)
        server.close()
        strict = await RrResponder(AllowList(["198.18.0.0/15"]), 4, counts.append).start("127.0.0.1", 0)
        refused = await probe(strict.listener.getsockname()[1], 1)
        strict.close()
        return ok, refused, counts

    ok, refused, counts = asyncio.run(scenario())
    assert ok.received == 20 and not ok.failures
    assert all(0 < rtt < 0.05 for rtt in ok.rtts)
    assert refused.failures == {"not_allowed": 1}
    assert counts == ["accepted"] * 8 + ["not_allowed"]  # 20 exchanges over the 8 flows' connections


def test_a_reload_that_no_longer_admits_a_source_ends_its_open_connections() -> None:
    async def scenario() -> tuple[RttReport, list[str], int]:
        counts: list[str] = []
        allow = AllowList(["127.0.0.0/8"])
        server = await RrResponder(allow, 16, counts.append).start("127.0.0.1", 0)
        report = RttReport("tcp", 0.001, 1)
        settings = RttSettings(interval_seconds=0.01, size_bytes=1, timeout_seconds=2.0)
        prober = RttProber(Target("127.0.0.1", server.listener.getsockname()[1]), settings, ReportSink(report))
        probing = asyncio.create_task(prober.run(count=200))
        for _ in range(500):  # every flow connected and answered (bounded: 5 s)
            if counts.count("accepted") == 8 and report.received >= 16:
                break
            await asyncio.sleep(0.01)
        answered = report.received
        allow.replace(AllowList(["198.18.0.0/15"]))  # what a reload that moved the peer does
        await probing
        server.close()
        return report, counts, answered

    report, counts, answered = asyncio.run(scenario())
    # Each open connection ends at its next request, counted; reconnections are refused.
    assert counts.count("revoked") == 8, counts
    assert report.received < answered + 8, (report.received, answered)
    assert "not_allowed" in counts and report.failures, (counts, report.failures)


def test_connections_beyond_the_per_source_limit_are_refused_and_counted() -> None:
    async def scenario() -> tuple[RttReport, list[str]]:
        counts: list[str] = []
        server = await RrResponder(AllowList(["127.0.0.0/8"]), 3, counts.append).start("127.0.0.1", 0)
        report = await probe(server.listener.getsockname()[1], 8)  # one exchange per flow
        server.close()
        return report, counts

    report, counts = asyncio.run(scenario())
    assert (report.received, report.failures) == (3, {"not_allowed": 5})
    assert counts == ["accepted"] * 3 + ["rate_limited"] * 5


def test_a_sender_that_never_reads_is_held_to_a_bounded_buffer() -> None:
    async def scenario() -> tuple[int, int]:
        a, b = socket.socketpair()
        a.setblocking(False)
        conn = Connection(b)
        sent = blocked = 0
        while blocked < 5 and sent < 8 * MAX_BUFFERED:  # until the kernel's buffers are full too
            try:
                sent += a.send(b"x" * READ_SIZE)
                blocked = 0
            except BlockingIOError:
                blocked += 1
                await asyncio.sleep(0.01)  # lets the connection read what it will
        buffered = len(conn._buffer)
        data, _ = await conn.read(sent)  # reading drains the buffer and resumes the socket
        conn.close()
        a.close()
        return buffered, len(data)

    buffered, drained = asyncio.run(scenario())
    assert MAX_BUFFERED <= buffered < MAX_BUFFERED + READ_SIZE
    assert drained > MAX_BUFFERED


def test_the_responder_closing_early_is_an_error_not_a_hang() -> None:
    async def scenario() -> RttReport:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(9)
            writer.write(b"Y")
            await reader.read(1)
            writer.close()

        server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        report = await probe(server.sockets[0].getsockname()[1], 1)
        server.close()
        return report

    assert asyncio.run(scenario()).failures == {"error": 1}


@pytest.mark.parametrize("hello", [b"PPRR\x01\x00\x00\x00\x01", b"GET / HTTP/1.0\r\n\r\n"])
def test_old_or_foreign_hellos_are_malformed(hello: bytes) -> None:
    async def scenario() -> tuple[bytes, list[str]]:
        counts: list[str] = []
        server = await RrResponder(AllowList(["127.0.0.0/8"]), 16, counts.append).start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.listener.getsockname()[1])
        writer.write(hello)
        answer = await asyncio.wait_for(reader.read(1), 5)
        writer.close()
        server.close()
        return answer, counts

    assert asyncio.run(scenario()) == (b"N", ["malformed"])


@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
def test_both_probes_work_over_ipv4_and_ipv6(address: str) -> None:
    async def scenario() -> tuple[RttReport, RttReport]:
        allow = AllowList(["127.0.0.0/8", "::1/128"])
        rr = await RrResponder(allow, 16, lambda _: None).start(address, 0)
        echo = EchoResponder(allow, 1000, lambda _: None)
        await echo.start(address, 0)
        tcp, udp = RttReport("tcp", 0.001, 1), RttReport("udp", 0.005, 64)
        rtt = RttSettings(interval_seconds=0.001, size_bytes=1, timeout_seconds=2.0)
        await RttProber(Target(address, rr.listener.getsockname()[1]), rtt, ReportSink(tcp)).run(count=10)
        loss = LossSettings(rate_pps=200, size_bytes=64, timeout_seconds=1.0)
        await EchoProber(Target(address, echo.sockname()[1]), loss, ReportSink(udp)).run(count=10)
        rr.close()
        echo.close()
        return tcp, udp

    tcp, udp = asyncio.run(scenario())
    assert (tcp.received, udp.received, udp.lost) == (10, 10, 0)
    assert all(0 < rtt < 0.05 for rtt in tcp.rtts + udp.rtts)


@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
def test_both_probes_time_every_request_from_the_kernels_transmit_stamp(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each sample's send time is its own packet's transmit stamp: after the clock read that
    preceded its send(), before its answer (a stamp matched to the wrong packet is not)."""
    chosen: list[tuple[int, int | None, int]] = []
    sent_time = stamps.sent_time

    def spy(read_ns: int, kernel_ns: int | None, arrived_ns: int) -> int:
        chosen.append((read_ns, kernel_ns, arrived_ns))
        return sent_time(read_ns, kernel_ns, arrived_ns)

    async def scenario() -> None:
        allow = AllowList(["127.0.0.0/8", "::1/128"])
        rr = await RrResponder(allow, 16, lambda _: None).start(address, 0)
        echo = EchoResponder(allow, 1000, lambda _: None)
        await echo.start(address, 0)
        rtt = RttSettings(interval_seconds=0.001, size_bytes=1, timeout_seconds=2.0, flows=2)
        tcp = RttProber(Target(address, rr.listener.getsockname()[1]), rtt, ReportSink(RttReport("tcp", 0.001, 1)))
        await tcp.run(count=20)
        loss = LossSettings(rate_pps=200, size_bytes=64, timeout_seconds=1.0, flows=4)
        await EchoProber(Target(address, echo.sockname()[1]), loss, ReportSink(RttReport("udp", 0.005, 64))).run(40)
        rr.close()
        echo.close()

    monkeypatch.setattr(stamps, "sent_time", spy)
    asyncio.run(scenario())
    assert len(chosen) == 60
    assert all(k is not None and read <= k <= arrived for read, k, arrived in chosen), chosen


def test_an_exchange_wakes_its_prober_once_for_the_answer_not_for_its_transmit_stamp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each send's transmit stamp is taken as it is sent: its arrival on the error queue would
    otherwise wake the prober a second time per exchange (the socket polls as readable)."""
    wakes: list[str] = []
    on_readable, read = Connection._on_readable, EchoProber._read

    def tcp_woken(conn: Connection) -> None:
        if conn._stamping:  # the prober's connection, not the responder's
            wakes.append("tcp")
        on_readable(conn)

    def udp_woken(prober: EchoProber, sock: socket.socket, flow: int) -> None:
        wakes.append("udp")
        read(prober, sock, flow)

    monkeypatch.setattr(Connection, "_on_readable", tcp_woken)
    monkeypatch.setattr(EchoProber, "_read", udp_woken)

    async def scenario() -> tuple[RttReport, RttReport]:
        allow = AllowList(["127.0.0.0/8"])
        rr = await RrResponder(allow, 16, lambda _: None).start("127.0.0.1", 0)
        echo = EchoResponder(allow, 1000, lambda _: None)
        await echo.start("127.0.0.1", 0)
        tcp, udp = RttReport("tcp", 0.01, 1), RttReport("udp", 0.01, 64)
        rtt = RttSettings(interval_seconds=0.01, size_bytes=1, timeout_seconds=2.0, flows=2)
        await RttProber(Target("127.0.0.1", rr.listener.getsockname()[1]), rtt, ReportSink(tcp)).run(count=20)
        loss = LossSettings(rate_pps=100, size_bytes=64, timeout_seconds=1.0, flows=4)
        await EchoProber(Target("127.0.0.1", echo.sockname()[1]), loss, ReportSink(udp)).run(40)
        rr.close()
        echo.close()
        return tcp, udp

    tcp, udp = asyncio.run(scenario())
    assert (tcp.received, udp.received) == (20, 40)
    # For the responders' answers (and each connection's hello's): none for a stamp.
    assert wakes.count("tcp") <= 20 + 2 and wakes.count("udp") <= 40, Counter(wakes)


def test_the_mtu_prober_sees_sizes_carried_over_loopback() -> None:
    class Outcomes:
        def __init__(self) -> None:
            self.seen: list[tuple[int, bool, str | None]] = []

        def mtu(self, size: int, carried: bool, reason: str | None) -> None:
            self.seen.append((size, carried, reason))

    async def scenario() -> list[tuple[int, bool, str | None]]:
        echo = EchoResponder(AllowList(["127.0.0.0/8"]), 1000, lambda _: None)
        await echo.start("127.0.0.1", 0)
        out = Outcomes()
        settings = MtuSettings(interval_seconds=1, timeout_seconds=1.0, sizes=[1500, 9001])
        await MtuProber(Target("127.0.0.1", echo.sockname()[1]), settings, out).run(rounds=1)
        only_1500 = settings.model_copy(update={"sizes": [1500]})
        closed = MtuProber(Target("127.0.0.1", 9), only_1500, out)  # nothing listens: refused
        await closed.run(rounds=1)
        echo.close()
        return out.seen

    assert asyncio.run(scenario()) == [(1500, True, None), (9001, True, None), (1500, False, "refused")]
