"""iperf3 -J parsing, on outputs captured from real iperf3 3.12 runs."""

import json
from pathlib import Path

import pytest

from pathprobe.probes import ProbeFailure, Target
from pathprobe.probes.throughput import ThroughputTest, classify_error, parse

FIXTURES = Path(__file__).parent / "fixtures" / "iperf3"


def load(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_tcp_two_streams() -> None:
    test = ThroughputTest(streams=2, duration_seconds=1, omit_seconds=0)
    r = parse(load("tcp_2streams.json"), test, now=123.0)
    assert r.receiver_bytes_per_second == pytest.approx(400488749.89 / 8)
    assert r.sender_bytes_per_second == pytest.approx(400510774.28 / 8)
    assert r.retransmits == 0
    assert r.bytes_transferred == 50069504
    assert (r.protocol, r.streams, r.direction, r.timestamp) == ("tcp", 2, "send", 123.0)
    assert r.udp_loss_ratio is None
    assert r.iperf3_version == "iperf 3.12"


def test_tcp_reverse_keeps_direction() -> None:
    r = parse(load("tcp_reverse.json"), ThroughputTest(direction="receive"))
    assert r.direction == "receive"
    assert r.receiver_bytes_per_second == pytest.approx(100654035.83 / 8)


def test_udp_reads_receiver_loss_and_jitter() -> None:
    r = parse(load("udp.json"), ThroughputTest(protocol="udp", udp_bitrate=50e6))
    assert r.udp_packets == 191
    assert r.udp_lost == 0
    assert r.udp_loss_ratio == 0.0
    assert r.jitter_seconds == pytest.approx(0.011383867 / 1000)
    assert r.retransmits is None
    assert r.target_bits_per_second == 50e6


@pytest.mark.parametrize(
    ("fixture", "reason"), [("busy.json", "busy"), ("refused.json", "refused"), ("garbage.txt", "error")]
)
def test_failures_are_classified(fixture: str, reason: str) -> None:
    with pytest.raises(ProbeFailure) as info:
        parse(load(fixture), ThroughputTest())
    assert info.value.reason == reason


def test_truncated_json_is_an_error_not_a_crash() -> None:
    with pytest.raises(ProbeFailure) as info:
        parse(load("tcp_2streams.json")[:500], ThroughputTest())
    assert info.value.reason == "error"


def test_json_without_end_section_is_an_error() -> None:
    with pytest.raises(ProbeFailure, match="expected field"):
        parse('{"start": {}, "end": {}}', ThroughputTest())


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("unable to connect to server: No route to host", "unreachable"),
        ("unable to connect to server: Network is unreachable", "unreachable"),
        ("unable to connect to server: Connection timed out", "timeout"),
        ("test authorization failed", "not_allowed"),
        ("unable to receive control message: Connection reset by peer", "busy"),  # the server between two tests
        # The peer's admission killed its server as the test connected (before any interval).
        ("unable to write to stream socket: Connection reset by peer", "out_of_turn"),
        ("control socket has closed unexpectedly", "out_of_turn"),
        ("unable to initialize stream: Transport endpoint is not connected", "out_of_turn"),
        ("unable to write to stream socket: Broken pipe", "out_of_turn"),
        ("unable to connect stream: Connection refused", "out_of_turn"),
        ("unable to connect to server: Connection refused", "refused"),
        ("something new", "error"),
    ],
)
def test_classify_error(message: str, reason: str) -> None:
    assert classify_error(message) == reason


@pytest.mark.parametrize(
    "message", ["unable to write to stream socket: Connection reset by peer", "control socket has closed unexpectedly"]
)
def test_a_test_cut_after_its_first_interval_is_an_error_not_a_refusal(message: str) -> None:
    assert classify_error(message, started=True) == "error"
    doc = json.loads(load("tcp_2streams.json")) | {"error": message}
    with pytest.raises(ProbeFailure) as info:
        parse(json.dumps(doc), ThroughputTest())
    assert info.value.reason == "error"
    with pytest.raises(ProbeFailure) as info:
        parse(json.dumps(doc | {"intervals": []}), ThroughputTest())
    assert info.value.reason == "out_of_turn"


def test_command_line_carries_every_setting() -> None:
    t = ThroughputTest(
        protocol="udp",
        streams=4,
        direction="receive",
        duration_seconds=3,
        omit_seconds=1,
        udp_bitrate=400e6,
        window_bytes=4 << 20,
    )
    cmd = t.command(Target("198.18.2.2", 5202))
    assert cmd[:5] == ["iperf3", "-c", "198.18.2.2", "-p", "5202"]
    assert "-R" in cmd and "-u" in cmd
    # -b is per stream in iperf3: the configured total is split.
    assert cmd[cmd.index("-b") + 1] == "100000000"
    assert cmd[cmd.index("-P") + 1] == "4"
    assert cmd[cmd.index("-w") + 1] == str(4 << 20)
    assert "-C" not in cmd  # congestion control applies to TCP only
