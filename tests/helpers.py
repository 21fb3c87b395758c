"""Starting processes in lab hosts and reading their metrics, for the integration tests."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from prometheus_client.parser import text_string_to_metric_families

from pathprobe import ends, kernel
from pathprobe.config import Peer
from pathprobe.limits import Expected, expected, window_share
from pathprobe_lab.configs import exporter_config
from pathprobe_lab.state import NFT_TABLE, PREFIX, ROOT_LINK, ROUTER, State, in_ns, iptables, ns, spawn
from pathprobe_lab.topology import Topology, address

T = TypeVar("T")
PATHPROBE = [sys.executable, "-m", "pathprobe"]
DASHBOARDS_JSON = Path(__file__).parents[1] / "dashboards" / "json"


def topology(text: str) -> Topology:
    return Topology.model_validate(yaml.safe_load(text))


# Two hosts in each of three regions: the fleet tests' mesh (test_fleet_lab.py, test_rollout_chaos.py).
SIX_HOSTS_THREE_REGIONS = topology("""
hosts:
  - {name: a1, region: r1}
  - {name: a2, region: r1}
  - {name: b1, region: r2}
  - {name: b2, region: r2}
  - {name: c1, region: r3}
  - {name: c2, region: r3}
""")


def east_west(one_way_delay: str) -> str:
    """A topology file's text: hosts east and west in two regions, the path between them with that
    one-way delay (test_paths.py, and test_lab.py's second lab)."""
    return f"""
hosts:
  - {{name: east, region: r1}}
  - {{name: west, region: r2}}
paths:
  - {{between: [east, west], one_way_delay: {one_way_delay}}}
"""


# A server, one peer of it and a stranger: who may reach the server's iperf3 (test_firewall.py,
# test_iperf3_admission.py). The server is the second host.
PEER_SERVER_STRANGER = topology("""
hosts:
  - {name: peer, region: r}
  - {name: server, region: r}
  - {name: stranger, region: r}
""")


def in_host(host: str, cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(in_ns(ns(host), cmd), capture_output=True, text=True, timeout=timeout, check=False)


def router_nft(script: str) -> None:
    """Rules of a test's own on the lab's router (an impairment the lab has no verb for)."""
    subprocess.run(in_ns(ROUTER, ["nft", "-f", "-"]), input=script, text=True, check=True)


def clear_router_nft(table: str) -> None:
    """Empty a table router_nft made; it and its chains stay until `lab down`. Deleting a hooked
    chain would make the kernel flush every NFQUEUE queue of the router: every packet the delay
    line holds, on every path (see pathprobe_lab.shaping._loss)."""
    subprocess.run(in_ns(ROUTER, ["nft", "flush", "table", "inet", table]), check=False)


def clock_ahead(seconds: float) -> tuple[str, ...]:
    """A command prefix that runs a process with its wall clock `seconds` ahead, its monotonic
    clock true (as a clock offset chrony would have): libfaketime, preloaded directly, as
    exporter/tests/test_clock_skew.py says why. It moves the process's clock reads only, not
    the kernel's packet stamps."""
    return (
        "env",
        "LD_PRELOAD=/usr/$LIB/faketime/libfaketime.so.1",
        f"FAKETIME=+{seconds:g}s",
        "FAKETIME_DONT_FAKE_MONOTONIC=1",
        "NO_FAKE_STAT=1",
    )


def start_exporter(
    host: str, cfg: dict[str, Any], workdir: Path, prefix: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """`pathprobe run` in a lab host; `prefix`: a command to run it under (clock_ahead)."""
    path = workdir / f"{host}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = in_ns(ns(host), [*prefix, *PATHPROBE, "run", "--config", str(path)])
    return spawn(cmd, workdir / f"{host}.log", f"exporter {host}")


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(address: str, timeout: float = 5) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """Sum of the samples of `name` whose labels include `labels`; None when there are none."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    return sum(found) if found else None


def wait_for(what: str, check: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    """Poll `check` until it returns something other than None/False; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except OSError as exc:  # not up yet
            last_error = exc
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last error: {last_error})")


def payload_rate(link_bits_per_second: float, mtu: int = 1500) -> float:
    """TCP payload bytes/s through a shaper that counts whole Ethernet frames (MSS with timestamps)."""
    return link_bits_per_second / 8 * (mtu - 52) / (mtu + 14)


IPERF3_PORT = 5299  # the tests' own iperf3 servers, apart from the exporters'


def buffer_max(host: str, which: str) -> int:
    """The host's tcp_rmem or tcp_wmem max, read in its namespace."""
    return int(in_host(host, ["cat", f"/proc/sys/net/ipv4/tcp_{which}"]).stdout.split()[2])


def iperf3(topo: Topology, src: str, dst: str, streams: int, seconds: int, omit: int) -> dict[str, Any]:  # noqa: PLR0913, PLR0917 - iperf3's own options, in its order
    """One plain iperf3 test between two lab hosts (-J output)."""
    server = subprocess.Popen(
        in_ns(ns(dst), ["iperf3", "-s", "-1", "--forceflush", "-p", str(IPERF3_PORT)]), stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None and server.stdout.readline()  # "-----": listening
        dst_address = address([h.name for h in topo.hosts].index(dst) + 1)
        proc = in_host(
            src,
            [
                "iperf3",
                "-c",
                dst_address,
                "-p",
                str(IPERF3_PORT),
                "-P",
                str(streams),
                "-t",
                str(seconds),
                "-O",
                str(omit),
                "-J",
            ],
            timeout=seconds + omit + 30,
        )
        assert proc.returncode == 0, proc.stdout[-500:]
        result: dict[str, Any] = json.loads(proc.stdout)
        return result
    finally:
        server.wait(timeout=30)


# The most runs unstolen makes for the measurements it wants.
MAX_TESTS = 4
# How long, over a whole test session, unstolen waits for this VM's hypervisor to give its CPU back
# after a stolen run: here steal came in waves of 15-44% lasting minutes, between which it was 0.1-1%.
QUIET_WAIT_SECONDS = 600.0
_quiet_wait_left = [QUIET_WAIT_SECONDS]


def steal_now(seconds: float = 1.0) -> float:
    """The share of this VM's CPU its hypervisor took over the next `seconds`."""
    before = kernel.cpu_ticks()
    time.sleep(seconds)  # the span measured, not a wait for something to happen
    return ends.steal_share(before, kernel.cpu_ticks()) or 0.0


def wait_for_quiet() -> float:
    """Waits until a second's steal is below half of ends.STEAL_BOUND, within what is left of the
    session's QUIET_WAIT_SECONDS; returns the last second's steal."""
    started = time.monotonic()
    try:
        share = steal_now()
        while share >= ends.STEAL_BOUND / 2 and time.monotonic() - started < _quiet_wait_left[0]:
            share = steal_now()
        return share
    finally:
        _quiet_wait_left[0] = max(0.0, _quiet_wait_left[0] - (time.monotonic() - started))


def unstolen(measure: Callable[[], T], want: int = 1, least: int = 1) -> list[T]:
    """Up to `want` results of measure that ran while this VM's hypervisor left it nine tenths of its
    CPU, from up to MAX_TESTS runs. A run that lost more measured the VM, not the lab (the exporter
    judges its own tests so, ends.STEAL_BOUND): the next run waits for a quiet second first
    (wait_for_quiet). Fails naming each run's steal if fewer than `least` were clean."""
    clean: list[T] = []
    steal: list[float] = []
    while len(clean) < want and len(steal) < MAX_TESTS:
        if steal and steal[-1] >= ends.STEAL_BOUND:
            wait_for_quiet()
        before = kernel.cpu_ticks()
        result = measure()
        steal.append(ends.steal_share(before, kernel.cpu_ticks()) or 0.0)
        if steal[-1] < ends.STEAL_BOUND:
            clean.append(result)
    assert len(clean) >= least, (
        f"this VM's hypervisor took a tenth of its CPU in too many runs: steal {steal}; "
        f"{_quiet_wait_left[0]:.0f} s of the session's wait for a quiet CPU left"
    )
    return clean


def measure_and_predict(topo: Topology, src: str, dst: str, streams: int, workdir: Path) -> tuple[float, Expected]:
    """What iperf3 measures on a lab path once burst credits are spent (2 s left out: the 64 MiB
    are spent within them), and the floor the exporter's model expects for it: the same
    function, with the per-peer limits the lab writes into exporter configs, the RTT iperf3
    saw and both ends' buffers."""
    # The better of two tests: what the path carries, not what the two cores left over for the
    # Python delay line at that moment (one test in three read up to 11% low on a busy machine).
    # A test while this VM's hypervisor took a tenth of its CPU is not one of the two (unstolen).
    clean = unstolen(lambda: iperf3(topo, src, dst, streams, 4, 2), want=2)
    result = max(clean, key=lambda r: float(r["end"]["sum_received"]["bits_per_second"]))
    measured = float(result["end"]["sum_received"]["bits_per_second"])
    # A window-bound flow moves a window per round trip, so its rate is the window over the mean RTT
    # per round. iperf3's mean_rtt averages snapshots taken in time, which weight a long round by its
    # length: on a busy machine, where the delay line releases some packets late, it read a sender's
    # RTT high and the flow 8% above the window over it. The harmonic mean of the snapshots is the
    # mean per round.
    rtt = (
        statistics.harmonic_mean(
            [s["rtt"] for i in result["intervals"] for s in i["streams"] if not s["omitted"] and s["rtt"] > 0]
        )
        / 1e6
    )
    cfg = exporter_config(topo, src, workdir, 16.0)
    peer = Peer.model_validate(next(p for p in cfg["peers"] if p["name"] == dst))
    me = next(h for h in topo.hosts if h.name == src)
    e = expected(
        peer,
        me.instance_type,
        "tcp",
        streams,
        buffer_max(dst, "rmem"),
        rtt,
        sender_wmem_max=buffer_max(src, "wmem"),
        share=window_share(),
    )
    return measured, e


def output(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout


def root_leftovers() -> list[str]:
    """Anything of the lab's visible from the root namespace."""
    out = [n for n in output("ip", "netns", "list").split() if n.startswith(PREFIX)]
    if f" {ROOT_LINK}@" in output("ip", "link", "show"):
        out.append(ROOT_LINK)
    out += [r for r in output("ip", "route").splitlines() if "198.18." in r]
    if NFT_TABLE in output("nft", "list", "tables"):
        out.append("nft table")
    if "NFQUEUE" in output(iptables(), "-S"):
        out.append("iptables NFQUEUE rule")
    if State.file().exists():
        out.append("state file")
    return out


def dashboards() -> dict[str, dict]:
    """The committed dashboards' JSON, by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS_JSON.glob("*.json"))}


def panels(d: dict) -> list[dict]:
    """The panels that show something (rows only group them)."""
    return [p for p in d["panels"] if p["type"] != "row"]
