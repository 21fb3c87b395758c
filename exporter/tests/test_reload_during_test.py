"""A member removed by a reload while this host's throughput test against it runs: the
test's result must not break /metrics. Real processes on loopback: `pathprobe run` (h0)
tests `pathprobe serve` (h1) with UDP; while the test runs, the config replaces h1 by h2
and SIGHUP applies it; after the test has ended, /metrics keeps answering 200 with a fresh
snapshot and nothing of h1."""

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from loopback_mesh import peers_shown, request, samples, serve, unused_port, wait_for

SLOT = 20.0  # one UDP test of 8 s and its margin in each half
TEST_SECONDS = 8.0
REFRESH = 5.0  # web.Snapshot's refresh: a snapshot older than two of them is stale


def iperf3_clients_of(pid: int) -> list[str]:
    """Command lines of the iperf3 clients that process `pid` runs now."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and "iperf3" in cmdline and " -c " in cmdline:
            found.append(cmdline)
    return found


@pytest.fixture
def h1(tmp_path: Path) -> Iterator[dict[str, object]]:
    ports = {"rr_port": unused_port(), "echo_port": unused_port(), "iperf3_port": unused_port()}
    proc = serve("127.0.0.2", ports)
    try:
        yield {"name": "h1", "address": "127.0.0.2", "region": "r2", "path_class": "inter_region", **ports}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def test_a_peer_removed_while_its_test_runs_leaves_metrics_answering(tmp_path: Path, h1: dict[str, object]) -> None:
    path, web = tmp_path / "pathprobe.yaml", unused_port()
    base = {
        "host": {"name": "h0", "address": "127.0.0.1", "region": "r1"},
        "peers": [h1],
        "probes": {
            "throughput": {
                "protocols": ["udp"],
                "streams": [1],
                "udp_bitrate": "10M",
                "duration_seconds": TEST_SECONDS,
                "omit_seconds": 0,
            },
            "rtt": {"interval_seconds": 0.5},
            "loss": {"rate_pps": 2},
            "mtu": {"enabled": False},
        },
        "schedule": {"slot_seconds": SLOT, "jitter_seconds": 0, "timeout_margin_seconds": 1},
        "responders": {"listen": "127.0.0.1", "rr_port": unused_port(), "echo_port": unused_port()},
        "iperf3": {"port": unused_port()},
        "web": {"listen": f"127.0.0.1:{web}"},
        "budget": {"state_file": str(tmp_path / "budget.json")},
    }
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    log = (tmp_path / "exporter.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pathprobe", "run", "--config", str(path)], stdout=subprocess.DEVNULL, stderr=log
    )
    try:
        wait_for(web, "first scrape", lambda got: ("pathprobe_schedule_members", frozenset()) in got)
        deadline = time.monotonic() + 2 * SLOT
        while not iperf3_clients_of(proc.pid):  # h0's turn against h1
            assert time.monotonic() < deadline, "no throughput test against h1 started"
            time.sleep(0.1)
        h2 = {"name": "h2", "address": "127.0.0.3", "region": "r2", "path_class": "inter_region"}
        path.write_text(yaml.safe_dump(base | {"peers": [h2]}, sort_keys=False))
        proc.send_signal(signal.SIGHUP)
        while iperf3_clients_of(proc.pid):  # the test against h1 runs to its end
            time.sleep(0.1)
        ended = time.monotonic()
        while time.monotonic() < ended + 3 * REFRESH:  # renders after the result landed
            status, _ = request(web, "GET", "/metrics")
            assert status == 200
            time.sleep(1)
        got = samples(web)
        assert not [labels for _, labels in got if ("peer", "h1") in labels]
        assert peers_shown(got) == {"h2"}
        assert got["pathprobe_scrape_snapshot_age_seconds", frozenset()] < 2 * REFRESH
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        log.seek(0)
        err = log.read()
        log.close()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
