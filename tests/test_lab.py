"""`pathprobe lab`: builds real paths, measures what it configures, leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import PATHPROBE, east_west, in_host, payload_rate, root_leftovers, topology, unstolen, wait_for
from pathprobe import procs
from pathprobe_lab import shaping
from pathprobe_lab.state import ROUTER, STATE_DIR, State, in_ns, ns
from pathprobe_lab.topology import address

pytestmark = pytest.mark.lab

# That the configured delay is what is measured, to a few ms (a 20 ms step is what impair
# changes). The fidelity target (0.5 ms + 2%) is bench/lab_fidelity.py's: it is marginal for
# the Python prober, and a test asserting it failed once under CI load (41.6 ms for 40). The tests
# of what the lab's paths measure run alone (beside another lab's gigabit transfer one read 24.8 ms
# for 20 and a restored 300 Mbit/s path at 108), and a measurement is taken from a run this VM's
# hypervisor left its CPU (unstolen).
RTT_TOLERANCE = 0.003

TOPOLOGY = """
hosts:
  - {name: east, region: r1, congestion: cubic}
  - {name: west, region: r2, congestion: cubic}
  - {name: north, region: r3}
paths:
  - {between: [east, west], rate: 300M, one_way_delay: 10ms}
"""


def lab(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*PATHPROBE, "lab", *args], capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture
def lab_up(tmp_path: Path) -> Iterator[Path]:
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    lab("up", "--topology", str(topo))
    yield topo
    lab("down")


@pytest.fixture
def serving(lab_up: Path) -> Iterator[None]:
    """`pathprobe serve` (iperf3 server, TCP RR, UDP echo) on host west."""
    serve = subprocess.Popen(
        in_ns(ns("west"), [*PATHPROBE, "serve", "--allow", "198.18.0.0/15"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert serve.stdout is not None and b"pathprobe serve" in serve.stdout.readline()  # ready
    yield
    serve.terminate()
    assert serve.wait(timeout=10) == 0


def probe_once(src: str, dst_index: int, *args: str) -> dict[str, Any]:
    """`pathprobe probe KIND ... --json` from src to a host: its report."""
    proc = in_host(src, [*PATHPROBE, "probe", args[0], address(dst_index), *args[1:], "--json"])
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def probe(src: str, dst_index: int, *args: str) -> dict[str, Any]:
    """probe_once's report from a run this VM's hypervisor left its CPU."""
    return unstolen(lambda: probe_once(src, dst_index, *args))[0]


def rtt_p50(src: str, dst_index: int, kind: str = "rtt") -> float:
    # Back to back (interval below the RTT), as netperf TCP_RR: the warm case; bench/lab_fidelity.py
    # measures the cold one.
    pace = ["-i", "5ms"] if kind == "rtt" else ["--rate", "200/s"]
    return float(probe(src, dst_index, kind, "-c", "100", *pace)["rtt_seconds"]["p50"])


def throughput(src: str, dst_index: int) -> float:
    return float(probe(src, dst_index, "throughput", "-t", "3s", "-O", "1s")["receiver_bytes_per_second"])


def test_up_then_down_leaves_nothing(lab_up: Path) -> None:
    status = json.loads(lab("status", "--json").stdout)
    assert status["up"] and status["router_present"]
    assert all(h["present"] for h in status["hosts"])
    pids = [p["pid"] for p in status["processes"]]
    assert pids and all(p["alive"] for p in status["processes"])
    lab("down")
    assert root_leftovers() == []
    assert not any(procs.alive(pid) for pid in pids)
    again = lab("down")  # idempotent
    assert "lab is down" in again.stdout


def test_down_cleans_up_after_a_crashed_up() -> None:
    # What a `lab up` killed half-way leaves: namespaces, a process inside one, no state file.
    subprocess.run(["ip", "netns", "add", ROUTER], check=True)
    subprocess.run(["ip", "netns", "add", ns("half")], check=True)
    sleeper = subprocess.Popen(in_ns(ROUTER, ["sleep", "300"]), start_new_session=True)
    assert "left over" in lab("status", check=False).stdout
    lab("down")
    assert sleeper.wait(timeout=10) != 0
    assert root_leftovers() == []


ISOLATED = Path(__file__).parents[1] / "scripts" / "isolated.sh"
SECOND_LAB = east_west("3ms")


@pytest.mark.alone
def test_a_second_lab_in_a_namespace_of_its_own_leaves_the_machines_alone(serving: None, tmp_path: Path) -> None:
    before = json.loads(lab("status", "--json").stdout)
    topo = tmp_path / "second.yaml"
    topo.write_text(SECOND_LAB)
    # The same host names and addresses, its own router and delay line: east -> west is 6 ms there.
    script = (
        '"$0" -m pathprobe lab up --topology "$1" >/dev/null && '
        '"$0" -m pathprobe lab exec east -- ping -c 5 -i 0.2 198.18.2.2; rc=$?; '
        '"$0" -m pathprobe lab down >/dev/null; exit $rc'
    )

    def second() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(ISOLATED), "sh", "-c", script, sys.executable, str(topo)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    ping = unstolen(second)[0]
    assert ping.returncode == 0, ping.stdout + ping.stderr
    # The median: the path's delay, as the exporter's p50, not one late wake-up's share of a mean.
    times = [float(t) for t in re.findall(r"time=([\d.]+) ms", ping.stdout)]
    assert times, ping.stdout
    assert 5.5 < statistics.median(times) < 9, ping.stdout
    # The machine's lab: every namespace and process still there, its own 20 ms path unchanged.
    after = json.loads(lab("status", "--json").stdout)
    assert after["up"] and all(h["present"] for h in after["hosts"])
    assert [p["pid"] for p in after["processes"] if p["alive"]] == [p["pid"] for p in before["processes"]]
    assert rtt_p50("east", 2) == pytest.approx(0.020, abs=RTT_TOLERANCE)


@pytest.mark.alone
def test_configured_delay_is_measured(serving: None) -> None:
    assert rtt_p50("east", 2) == pytest.approx(0.020, abs=RTT_TOLERANCE)
    assert rtt_p50("east", 2, "loss") == pytest.approx(0.020, abs=RTT_TOLERANCE)


@pytest.mark.alone
def test_impair_changes_what_is_measured_and_restore_brings_it_back(serving: None) -> None:
    before = throughput("east", 2)
    assert before == pytest.approx(payload_rate(300e6), rel=0.05)
    lab("impair", "east", "west", "--rate", "100M", "--delay", "30ms")
    assert throughput("east", 2) == pytest.approx(payload_rate(100e6), rel=0.05)
    assert rtt_p50("east", 2) == pytest.approx(0.040, abs=RTT_TOLERANCE)
    status = json.loads(lab("status", "--json").stdout)
    impaired = next(p for p in status["paths"] if (p["src"], p["dst"]) == ("east", "west"))
    assert impaired["rate"] == 100e6 and impaired["one_way_delay"] == 0.030
    lab("restore", "east", "west")
    assert throughput("east", 2) == pytest.approx(before, rel=0.05)
    assert rtt_p50("east", 2) == pytest.approx(0.020, abs=RTT_TOLERANCE)


def test_status_reports_a_dead_delay_line(lab_up: Path) -> None:
    status = json.loads(lab("status", "--json").stdout)
    line = next(p for p in status["processes"] if p["what"] == "delay-line")
    # Real-time, so that busy cores do not add their wake-up latency to the paths' delay.
    assert os.sched_getscheduler(line["pid"]) == os.SCHED_FIFO
    os.kill(line["pid"], 9)
    text = lab("status").stdout
    assert "delay-line" in text and "DEAD" in text


def test_exec_runs_inside_the_host(lab_up: Path) -> None:
    out = lab("exec", "north", "--", "ip", "-4", "addr", "show", "eth0").stdout
    assert address(3) in out
    cc = lab("exec", "east", "--", "sysctl", "-n", "net.ipv4.tcp_congestion_control").stdout
    assert cc.strip() == "cubic"


def test_bad_topology_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "hosts:\n  - {name: a, region: r}\n  - {name: b, region: r}\npaths:\n  - {between: [a, mars], rate: fast}\n"
    )
    proc = lab("check-topology", str(bad), check=False)
    assert proc.returncode == 2
    assert f"{bad}:5: paths.0.rate: rate: cannot read 'fast'" in proc.stderr


def test_topology_helper_parses_default() -> None:
    from pathprobe_lab import topology as topo_mod

    default = topo_mod.load(None)
    assert [h.name for h in default.hosts] == ["tokyo-a", "tokyo-b", "osaka-a", "singapore-a"]
    assert topology(TOPOLOGY).hosts[0].congestion == "cubic"


def test_the_delay_line_names_a_bad_argument() -> None:
    binary = shaping.delay_line_command({1: 0.001})[0]
    for arg, why in (("7", "QUEUE:SECONDS"), ("70000:0.001", "queue 0-65535"), ("3:-1", "0-10 s")):
        proc = subprocess.run([binary, "1:0.002", arg], capture_output=True, text=True, timeout=10, check=False)
        assert proc.returncode == 2 and f"argument 2 ({arg})" in proc.stderr and why in proc.stderr, proc.stderr


def test_the_delay_line_logs_its_counters_when_stopped(serving: None) -> None:
    rtt_p50("east", 2)  # some packets through it
    state = State.load()
    assert state is not None
    line = next(p for p in state.processes if p["what"] == "delay-line")
    log = STATE_DIR / "delay-line.log"
    procs.terminate(line["pid"])  # SIGTERM first: it prints its counters and exits
    # The last line of counters: the log keeps an earlier delay line's too (one that a lab set up
    # before in this session stopped, with no packets through it).
    said = re.findall(r"delay line: (\d+) packets .* late by at most (\d+) us at p50", log.read_text())
    assert said and int(said[-1][0]) > 0 and int(said[-1][1]) <= 100, log.read_text()[-500:]


def delay_line_counters(pid: int, log: Path) -> tuple[int, int]:
    """The delay line's packets and wake-ups so far: it logs its counters on SIGUSR1."""
    size = log.stat().st_size
    os.kill(pid, signal.SIGUSR1)
    pattern = r"delay line: (\d+) packets in \d+ reads, (\d+) wake-ups"
    found = wait_for("its counters", lambda: re.findall(pattern, log.read_text()[size:]), timeout=10, every=0.05)
    return int(found[-1][0]), int(found[-1][1])


@pytest.mark.alone
def test_the_delay_line_wakes_for_releases_not_for_each_arrival_on_a_short_path(serving: None) -> None:
    """1.5 ms each way (a queue read as its packets arrive), 1,000 echoes a second: each packet arrives
    while an earlier one falls due within the path's delay, so the line reads it then instead of
    waking for it. It woke about twice a packet (an arrival and a release, a context switch each: a
    third of its CPU in a VM) and now about once; the echoes keep their delay."""
    lab("impair", "east", "west", "--delay", "1.5ms")
    lab("impair", "west", "east", "--delay", "1.5ms")
    state = State.load()
    assert state is not None
    line = next(p["pid"] for p in state.processes if p["what"] == "delay-line")
    log = STATE_DIR / "delay-line.log"

    def echoes() -> tuple[dict[str, Any], tuple[int, int], tuple[int, int]]:
        """The probe's report, and the line's counters before and after it."""
        before = delay_line_counters(line, log)
        report = probe_once("east", 2, "loss", "-c", "4000", "--rate", "1000/s")
        return report, before, delay_line_counters(line, log)

    report, (packets, wakeups), (packets_after, wakeups_after) = unstolen(echoes)[0]
    assert report["lost"] == 0 and report["rtt_seconds"]["p50"] == pytest.approx(0.003, abs=RTT_TOLERANCE), report
    assert packets_after - packets >= 8000
    assert (wakeups_after - wakeups) / (packets_after - packets) < 1.3, (
        packets_after - packets,
        wakeups_after - wakeups,
    )


def toggled(src: str, dst: str, *impairment: str) -> Callable[[int], object]:
    """A change that impairs src -> dst at even turns and restores it at odd ones."""
    return lambda k: lab("impair", src, dst, *impairment) if k % 2 == 0 else lab("restore", src, dst)


def echoes_during(change: Callable[[int], object]) -> dict:
    """1,000 echoes east <-> west (10 ms each way: about 4 at a time in the delay line's queues at
    200/s) while `change(k)` runs for k = 0 to 9, as long as the echoes last: the probe's report."""
    echoes = subprocess.Popen(
        in_ns(ns("east"), [*PATHPROBE, "probe", "loss", address(2), "-c", "1000", "--rate", "200/s", "--json"]),
        stdout=subprocess.PIPE,
        text=True,
    )
    changes = 0
    while echoes.poll() is None and changes < 10:
        change(changes)
        changes += 1
    out, _ = echoes.communicate(timeout=30)
    assert echoes.returncode == 0 and changes >= 4, (changes, out)
    report = json.loads(out)
    assert report["sent"] == 1000 and report["lost"] == 0, report
    return report


def test_a_loss_change_on_one_path_drops_nothing_the_delay_line_holds_for_another(serving: None) -> None:
    # Another path's loss set and cleared ten times. Re-creating the loss table's hooked chain
    # flushed every NFQUEUE queue of the router: a few echoes lost per change.
    echoes_during(toggled("north", "east", "--loss", "5%"))


@pytest.mark.alone
def test_a_delay_change_on_one_path_costs_another_nothing(serving: None) -> None:
    # North -> west's delay set (a queue bound while the line runs) and cleared ten times.
    # Restarting the delay line for each change, as the lab did, dropped what every queue held
    # (the kernel flushes a queue with its socket) and let packets through undelayed until the
    # new line had bound its queues: echoes lost, and RTTs under 20 ms.
    line = next(p["pid"] for p in json.loads(lab("status", "--json").stdout)["processes"] if p["what"] == "delay-line")
    report = echoes_during(toggled("north", "west", "--delay", "30ms"))
    assert report["rtt_seconds"]["min"] >= 0.020, report["rtt_seconds"]
    # The changes took effect in the same process: north -> west is 30 ms one way, west -> north 0.
    lab("impair", "north", "west", "--delay", "30ms")
    assert rtt_p50("north", 2) == pytest.approx(0.030, abs=RTT_TOLERANCE)
    lab("restore", "north", "west")
    assert rtt_p50("north", 2) < 0.005
    status = json.loads(lab("status", "--json").stdout)
    assert [p["pid"] for p in status["processes"] if p["what"] == "delay-line"] == [line]


@pytest.mark.alone
def test_a_bad_control_line_changes_nothing(serving: None) -> None:
    with socket.socket(socket.AF_UNIX) as control:
        control.settimeout(10)
        control.connect(str(shaping.DELAY_LINE_CONTROL))
        control.sendall(b"514:0.5 7\n")  # a good delay, then a word that is none
        assert control.makefile().readline().startswith("error: want one line of QUEUE:SECONDS")
    assert rtt_p50("east", 2) == pytest.approx(0.020, abs=RTT_TOLERANCE)


@pytest.mark.alone
def test_a_delay_change_starts_a_dead_delay_line_again(serving: None) -> None:
    state = State.load()
    assert state is not None
    dead = next(p["pid"] for p in state.processes if p["what"] == "delay-line")
    os.kill(dead, 9)
    lab("impair", "east", "west", "--delay", "30ms")
    assert rtt_p50("east", 2) == pytest.approx(0.040, abs=RTT_TOLERANCE)
    status = json.loads(lab("status", "--json").stdout)
    assert [p["alive"] for p in status["processes"] if p["what"] == "delay-line" and p["pid"] != dead] == [True]
