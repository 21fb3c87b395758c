"""A hostile peer beside a real exporter: a responder of pathprobe's own rr and echo protocols that
corrupts, at random, every field of its answers (holds, follow-ups, counts, clocks, bounds), cuts
some short, sends some twice and some as noise. The exporter's series for that peer stay within
what a network can give, its counters grow only by what was sent, the rejections are counted on
/metrics by reason, each logged at most once a minute, and it goes on answering scrapes."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from loopback_mesh import count, exporter, samples, until, unused_port

from pathprobe import wire
from pathprobe.allow import AllowList
from pathprobe.responders.echo import EchoResponder

HOSTILE = "127.0.0.2"
SEED = 20261201


def corrupt_echo(answer: bytes, rng: random.Random) -> list[bytes]:
    """The datagrams a hostile responder sends for one honest answer."""
    data = bytearray(answer)
    fields = [
        (wire.ECHO_HOLD_OFFSET, wire.HOLD, [2**63, 5 * 10**9, rng.getrandbits(64)]),  # the hold
        (wire.ECHO_HOLD_OFFSET + 8, wire.HOLD, [2**64 - 1, rng.getrandbits(64), 1]),  # the received count
        (wire.ECHO_CLOCKS_OFFSET, wire.HOLD, [rng.getrandbits(64), 0]),  # its clock as it took the request
        (wire.ECHO_CLOCKS_OFFSET + 8, wire.HOLD, [rng.getrandbits(64)]),  # and as it answered
        (wire.ECHO_BOUND_OFFSET, wire.HOLD, [2**63, rng.getrandbits(64)]),  # its clock error bound
        (wire.ECHO_FOLLOW_UP_OFFSET, wire.ECHO_FOLLOW_UP, None),  # the follow-up of the answer before
    ]
    for offset, shape, values in fields:
        if rng.random() < 0.25 and offset + shape.size <= len(data):
            if values is None:
                wire.ECHO_FOLLOW_UP.pack_into(data, offset, rng.getrandbits(64), rng.getrandbits(64))
            else:
                shape.pack_into(data, offset, rng.choice(values))
    if rng.random() < 0.05:
        return [bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 100)))]  # noise
    if rng.random() < 0.05:
        return [bytes(data[: rng.randrange(1, len(data))])]  # cut short
    return [bytes(data)] * (2 if rng.random() < 0.05 else 1)


class HostileEcho(EchoResponder):
    def __init__(self, rng: random.Random) -> None:
        super().__init__(AllowList(["127.0.0.0/8"]), max_pps_per_source=1e9, count=lambda *_: None, bound=lambda: 1e-4)
        self.rng = rng

    def sendto(self, data: bytes | bytearray, addr: Any, ancillary: Any = None, answer: Any = None) -> None:
        for datagram in corrupt_echo(bytes(data), self.rng):
            super().sendto(datagram, addr, ancillary, answer)


async def hostile_rr(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rng: random.Random) -> None:
    """rr answers with holds beyond any round trip, follow-ups of any size, and a hello now and
    then answered with neither Y nor N."""
    try:
        _, _, size = wire.RR_HELLO.unpack(await reader.readexactly(wire.RR_HELLO.size))
        if rng.random() < 0.1:
            writer.write(b"?")
            return
        writer.write(b"Y")
        while True:
            request = bytearray(await reader.readexactly(size))
            hold = rng.choice([0, 0, 2**63, 10 * 10**9, rng.getrandbits(64)])
            if size >= wire.RR_FOLLOW_UP.size and rng.random() < 0.5:
                wire.RR_FOLLOW_UP.pack_into(request, 0, rng.getrandbits(64))
            writer.write(bytes(request) + wire.HOLD.pack(hold))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@pytest.fixture
def hostile_peer() -> Iterator[tuple[int, int]]:
    """The hostile responder on its own event loop, in a thread: its rr and echo ports."""
    rr_port, echo_port = unused_port(), unused_port()
    loop, started = asyncio.new_event_loop(), threading.Event()

    async def serve() -> None:
        rng = random.Random(SEED)
        await HostileEcho(rng).start(HOSTILE, echo_port)
        await asyncio.start_server(lambda r, w: hostile_rr(r, w, rng), HOSTILE, rr_port)
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    yield rr_port, echo_port
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_a_hostile_peers_answers_never_become_impossible_figures(tmp_path: Path, hostile_peer: tuple[int, int]) -> None:
    rr_port, echo_port = hostile_peer
    web = unused_port()
    cfg = {
        "host": {"name": "honest", "address": "127.0.0.1", "region": "r1"},
        "peers": [
            {
                "name": "hostile",
                "address": HOSTILE,
                "region": "r2",
                "path_class": "inter_region",
                "rr_port": rr_port,
                "echo_port": echo_port,
            }
        ],
        "probes": {
            "throughput": {"enabled": False},
            "rtt": {"interval_seconds": 0.05},
            "loss": {"rate_pps": 50},
            "mtu": {"enabled": False},
        },
        "responders": {"listen": "127.0.0.1", "rr_port": unused_port(), "echo_port": unused_port()},
        "iperf3": {"port": unused_port()},
        "web": {"listen": f"127.0.0.1:{web}"},
        "budget": {"state_file": str(tmp_path / "budget.json")},
        "clock": {"source": "stated", "error_bound_seconds": 1e-6},
    }
    path, log = tmp_path / "honest.yaml", tmp_path / "honest.log"
    path.write_text(yaml.safe_dump(cfg))
    rejected = "pathprobe_probe_answers_rejected_total"
    reasons = ("hold_beyond_rtt", "follow_up_out_of_bounds", "clock_implausible", "bound_implausible")
    with exporter(path, log):

        def all_rejected() -> dict | None:
            got = samples(web)
            return got if all(count(got, rejected, reason=r) for r in reasons) else None

        first = until("every kind of corruption rejected", all_rejected, seconds=60)
        time.sleep(5)  # a second scrape, 5 s on: what the counters grew by meanwhile
        second = samples(web)
    for got in (first, second):
        sent = count(got, "pathprobe_udp_packets_sent_total", peer="hostile")
        lost = count(got, "pathprobe_udp_packets_lost_total", peer="hostile")
        forward = count(got, "pathprobe_udp_packets_lost_forward_total", peer="hostile")
        reverse = count(got, "pathprobe_udp_packets_lost_reverse_total", peer="hostile")
        assert sent > 0 and 0 <= lost <= sent and 0 <= forward + reverse <= sent, (sent, lost, forward, reverse)
        for (name, labels), value in got.items():
            if dict(labels).get("peer") != "hostile":
                continue
            if name in ("pathprobe_rtt_seconds", "pathprobe_owd_seconds"):
                assert 0 < value < 1, (name, labels, value)  # a quantile of a loopback path's delays
            if name == "pathprobe_clock_offset_seconds":
                # One clock: an offset taken from sane exchanges errs by at most half their round trip,
                # which the delays above bound at 1 s (a starved test machine's least-delayed echoes
                # read 0.22 s once); a corrupt clock is centuries off.
                assert abs(value) < 0.5, value

    def grew(name: str) -> float:
        return count(second, name, peer="hostile") - count(first, name, peer="hostile")

    assert 0 <= grew("pathprobe_udp_packets_lost_total") <= grew("pathprobe_udp_packets_sent_total")
    assert grew("pathprobe_udp_packets_lost_forward_total") + grew("pathprobe_udp_packets_lost_reverse_total") >= 0
    for probe in ("rtt", "loss"):
        assert count(second, rejected, probe=probe, reason="hold_beyond_rtt") > 0
    assert (
        count(second, rejected, probe="loss", reason="count_beyond_sent")
        + count(second, rejected, probe="loss", reason="count_not_monotonic")
        > 0
    )
    # Logged at most once a minute per probe and peer: within the test's minute, one line each.
    lines = [line for line in log.read_text().splitlines() if "answer from hostile not taken" in line]
    assert 1 <= len(lines) <= 2, lines
