"""Both ends of a real iperf3 test on loopback: the prober's own, and the peer's as a real
`pathprobe serve` reports it on its rr port (a served-test report)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback_mesh import unused_port

from pathprobe import ends, wire
from pathprobe.iperf3 import version_text
from pathprobe.probe_settings import SteadyStateSettings
from pathprobe.probes import Target, ThroughputProber, ThroughputResult, ThroughputTest
from pathprobe.probes.steady import Detector

PATHPROBE = [sys.executable, "-m", "pathprobe"]
# Each end's figures are sampled every 0.1 s from its processes while the test runs. The prober's own
# end, at the lowest CPU priority beside the CI's labs, once read too few samples in a 3 s test for a
# figure (then unknown, as the product says of an end it could not watch): these run alone.
pytestmark = pytest.mark.alone


def consecutive_ports(n: int) -> int:
    """The first of `n` consecutive ports that are free (the servers of `serve --iperf3-processes`)."""
    while True:
        first = unused_port()
        try:
            for port in range(first + 1, first + n):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", port))
        except OSError:
            continue
        return first


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """A `pathprobe serve` on 127.0.0.1 with two iperf3 servers: its rr port and its first iperf3 port."""
    rr, iperf3 = unused_port(), consecutive_ports(2)
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    serve = [
        "serve",
        "--listen",
        "127.0.0.1",
        "--allow",
        "127.0.0.0/8",
        "--rr-port",
        str(rr),
        "--echo-port",
        str(unused_port()),
        "--iperf3-port",
        str(iperf3),
        "--iperf3-processes",
        "2",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen([*PATHPROBE, *serve], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while "pathprobe serve:" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until it says it listens
        assert proc.poll() is None and "pathprobe serve:" in log.read_text(), log.read_text()
        yield rr, iperf3
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run(test: ThroughputTest, port: int) -> ThroughputResult:
    return asyncio.run(ThroughputProber(Target("127.0.0.1", port), test).measure())


def test_a_tcp_test_knows_both_its_ends(peer: tuple[int, int]) -> None:
    rr, port = peer
    test = ThroughputTest(
        streams=2, steady_state=Detector.of(SteadyStateSettings()), duration_seconds=3, report_port=rr
    )
    result = run(test, port)
    sender, receiver = result.sender_end, result.receiver_end
    assert sender is not None and receiver is not None, result
    for end in (sender, receiver):
        assert end.known, ("sender" if end is sender else "receiver", end)
        assert end.iperf3_version == version_text("iperf3") and end.processes == 1
        assert end.cpu_cores is not None and 0 < end.cpu_cores <= 2
    # The server counted the test's two streams: a thread each from iperf3 3.16, one thread before.
    assert receiver.stream_threads == (2 if ends.threads_per_stream(receiver.iperf3_version) else 1)
    # Both ends known: a verdict of them (a CPU, or none), never "unknown". Which one depends on the
    # machine's load (loopback's transfer runs in the sender's own system calls).
    assert result.bound in (*ends.HOST_LIMITS, "none"), result
    assert result.remedy in ("", *ends.REMEDIES)


def test_a_udp_test_counts_what_its_receiver_dropped(peer: tuple[int, int]) -> None:
    rr, port = peer
    result = run(
        ThroughputTest(protocol="udp", udp_bitrate=20e6, duration_seconds=1, omit_seconds=0, report_port=rr), port
    )
    drops = result.udp_receiver_drops()
    assert drops is not None and result.udp_path_loss_ratio() <= result.udp_loss_ratio
    # 20 Mbit/s leaves both ends idle: the rate is the path's.
    assert result.bound == "none", result


def test_a_peer_that_reports_nothing_leaves_its_end_unknown(peer: tuple[int, int]) -> None:
    _, port = peer
    result = run(
        ThroughputTest(protocol="udp", udp_bitrate=20e6, duration_seconds=1, omit_seconds=0, report_port=unused_port()),
        port,
    )
    assert result.receiver_end is None and result.sender_end is not None
    assert result.bound == "unknown"
    assert result.udp_path_loss_ratio() is None


def test_probe_throughput_prints_both_ends(peer: tuple[int, int], tmp_path: Path) -> None:
    rr, port = peer
    out = subprocess.run(
        [
            *PATHPROBE,
            "probe",
            "throughput",
            "127.0.0.1",
            "--port",
            str(port),
            "--report-port",
            str(rr),
            "--protocol",
            "udp",
            "-b",
            "20M",
            "-t",
            "1s",
            "-O",
            "0s",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "sender end: iperf3" in out and "receiver end: iperf3" in out, out
    assert "bound by its own ends: no: both ends had headroom" in out, out


@pytest.mark.parametrize("steady", [True, False], ids=["steady-state", "fixed-length"])
def test_a_test_split_over_two_iperf3_processes_adds_them_up(peer: tuple[int, int], steady: bool) -> None:
    rr, port = peer
    test = ThroughputTest(
        streams=3,
        duration_seconds=2 if steady else 1,
        omit_seconds=0,
        steady_state=Detector.of(SteadyStateSettings()) if steady else None,
        report_port=rr,
        processes=4,  # at most as many as the peer's servers: 2
    )
    result = run(test, port)
    assert result.streams == 3 and result.receiver_bytes_per_second > 0
    assert result.sender_end is not None and result.receiver_end is not None
    threaded = ends.threads_per_stream(version_text("iperf3"))
    # Before iperf3 3.16 a process each, one on each of the peer's servers; from 3.16 one process.
    assert (result.sender_end.processes, result.receiver_end.processes) == ((1, 1) if threaded else (2, 2))
    assert result.sender_end.stream_threads == (3 if threaded else 2)


def test_a_peers_report_that_is_not_possible_is_set_aside_with_why(peer: tuple[int, int]) -> None:
    _, port = peer

    async def lying_report(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(wire.RR_HELLO.size)
        body = json.dumps({"iperf3": {"version": "3.12", "ports": [port]}, "ended_seconds_ago": 0.1,
                           "end": {"runnable_ratio": 7.0}}).encode()  # fmt: skip
        writer.write(b"Y" + wire.REPORT_LENGTH.pack(len(body)) + body)
        await writer.drain()
        writer.close()

    async def go() -> ThroughputResult:
        server = await asyncio.start_server(lying_report, "127.0.0.1", 0)
        report_port = server.sockets[0].getsockname()[1]
        test = ThroughputTest(protocol="udp", udp_bitrate=20e6, duration_seconds=1, omit_seconds=0,
                              report_port=report_port)  # fmt: skip
        try:
            return await ThroughputProber(Target("127.0.0.1", port), test).measure()
        finally:
            server.close()

    result = asyncio.run(go())
    assert result.receiver_end is None and result.bound == "unknown"
    assert result.peer_report_rejected is not None and "runnable_ratio" in result.peer_report_rejected
