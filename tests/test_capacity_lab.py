"""`pathprobe capacity` against real shaped paths in the lab."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import PATHPROBE, in_host, payload_rate, topology
from pathprobe_lab import net
from pathprobe_lab.configs import LAB_CLOCK_ERROR_BOUND
from pathprobe_lab.state import in_ns, ns
from pathprobe_lab.topology import address

pytestmark = pytest.mark.lab

TOPOLOGY = topology("""
hosts:
  - {name: near, region: ap-northeast-1}
  - {name: far, region: ap-northeast-3, tcp_rmem_max: 1048576}
  - {name: wide, region: ap-northeast-3}
paths:
  - {between: [near, far], rate: 1G, one_way_delay: 10ms}
  - {between: [near, wide], rate: 300M, one_way_delay: 1ms}
""")
# The hosts name no instance type, so the lab shapes only the paths; the review is given
# c6gn.medium's figures at the lab's scale (AWS Gbps as Gbit/s / 10), between regions.
SCALED = ["--limit", "per_flow=500M", "--limit", "instance=1.6G", "--limit", "region_cap=500M"]
# The lab's hosts share one kernel clock: each end states the lab's bound, so one-way delays are exact.
CLOCK = ["--clock-error-bound", f"{LAB_CLOCK_ERROR_BOUND * 1e6:g}us"]
COMMON = [
    *SCALED,
    "--instance-type",
    "c6gn.medium",
    "--peer-instance-type",
    "c6gn.medium",
    "--duration",
    "3s",
    "--omit",
    "1s",
    *CLOCK,
]


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    net.up(TOPOLOGY)
    servers = []
    for host in ("far", "wide"):
        s = subprocess.Popen(
            in_ns(ns(host), [*PATHPROBE, "serve", "--allow", "198.18.0.0/15", *CLOCK]),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert s.stdout is not None and s.stdout.readline()  # ready
        servers.append(s)
    yield
    for s in servers:
        s.terminate()
        s.wait(timeout=10)
    net.down()


def capacity(*args: str) -> subprocess.CompletedProcess[str]:
    return in_host("near", [*PATHPROBE, "capacity", *args], timeout=300)


def test_small_receive_buffer_is_diagnosed_and_predicted(lab: None, tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    # 6 s, not 3: one flow on this shared 2-core VM now and then dips for a second (CI once read
    # 18% low over 3 s; alone it reads 1-3% below the prediction).
    proc = capacity(
        address(2),
        "--streams",
        "1,4",
        "--receiver-rmem",
        "1Mi",
        "--json",
        "--report",
        str(html),
        *COMMON,
        "--duration",
        "6s",
    )
    assert proc.returncode == 0, proc.stderr
    review = json.loads(proc.stdout)
    one = review["rows"][0]
    assert one["expected_limit"] == "receive_window"
    assert review["diagnosis"]["one_stream"].startswith(
        "one flow is bound by the receive window: tcp_rmem max 1 MiB at 20"
    )
    # The predicted one-flow bound (1 MiB x in-flight share x 8 / RTT) within 15% of what one flow
    # does, at the RTT the flow saw: a window-bound flow runs at its window over that RTT, which
    # grows when the lab's delay line runs late (this VM's host takes its CPUs at times: a CI run at
    # 12-32% steal read 15.7% under the bound at the idle RTT, the flow's own RTT not recorded then).
    # The lab's configured delay has its own check in test_lab.py.
    idle, loaded = review["rtt_seconds"], one["rtt_under_load_seconds"]
    at_loaded_rtt = one["expected_bits_per_second"] * idle / loaded
    print(
        f"\none flow: {one['bits_per_second'] / 1e6:.1f} Mbit/s; bound {one['expected_bits_per_second'] / 1e6:.1f} "
        f"at the idle RTT {idle * 1e3:.2f} ms, {at_loaded_rtt / 1e6:.1f} at the flow's "
        f"{loaded * 1e3:.2f} ms"
    )
    assert loaded >= idle * 0.98, "a flow saw a shorter RTT than the idle path's"
    assert one["bits_per_second"] == pytest.approx(at_loaded_rtt, rel=0.15)
    page = html.read_text()
    assert "<svg" in page and "receive window" in page


def test_shaped_path_knee_and_transfer_time(lab: None) -> None:
    proc = capacity(address(3), "--streams", "1,2,4", "--volume", "1GB", "--price-per-gb", "0.09", "--json", *COMMON)
    assert proc.returncode == 0, proc.stderr
    review = json.loads(proc.stdout)
    rates = [r["bits_per_second"] for r in review["rows"]]
    link_payload_bits = payload_rate(300e6) * 8
    assert all(r == pytest.approx(link_payload_bits, rel=0.05) for r in rates), rates
    assert review["knee_streams"] == 1
    at_knee = review["transfer_at_knee"]
    assert at_knee["seconds"] == pytest.approx(1e9 * 8 / link_payload_bits, rel=0.05)
    assert at_knee["cost"] == pytest.approx(0.09)
    # The delay line's 1 ms each way, within 0.2 ms (the responder's stretch from its clock read to
    # its send is in the way back), as both ends' bounds allow.
    one_way = review["one_way"]
    assert one_way["untrusted"] is None and one_way["error_bound_seconds"] == pytest.approx(2 * LAB_CLOCK_ERROR_BOUND)
    for direction in ("forward_seconds", "reverse_seconds"):
        assert one_way[direction]["p50"] == pytest.approx(0.001, abs=0.0002), one_way


def test_a_sweep_over_the_byte_limit_is_refused_before_sending(lab: None) -> None:
    proc = capacity(address(3), "--streams", "1,8,64", "--max-bytes", "100MB", *COMMON)
    assert proc.returncode == 2
    assert "may move up to" in proc.stderr and "over --max-bytes 0.1 GB" in proc.stderr
    assert proc.stdout == ""
