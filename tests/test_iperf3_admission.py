"""The iperf3 server of `pathprobe run` admits a peer in its turn only (iperf3.admit: turn):
a stranger's test and a peer's test outside its turn are cut as they connect and counted."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from helpers import PATHPROBE, PEER_SERVER_STRANGER, in_host, scrape, start_exporter, value, wait_for
from pathprobe import procs
from pathprobe.schedule import Schedule
from pathprobe_lab import net
from pathprobe_lab.topology import address

pytestmark = pytest.mark.lab

SERVER = address(2)  # the server of PEER_SERVER_STRANGER
SLOT = 16.0
SCHEDULE = Schedule.of(["peer", "server"], SLOT)  # what the server's exporter derives
METRICS = f"{SERVER}:9469"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    work = tmp_path_factory.mktemp("admission")
    net.up(PEER_SERVER_STRANGER)
    cfg = {
        "host": {"name": "server", "address": SERVER, "region": "r"},
        "peers": [{"name": "peer", "address": address(1), "region": "r", "path_class": "intra_region"}],
        "schedule": {"slot_seconds": SLOT, "jitter_seconds": 1, "timeout_margin_seconds": 3},
        # Only the responders matter here: the peer runs no exporter to probe.
        "probes": {
            "throughput": {"enabled": False},
            "rtt": {"enabled": False},
            "loss": {"enabled": False},
            "mtu": {"enabled": False},
        },
        "budget": {"state_file": str(work / "budget.json")},
    }
    exporter = start_exporter("server", cfg, work)
    wait_for("the server's iperf3", lambda: value(scrape(METRICS), "pathprobe_iperf3_server_up") == 1, timeout=30)
    yield
    procs.terminate(exporter.pid)
    net.down()


def within_turn_of(host: str) -> None:
    """Wait until `host`'s client turn of the current slot has 1.5 s behind it and 3 s ahead
    (the server's own turn is the peer's time out of turn)."""
    while True:
        now = time.time()
        turn = SCHEDULE.turn(host, int(now // SLOT))
        if turn is not None and turn.start + 1.5 <= now <= turn.end - 3:
            return
        time.sleep(0.1)


def measured_from(host: str) -> bool:
    probe = in_host(host, [*PATHPROBE, "probe", "throughput", SERVER, "--duration", "1s", "--omit", "0s"], timeout=60)
    return probe.returncode == 0


def iperf3_counts() -> dict[str, float | None]:
    got = scrape(METRICS)
    return {
        r: value(got, "pathprobe_responder_requests_total", responder="iperf3", result=r)
        for r in ("ok", "not_allowed", "out_of_turn")
    }


def test_a_peer_tests_in_its_turn_and_is_cut_outside_it(server: None) -> None:
    assert iperf3_counts() == {"ok": 0, "not_allowed": 0, "out_of_turn": 0}  # every outcome from zero
    assert value(scrape(METRICS), "pathprobe_iperf3_admission_info", admit="turn") == 1
    within_turn_of("peer")
    assert measured_from("peer"), "the peer's test in its turn failed"
    within_turn_of("server")
    assert not measured_from("peer"), "the peer's test outside its turn ran"
    counts = wait_for("the refusal counted", lambda: (c := iperf3_counts())["out_of_turn"] and c, timeout=10)
    assert counts == {"ok": 1, "not_allowed": 0, "out_of_turn": 1}


def test_a_strangers_test_is_cut_at_any_time(server: None) -> None:
    within_turn_of("peer")  # even while the peer's turn is on
    assert not measured_from("stranger"), "a stranger's test ran"
    wait_for("the stranger counted", lambda: iperf3_counts()["not_allowed"] == 1, timeout=10)
    within_turn_of("peer")  # the server is back for the peer
    assert measured_from("peer")
