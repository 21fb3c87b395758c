"""The host's own TCP flows in the lab: a real bulk transfer (Python's http.server on west, curl
on east; the lab hosts run no sshd) over a 74 ms path, read by `pathprobe flows` on the sending
host. With a small default receive buffer (tcp_rmem max 1 MiB) the flow is receive-window
limited and the command names the tcp_rmem max that lifts it; with the buffers raised it runs past
the target rate and the command names no setting; with 1% of the transfer's packets dropped on
the router (its port only) its retransmits show, in the command and on the sending host's
exporter under the peer's name, while the probes' loss does not."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import (
    PATHPROBE,
    clear_router_nft,
    east_west,
    in_host,
    router_nft,
    scrape,
    start_exporter,
    topology,
    value,
    wait_for,
)
from pathprobe import procs
from pathprobe_lab.configs import exporter_config

pytestmark = pytest.mark.lab

EAST, WEST = "198.18.1.2", "198.18.2.2"
HTTP = 8080
# A small host's default receive buffer: at 74 ms its window (half of it) carries about 57 Mbit/s,
# well below what the lab's delay line carries. Amazon Linux 2023's 6 MiB would carry about 340
# Mbit/s, about what the delay line does: there the kernel reads the flow as cwnd-limited as often.
DEFAULT_RMEM = "4096 131072 1048576"
DELIVERY = re.compile(r"delivery_rate ([\d.]+)([KMG]?)bps")
TUNED = "4096 131072 134217728"


def ns(host: str) -> str:
    return f"pp-{host}"


def lab_cli(*args: str) -> None:
    proc = subprocess.run([*PATHPROBE, "lab", *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def sysctl(host: str, name: str, value: str) -> None:
    proc = in_host(host, ["sysctl", "-w", f"{name}={value}"])
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("flows")
    (work / "topology.yaml").write_text(east_west("37ms"))
    (work / "big").write_bytes(b"")
    with (work / "big").open("r+b") as f:
        f.truncate(4 << 30)  # sparse: 4 GiB the server reads as zeros, more than any test moves
    lab_cli("up", "--topology", str(work / "topology.yaml"))
    log = (work / "west.log").open("w")
    server = subprocess.Popen(
        ["ip", "netns", "exec", ns("west"), sys.executable, "-m", "http.server", str(HTTP), "--bind", WEST],
        cwd=work,
        stdout=log,
        stderr=log,
    )
    responder = subprocess.Popen(
        ["ip", "netns", "exec", ns("east"), *PATHPROBE, "serve", "--listen", EAST, "--allow", "198.18.0.0/15"],
        stdout=log,
        stderr=log,
    )
    try:
        wait_for(
            "the HTTP server", lambda: in_host("east", ["curl", "-sI", f"http://{WEST}:{HTTP}/big"]).returncode == 0, 30
        )
        yield work
    finally:
        procs.terminate(server.pid)
        procs.terminate(responder.pid)
        log.close()
        lab_cli("down")


def delivery_rate(ss_line: str) -> float:
    """The delivery rate (bit/s) `ss -tinH` shows for a socket ("delivery_rate 1.2Gbps"), 0 if none."""
    found = DELIVERY.search(ss_line)
    return float(found[1]) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[found[2]] if found else 0.0


def transfer_flows(seconds: float = 60.0, past: float | None = None) -> list[dict]:
    """west's flows to east while east downloads (after 3 s of slow start, or once the flow has
    delivered at `past` bit/s), as `pathprobe flows` on west reads them over 2 s. The download is
    stopped once the read is done (`seconds` bounds it): a download of fixed length could end
    before the command, slow to start on a busy machine, read."""
    curl = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns("east"),
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "--max-time",
            f"{seconds:g}",
            f"http://{WEST}:{HTTP}/big",
        ],
    )
    try:

        def sending() -> str:
            return in_host("west", ["ss", "-tnH", "sport", f"= :{HTTP}"]).stdout.strip()

        wait_for("the transfer", sending, 10, 0.1)
        if past is None:
            time.sleep(3)  # a time, not a state: slow start at 74 ms reaches a 6 MiB window within it
        else:  # a state: the window has grown to carry it (autotuning follows the receiver's reads)
            line = ["ss", "-tinH", "sport", f"= :{HTTP}"]
            wait_for(f"the transfer at {past:g} bit/s", lambda: delivery_rate(in_host("west", line).stdout) > past, 30)
        proc = in_host("west", [*PATHPROBE, "flows", "--to", EAST, "--seconds", "2s", "--rate", "1G", "--json"])
        assert proc.returncode == 0, proc.stderr
    finally:
        procs.terminate(curl.pid)
        curl.wait(timeout=10)
    found = [f for f in json.loads(proc.stdout)["flows"] if f["local"].endswith(f":{HTTP}")]
    assert len(found) == 1, proc.stdout + in_host("west", ["ss", "-tniH"]).stdout
    return found


def test_default_buffers_read_receive_window_limited_with_the_figure(lab: Path) -> None:
    sysctl("east", "net.ipv4.tcp_rmem", DEFAULT_RMEM)
    flows = transfer_flows()
    assert len(flows) == 1, flows
    flow = flows[0]
    assert 0.07 < flow["rtt_seconds"] < 0.2, flow
    assert flow["limit"] == "receive_window", flow
    # 1 Gbit/s at the flow's RTT over half the buffer in flight: about 18 MiB, more than the 1 MiB.
    assert flow["needed_bytes"] > 1048576 * 8, flow
    assert "net.ipv4.tcp_rmem max >=" in flow["setting"], flow


def test_tuned_buffers_lift_the_flow_past_the_target(lab: Path) -> None:
    sysctl("east", "net.ipv4.tcp_rmem", TUNED)
    sysctl("west", "net.ipv4.tcp_wmem", TUNED)
    try:
        flows = transfer_flows(past=1e9)
    finally:
        sysctl("east", "net.ipv4.tcp_rmem", DEFAULT_RMEM)
    assert len(flows) == 1, flows
    # Beyond the target rate (1 Gbit/s) the buffers are not what holds it back: no setting named.
    # (The receiver's autotuned window may still be what bounds the bytes in flight at this rate.)
    assert flows[0]["bits_per_second"] > 1e9, json.dumps(flows[0])
    assert flows[0]["setting"] == "", json.dumps(flows[0])


def test_loss_on_the_transfer_shows_as_its_retransmits_not_the_probes_loss(lab: Path) -> None:
    """`pathprobe flows` and a loss probe beside the transfer, and west's exporter, which reads the
    flows every second and probes east: the applications' retransmits rise on its /metrics, under
    the peer's name, while its own probes of the same path lose nothing."""
    cfg = exporter_config(topology(east_west("37ms")), "west", lab, 16.0, {"throughput": {"enabled": False}})
    cfg["flows"] = {"interval_seconds": 1}
    exporter = start_exporter("west", cfg, lab)
    metrics = cfg["web"]["listen"]
    try:
        wait_for(
            "west's first read of its flows", lambda: value(scrape(metrics), "pathprobe_tcp_flows_reads_total"), 30
        )
        router_nft(
            "table inet flowsdrill {\n chain lossy {\n type filter hook forward priority 0\n"
            f" tcp sport {HTTP} numgen random mod 100 == 0 drop\n }}\n}}\n"
        )
        try:
            flows = transfer_flows()
            probe = in_host("west", [*PATHPROBE, "probe", "loss", EAST, "--json", "--count", "1000", "--rate", "200/s"])
        finally:
            clear_router_nft("flowsdrill")
        # /metrics is a snapshot rendered every few seconds: the reads during the transfer show within 30 s.
        retransmits = "pathprobe_tcp_flows_retransmitted_segments_total"
        got = wait_for(
            "west's count of the transfer's retransmits", lambda: value(scrape(metrics), retransmits, peer="east"), 30
        )
        lost = value(scrape(metrics), "pathprobe_udp_packets_lost_total", peer="east") or 0
    finally:
        procs.terminate(exporter.pid)
        exporter.wait(timeout=15)
    assert len(flows) == 1, flows
    assert flows[0]["retransmitted"] > 0, flows[0]
    assert probe.returncode == 0, probe.stderr
    loss = json.loads(probe.stdout)
    assert loss["lost_forward"] + loss["lost_reverse"] <= 2, loss
    assert got > 0
    assert lost <= 2, f"west's echoes to east lost {lost} packets"
