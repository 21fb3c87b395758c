"""Every parser of what a peer or a client sends, fed random and corrupted input (hypothesis): the
rr and echo answers the probers read, the rr hello and the echo requests the responders read,
iperf3's JSON and a served test's report, HTTP request heads and Authorization headers, the web
config file. None raises out of its parser, none yields a figure no network could have produced,
and each refusal says why. Bounded: a fixed number of examples, derandomized."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pathprobe import stamps, webconfig, wire
from pathprobe.allow import AllowList
from pathprobe.ends import MAX_CPUS
from pathprobe.probe_settings import EchoSettings
from pathprobe.probes import ProbeFailure, Target, peer_end
from pathprobe.probes.base import REJECTIONS
from pathprobe.probes.echo import PLAUSIBLE_OFFSET_SECONDS, EchoProber, OneWay
from pathprobe.probes.iperf3_test import ThroughputTest
from pathprobe.probes.throughput import parse
from pathprobe.responders.echo import EchoResponder
from pathprobe.responders.rr import RrResponder
from pathprobe.web.http import Refusal, parse_head
from pathprobe.webconfig import _basic
from pathprobe.yamlfile import ConfigError

FUZZ = settings(
    max_examples=300,
    deadline=None,  # a busy machine varies the time per example; the total is bounded by max_examples
    derandomize=True,  # the same examples every run: a failure here is a bug, not bad luck
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
U64 = st.integers(0, 2**64 - 1)
NOW = time.time_ns()


class Figures:
    """An echo sink that checks every figure it is handed against what a network can give."""

    def __init__(self, sent: int) -> None:
        self.sent, self.rejections, self.lost_split = sent, [], (0, 0)

    def sent_(self, size: int) -> None: ...

    def received(
        self, rtt: float, age: float = 0.0, jitter: float | None = None, one_way: OneWay | None = None
    ) -> None:
        assert 0 < rtt < 10, rtt  # the timeout is 1 s; the stamps' elapsed bounds it
        assert jitter is None or 0 <= jitter < 10, jitter
        if one_way is not None:
            assert all(math.isfinite(v) for v in (one_way.forward, one_way.reverse, one_way.clocks_apart))
            assert one_way.peer_bound is None or 0 < one_way.peer_bound <= 10

    def clock_offset(self, seconds: float) -> None:
        assert abs(seconds) < PLAUSIBLE_OFFSET_SECONDS, seconds

    def lost_by_direction(self, forward: int, reverse: int) -> None:
        assert forward >= 0 and reverse >= 0 and forward + reverse <= self.sent, (forward, reverse, self.sent)
        self.lost_split = (forward, reverse)

    def rejected(self, reason: str, answered: bool = False) -> None:
        assert reason in REJECTIONS
        self.rejections.append(reason)

    def __getattr__(self, name: str) -> Any:  # sent, lost, duplicate, ...: counts the test does not check
        return lambda *args, **kwargs: None


def answers_of_a_real_responder(count: int) -> list[bytes]:
    """The real responder's answers to `count` echoes of 80 bytes (every field it fills)."""
    resp = EchoResponder(AllowList(["0.0.0.0/0"]), max_pps_per_source=1e9, count=lambda *_: None, bound=lambda: 1e-4)
    answers: list[bytes] = []
    resp.sendto = lambda data, addr, *_: answers.append(data)  # type: ignore[method-assign]
    for seq in range(count):
        resp.datagram_received(wire.echo_packet(seq, 80, NOW - 2_000_000), ("198.18.1.2", 4000))
    return answers


REAL = answers_of_a_real_responder(8)
CORRUPTIONS = st.lists(st.tuples(st.integers(0, 79), st.integers(0, 255)), max_size=12)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 7), CORRUPTIONS, st.booleans(), st.binary(max_size=100)), max_size=30))
def test_corrupted_echo_answers_never_raise_nor_make_an_impossible_figure(
    answers: list[tuple[int, list[tuple[int, int]], bool, bytes]],
) -> None:
    sink = Figures(sent=8)
    c = EchoProber(Target("198.18.1.2", 9470), EchoSettings(rate_pps=100, size_bytes=80, timeout_seconds=1), sink)
    sent_at = time.perf_counter() - 0.002
    for seq in range(8):
        c.track(seq, sent_at)
    for which, flips, garbage, noise in answers:
        data = bytearray(REAL[which])
        for at, value in flips:
            data[at] = value
        c.datagram_received(noise if garbage else bytes(data), ("198.18.1.2", 9470), arrived_ns=NOW)
    c._expire(time.perf_counter(), everything=True)
    c._account(force=True)


@FUZZ
@given(st.binary(max_size=2000))
def test_the_echo_responder_answers_any_datagram_with_one_no_larger_or_none(request: bytes) -> None:
    resp = EchoResponder(AllowList(["0.0.0.0/0"]), max_pps_per_source=1e9, count=lambda *_: None)
    answers: list[bytes] = []
    resp.sendto = lambda data, addr, *_: answers.append(data)  # type: ignore[method-assign]
    resp.datagram_received(request, ("198.18.1.2", 4000))
    assert len(answers) <= 1 and all(len(a) <= max(len(request), wire.ECHO_REFUSAL.size) for a in answers)


def rr_hello() -> st.SearchStrategy[bytes]:
    """Nine bytes as a hello: random, or the rr magic with any version and size."""
    return st.one_of(
        st.binary(min_size=9, max_size=9),
        st.builds(wire.RR_HELLO.pack, st.just(wire.RR_MAGIC), st.integers(0, 255), st.integers(0, 2**32 - 1)),
    )


@settings(FUZZ, max_examples=25)
@given(st.lists(rr_hello(), min_size=1, max_size=8))
def test_the_rr_responder_answers_any_hello_with_yes_only_for_a_valid_one_and_goes_on(hellos: list[bytes]) -> None:
    """A real rr responder on loopback, a connection per hello: Y for a valid hello (the rr magic,
    its version, a size within bounds), N counted as malformed for any other, and after them all a
    valid hello still gets its Y."""
    counted: list[str] = []

    def valid(hello: bytes) -> bool:
        magic, version, size = wire.RR_HELLO.unpack(hello)
        return magic == wire.RR_MAGIC and version == wire.RR_VERSION and 1 <= size <= wire.RR_MAX_SIZE

    async def go() -> list[bytes]:
        server = await RrResponder(AllowList(["127.0.0.0/8"]), 64, counted.append).start("127.0.0.1", 0)
        port = server.listener.getsockname()[1]
        replies = []
        try:
            for hello in [*hellos, wire.RR_HELLO.pack(wire.RR_MAGIC, wire.RR_VERSION, 64)]:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(hello)
                async with asyncio.timeout(5):
                    replies.append(await reader.read(1))
                writer.close()
        finally:
            server.close()
        return replies

    replies = asyncio.run(go())
    assert replies == [b"Y" if valid(h) else b"N" for h in hellos] + [b"Y"], (hellos, replies)
    assert counted.count("malformed") == sum(not valid(h) for h in hellos), counted


@FUZZ
@given(U64, U64, st.floats(1e-6, 10), U64)
def test_an_rr_answers_hold_makes_a_round_trip_within_its_elapsed_time_or_none(
    sent: int, arrived: int, elapsed: float, hold: int
) -> None:
    rtt = stamps.network_rtt(sent, arrived, elapsed, hold)
    assert rtt is None or 0 < rtt <= elapsed


def iperf3_document() -> st.SearchStrategy[Any]:
    """iperf3 -J's shape with any value where a figure goes."""
    value = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=5))
    figures = ("bits_per_second", "bytes", "retransmits", "packets", "lost_packets", "jitter_ms")
    summed = st.fixed_dictionaries({}, optional=dict.fromkeys(figures, value))
    stream = st.fixed_dictionaries({}, optional={"sender": st.fixed_dictionaries({}, optional={"mean_rtt": value})})
    end = st.fixed_dictionaries(
        {},
        optional={"sum_sent": summed, "sum_received": summed, "sum": summed, "streams": st.lists(stream, max_size=3)},
    )
    return st.one_of(
        st.fixed_dictionaries(
            {"end": end}, optional={"start": st.dictionaries(st.text(max_size=5), value), "error": value}
        ),
        st.recursive(value, lambda inner: st.lists(inner) | st.dictionaries(st.text(max_size=5), inner), max_leaves=10),
    )


@FUZZ
@given(iperf3_document(), st.sampled_from(["tcp", "udp"]))
def test_iperf3_json_gives_a_possible_result_or_a_failure_with_a_reason(doc: Any, protocol: str) -> None:
    try:
        result = parse(json.dumps(doc), ThroughputTest(protocol=protocol))
    except ProbeFailure as exc:
        assert exc.reason and exc.detail
        return
    assert math.isfinite(result.receiver_bytes_per_second) and result.receiver_bytes_per_second >= 0
    if result.udp_loss_ratio is not None:
        assert 0 <= result.udp_loss_ratio <= 1
    assert result.retransmits is None or result.retransmits >= 0


@FUZZ
@given(st.binary(max_size=300) | iperf3_document().map(lambda d: json.dumps(d).encode()))
def test_iperf3_output_that_is_no_json_is_a_failure(output: bytes) -> None:
    with pytest.raises(ProbeFailure) if output[:1] not in (b"{", b"[") else _maybe():
        parse(output, ThroughputTest())


class _maybe:
    def __enter__(self) -> None: ...

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return kind is ProbeFailure


def report_document() -> st.SearchStrategy[Any]:
    value = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=12))
    end = st.dictionaries(st.sampled_from(["runnable_ratio", "wait_ratio", "cpu_cores", "usable_cpus", "softirq_ratio",
                                           "udp_receive_drops", "iperf3_version", "processes", "quota_cpus", "cpus",
                                           "stream_threads", "steal_ratio"]), value)  # fmt: skip
    return st.fixed_dictionaries(
        {}, optional={"iperf3": st.dictionaries(st.sampled_from(["version", "ports"]), value | st.lists(value)),
                      "end": end | value, "ended_seconds_ago": value}
    )  # fmt: skip


@FUZZ
@given(report_document().map(lambda d: json.dumps(d).encode()) | st.binary(max_size=200))
def test_a_served_tests_report_gives_possible_figures_or_says_why_not(body: bytes) -> None:
    got = peer_end.parse(body, test_seconds=5)
    assert got.reported
    if got.end is None:
        return
    assert got.rejected is None
    e = got.end
    for share in (e.runnable_ratio, e.wait_ratio, e.softirq_ratio):
        assert share is None or 0 <= share <= 1.5
    assert e.steal_ratio is None or 0 <= e.steal_ratio <= 1
    for cpus in (e.cpu_cores, e.usable_cpus, e.quota_cpus):
        assert cpus is None or 0 <= cpus <= MAX_CPUS
    assert e.udp_receive_drops is None or e.udp_receive_drops >= 0


@FUZZ
@given(st.binary(max_size=300))
def test_an_http_request_head_parses_or_is_refused_with_a_reason(head: bytes) -> None:
    try:
        method, _, version, headers = parse_head(head + b"\r\n\r\n")
    except Refusal as exc:
        assert exc.reason and exc.status[:3] in ("400", "431")
        return
    assert method.isalpha() and version.startswith("HTTP/1.") and all(n == n.strip() and n for n, _ in headers)


@FUZZ
@given(st.text(max_size=200))
def test_an_authorization_header_gives_a_user_and_password_or_none(header: str) -> None:
    user, password = _basic(header)
    assert (user is None) == (password is None)


@FUZZ
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(max_size=25), inner), max_leaves=12)
       | st.fixed_dictionaries({}, optional={"tls_server_config": st.dictionaries(st.sampled_from(
           ["cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"]),
           st.text(max_size=20) | st.integers()), "basic_auth_users": st.dictionaries(st.text(max_size=8),
           st.text(max_size=60) | st.integers())}))  # fmt: skip
def test_a_web_config_file_loads_or_is_refused_naming_the_line(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "web.yml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    try:
        webconfig.load(path)
    except ConfigError as exc:
        assert str(path) in str(exc), exc
