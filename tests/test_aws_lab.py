"""The default lab behaves like AWS at its scale, and the exporter's model predicts it.

Each lab host with an instance type gets AWS's structure (pathprobe_lab/caps.py): a per-flow
cap, the instance's baseline with burst credits up to its peak, the inter-region aggregate.
The expected floor that the exporter computes for a path (the same function, the same
per-peer limits the lab writes into exporter configs, the RTT and buffers of the path)
must match what iperf3 measures once the credits are spent, 1 stream and 4.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import iperf3, measure_and_predict
from pathprobe_lab import net, topology
from pathprobe_lab.caps import host_caps
from pathprobe_lab.state import ROUTER, in_ns, iptables, ns, sh

pytestmark = pytest.mark.lab

TOPOLOGY = topology.load(None)
# Intra-region, inter-region, and both ways of the long path where the buffers bind.
PAIRS = [("tokyo-a", "tokyo-b"), ("tokyo-a", "osaka-a"), ("singapore-a", "tokyo-a"), ("tokyo-b", "singapore-a")]


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    net.up(TOPOLOGY)
    yield
    net.down()


# Alone: a rate predicted within 5% is the lab's path only with the machine to itself. One CI run
# read tokyo-a -> tokyo-b 12.9% low beside another lab, and two Transit Gateway paths out of bounds
# in the same minutes (what starved it is not known: beside busy loops or the lab's own tests, each
# row read within 3.1% here).
@pytest.mark.alone
@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_the_model_predicts_the_lab_within_5_percent(  # noqa: PLR0913, PLR0917 - pytest's fixtures and parameters
    lab: None, src: str, dst: str, streams: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured, e = measure_and_predict(TOPOLOGY, src, dst, streams, tmp_path)
    with capsys.disabled():
        print(
            f"\n{src} -> {dst} x{streams}: measured {measured / 1e6:.1f} Mbit/s, expected "
            f"{e.bits_per_second / 1e6:.1f} ({e.limit}), {measured / e.bits_per_second - 1:+.1%}"
        )
    assert measured == pytest.approx(e.bits_per_second, rel=0.05), (e.limit, e.candidates)


def test_a_host_bursts_on_its_credits_then_falls_to_its_baseline(lab: None) -> None:
    caps = host_caps(TOPOLOGY, TOPOLOGY.hosts[0])
    assert caps is not None and caps.baseline and caps.peak
    # Credits refill at the baseline while the host is idle; let the last test's be spent first.
    # 6 s: with two busy cores the host may spend its 64 MiB of credits well below its peak, over 3-4 s.
    result = iperf3(TOPOLOGY, "tokyo-a", "tokyo-b", 4, 6, 0)
    seconds = [i["sum"]["bits_per_second"] for i in result["intervals"]]
    assert seconds[0] > 1.3 * caps.baseline, seconds  # on credits
    # Spent: the baseline, over the last 3 s (credits last up to 4 s). A single second is not the
    # rate: one CI run read 626, 638, then 589 Mbit/s in the last second against 630.
    assert statistics.median(seconds[-3:]) == pytest.approx(caps.baseline, rel=0.05), seconds


def test_lab_status_shows_each_cap(lab: None) -> None:
    st = net.status()
    tokyo = next(h for h in st["hosts"] if h["name"] == "tokyo-a")
    assert tokyo["caps"]["per_flow"] == 500e6 and tokyo["caps"]["baseline"] == 630e6
    assert tokyo["caps"]["region_cap"] == 500e6 and tokyo["caps"]["peak"] == 2.5e9
    assert any(q.startswith("qdisc tbf 1: root") for q in tokyo["caps"]["qdiscs"]), tokyo["caps"]["qdiscs"]


def test_each_flow_of_a_test_gets_a_per_flow_leaf_of_its_own(lab: None) -> None:
    """Sixteen flows in 256 hashed leaves would share one about 4 tests in 10; dealt round-robin, never."""
    streams = 16
    before = leaf_bytes("tokyo-a")  # the module's earlier tests used leaves too: what this one adds counts
    iperf3(TOPOLOGY, "tokyo-a", "tokyo-b", streams, 1, 0)
    after = leaf_bytes("tokyo-a")
    # In-region leaves are 2:1000-2:10ff; a stream moves megabytes in a second, the control connection kilobytes.
    busy = [
        leaf
        for leaf, n in after.items()
        if re.fullmatch(r"2:10[0-9a-f]{2}", leaf) and n - before.get(leaf, 0) > 1_000_000
    ]
    assert len(busy) == streams, busy


def leaf_bytes(host: str) -> dict[str, int]:
    """Bytes sent by each HTB class of a host's eth0 (tc prints HTB classes as text only:
    "class htb 2:1003 parent ..." then " Sent N bytes ...")."""
    text = sh(["tc", "-n", ns(host), "-s", "class", "show", "dev", "eth0"]).stdout
    return {m[1]: int(m[2]) for m in re.finditer(r"^class htb (\S+) .*\n Sent (\d+) bytes", text, re.M)}


def test_a_capped_hosts_data_crosses_the_lab_in_gso_frames(lab: None) -> None:
    """The caps pass a sender's 64 KiB GSO frames whole, as a NIC's TSO would take them. A frame cut
    into MTU-sized packets (TBF splits one longer than its peak bucket) multiplies the packets that
    the delay line and the router forward: with two tests at once every path then queued for tens of
    ms, and a window-bound flow read a fifth below its floor."""
    before = forwarded("198.18.1.0/24", "198.18.3.0/24")
    iperf3(TOPOLOGY, "tokyo-a", "osaka-a", 1, 2, 0)
    after = forwarded("198.18.1.0/24", "198.18.3.0/24")
    packets, data = after[0] - before[0], after[1] - before[1]
    assert data > 50e6 and data / packets > 20 * 1514, (packets, data)


def forwarded(src: str, dst: str) -> tuple[int, int]:
    """Packets and bytes the router has queued to the delay line from `src` to `dst` (iptables counts
    a GSO frame as one packet)."""
    rules = sh(in_ns(ROUTER, [iptables(), "-L", "FORWARD", "-v", "-x", "-n"])).stdout.splitlines()
    row = next(r.split() for r in rules if "NFQUEUE" in r and src in r.split() and dst in r.split())
    return int(row[0]), int(row[1])
