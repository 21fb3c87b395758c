"""What the continuous probes see of a path in the lab: loss by direction, one failing
flow of several (an ECMP member), and a path MTU black hole. Real namespaces, the real
responder in one host and the real probers in another."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import PATHPROBE, clear_router_nft, east_west, in_host, router_nft, wait_for
from pathprobe import procs

pytestmark = pytest.mark.lab

TOPOLOGY = east_west("2ms")
EAST, WEST = "198.18.1.2", "198.18.2.2"  # the lab's addresses of its first and second host
PORT = 9470
ROUTER, WEST_ROUTER_LINK = "pp-router", "r2"  # the router namespace, and its side of west's link


def ns(host: str) -> str:
    return f"pp-{host}"


def lab_cli(*args: str) -> None:
    proc = subprocess.run([*PATHPROBE, "lab", *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("paths")
    (work / "topology.yaml").write_text(TOPOLOGY)
    lab_cli("up", "--topology", str(work / "topology.yaml"))
    log = (work / "west.log").open("w")
    responder = subprocess.Popen(
        ["ip", "netns", "exec", ns("west"), *PATHPROBE, "serve", "--listen", WEST, "--allow", "198.18.0.0/15"],
        stdout=log,
        stderr=log,
    )
    try:
        wait_for("the responder", lambda: "answering" in (work / "west.log").read_text(), timeout=30, every=0.2)
        yield work
    finally:
        procs.terminate(responder.pid)
        log.close()
        lab_cli("down")


def loss_probe(*args: str, timeout: float = 120) -> dict:
    proc = in_host("east", [*PATHPROBE, "probe", "loss", WEST, "--json", *args], timeout=timeout)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def test_loss_is_split_by_direction(lab: Path) -> None:
    lab_cli("impair", "east", "west", "--loss", "2%")  # east -> west only
    try:
        r = loss_probe("--count", "12000", "--rate", "1000/s")
    finally:
        lab_cli("restore", "east", "west")
    sent = r["sent"]
    assert 0.015 <= r["lost_forward"] / sent <= 0.025, r
    assert r["lost_reverse"] / sent < 0.003, r


def test_one_dead_flow_shows_as_a_failing_flow(lab: Path) -> None:
    # The prober's 8 sockets get their source ports when it starts: drop everything one of
    # them sends, as a broken member of an ECMP group would for the flows hashed onto it.
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns("east"),
            *PATHPROBE,
            "probe",
            "loss",
            WEST,
            "--json",
            "--count",
            "1600",
            "--rate",
            "100/s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def ports() -> list[int] | None:
            out = in_host("east", ["ss", "-uanH", "dst", f"{WEST}:{PORT}"]).stdout
            found = sorted({int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()})
            return found if len(found) == 8 else None

        victim = wait_for("the prober's 8 flows", ports, timeout=20, every=0.1)[3]
        # Dropped on the way (the router), not at the sender (where send() would fail with EPERM).
        router_nft(
            f"table inet ecmp {{\n chain member {{\n type filter hook forward priority 0\n"
            f" udp sport {victim} drop\n }}\n}}\n"
        )
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        clear_router_nft("ecmp")
    r = json.loads(out)
    assert r["flows_failing"] == 1, r
    assert r["worst_flow_loss_ratio"] == 1.0, r
    assert r["lost"] / r["sent"] < 0.15, r  # the path's total loss alone (1/8 at most) would not say it


MTU_SCRIPT = """
import asyncio, json, sys
from pathprobe.probe_settings import MtuSettings
from pathprobe.probes import MtuProber, Target
seen = []
class Sink:
    def mtu(self, size, carried, reason): seen.append([size, carried, reason])
prober = MtuProber(Target(sys.argv[1], int(sys.argv[2])), MtuSettings(timeout_seconds=1, sizes=[1400, 1500]), Sink())
asyncio.run(prober.run(rounds=1))
print(json.dumps(seen))
"""


def mtu_probe() -> list[list[object]]:
    proc = in_host("east", [PATHPROBE[0], "-c", MTU_SCRIPT, WEST, str(PORT)])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_lowered_mtu_is_seen_and_a_black_hole_too(lab: Path) -> None:
    assert mtu_probe() == [[1400, True, None], [1500, True, None]]
    subprocess.run(["ip", "-n", ROUTER, "link", "set", WEST_ROUTER_LINK, "mtu", "1450"], check=True)
    try:
        # The router says "fragmentation needed": counted with that reason.
        assert mtu_probe() == [[1400, True, None], [1500, False, "fragmentation_needed"]]
        # It no longer says so (its ICMP filtered as it leaves): a black hole, seen as a timeout.
        # The probe ignores the MTU the host learnt from the ICMP above (IP_PMTUDISC_PROBE).
        router_nft(
            "table inet pmtu {\n chain out {\n type filter hook output priority 0\n"
            " icmp type destination-unreachable icmp code frag-needed drop\n }\n}\n"
        )
        assert mtu_probe() == [[1400, True, None], [1500, False, "timeout"]]
    finally:
        subprocess.run(["ip", "-n", ROUTER, "link", "set", WEST_ROUTER_LINK, "mtu", "1500"], check=False)
        clear_router_nft("pmtu")
