"""iperf3 -J parsing, on outputs captured from real iperf3 3.12 runs; the command lines."""

import json
import logging
import subprocess
from pathlib import Path

import pytest

from pathprobe import iperf3
from pathprobe.config import Iperf3Auth, Iperf3Settings
from pathprobe.probes import ProbeFailure, Target
from pathprobe.probes.iperf3_test import ThroughputTest
from pathprobe.probes.throughput import classify_error, parse
from pathprobe.responders.iperf3 import server_command

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
    assert r.sender_rtt_seconds == pytest.approx((75 + 58) / 2 / 1e6)  # the streams' mean_rtt (us)


def test_tcp_reverse_keeps_direction() -> None:
    r = parse(load("tcp_reverse.json"), ThroughputTest(direction="receive"))
    assert r.direction == "receive"
    assert r.receiver_bytes_per_second == pytest.approx(100654035.83 / 8)
    assert r.sender_rtt_seconds is None  # reported as 0: not measured


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
def test_a_test_cut_after_its_first_second_is_an_error_not_a_refusal(message: str) -> None:
    assert classify_error(message, ran_seconds=1.0) == "error"
    assert classify_error(message, ran_seconds=0.3) == "out_of_turn"
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


def test_the_hosts_iperf3_version_is_read_from_the_binary(tmp_path: Path) -> None:
    said = subprocess.run(["iperf3", "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    assert iperf3.version("iperf3") == tuple(int(n) for n in said.split(".")[:2])
    assert iperf3.version("true") is None  # runs, says no version
    # A binary that is not there yet is read again when it is (an upgrade in progress at start).
    late = tmp_path / "iperf3"
    assert iperf3.version(str(late)) is None
    late.write_text("#!/bin/sh\necho 'iperf 3.20 (cJSON 1.7.15)'\n")
    late.chmod(0o755)
    assert iperf3.version(str(late)) == (3, 20)


# (client, server): whether each is given the option.
@pytest.mark.parametrize(
    ("found", "has_option", "legacy", "given"),
    [
        ((3, 18), True, True, (True, True)),  # a newer host in a fleet that still has older iperf3: the old padding
        ((3, 18), True, False, (False, False)),  # its own (OAEP)
        ((3, 20), True, True, (False, True)),  # from 3.20 the option is the server's only
        ((3, 12), False, True, (False, False)),  # older iperf3 has only PKCS#1, and no such option
        ((3, 16), True, True, (True, True)),  # a distribution's build with the change: what --help says counts
        (None, True, True, (False, True)),  # no version: the client is not given an option it may refuse
    ],
)
def test_authenticated_clients_and_servers_take_the_fleets_padding(
    monkeypatch: pytest.MonkeyPatch,
    found: tuple[int, int] | None,
    has_option: bool,
    legacy: bool,
    given: tuple[bool, bool],
) -> None:
    client, server = given
    monkeypatch.setattr(iperf3, "version", lambda _binary: found)
    monkeypatch.setattr(iperf3, "has_pkcs1_option", lambda _binary: has_option)
    auth = Iperf3Auth(
        username="u",
        password_file=Path("p"),
        public_key_file=Path("pub.pem"),
        private_key_file=Path("key.pem"),
        authorized_users_file=Path("users.csv"),
        legacy_rsa_padding=legacy,
    )
    test = ThroughputTest(username="u", public_key_file=Path("pub.pem"), legacy_rsa_padding=legacy)
    assert (iperf3.PKCS1_OPTION in test.command(Target("198.18.2.2", 5201))) is client
    assert (iperf3.PKCS1_OPTION in server_command(Iperf3Settings(auth=auth), "0.0.0.0")) is server
    level, line = iperf3.describe("iperf3", legacy)
    assert (level == logging.WARNING) is (server and not client), line


def test_a_test_marked_with_a_dscp_asks_iperf3_for_it() -> None:
    target = Target("198.18.2.2", 5201)
    assert "--dscp" not in ThroughputTest().command(target)  # CS0: the kernel's default, nothing to ask
    command = ThroughputTest(dscp=46).command(target)
    assert command[command.index("--dscp") + 1] == "46"


def test_the_intervals_and_cpu_are_kept_for_the_evidence() -> None:
    r = parse(load("tcp_2streams.json"), ThroughputTest(streams=2, duration_seconds=1, omit_seconds=0))
    [interval] = r.intervals
    assert interval["bits_per_second"] == pytest.approx(400510774.28, rel=1e-3)
    first = interval["streams"][0]
    assert (first["socket"], first["snd_cwnd"], first["rtt"]) == (5, 1178694, 75)
    assert r.iperf3_cpu_percent is not None and r.iperf3_cpu_percent["host_total"] == pytest.approx(4.536, rel=1e-3)
