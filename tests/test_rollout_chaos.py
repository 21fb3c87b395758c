"""Rollouts at random moments in the lab: a 6-host mesh in 3 regions, real exporters with
throughput tests running, and 50 member-list or probe-setting changes at random (seeded)
moments over 10 minutes: members leave (their exporter stops once the change has taken
effect), come back (started again), and the probe settings change. Every change is rolled
out host by host with a shared epoch (SIGHUP), as a deployment does.

After each change every running host's /metrics answers 200 with a snapshot younger than
two refresh intervals, no render failed, the reload was applied, and no series of a member
that left remains. Then one host reloads a 10,000-member list in a burst of ten SIGHUPs and
goes back to its own list, while its peers probe it: the peers the large list still links it
with count no idle echo lost and no RTT probe failed against it, and the burst costs two
reloads, not ten. At the end: no exception in any host's log, and no host was ever in two
tests at once (from the hosts' own test logs, as tests/test_fleet_lab.py reads them)."""

from __future__ import annotations

import math
import random
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import SIX_HOSTS_THREE_REGIONS, Samples, scrape, start_exporter, value, wait_for
from pathprobe_lab import net
from pathprobe_lab.configs import METRICS_PORT, exporter_config
from pathprobe_lab.topology import address

pytestmark = pytest.mark.lab

TOPO = SIX_HOSTS_THREE_REGIONS
HOSTS = [h.name for h in TOPO.hosts]
SLOT = 6.0  # one test of 1 s and its margin in each half
REFRESH = 5.0  # web.Snapshot's refresh
CHANGES, SPAN = 50, 600.0  # changes, over this many seconds
SEED = 20260522
MIN_MEMBERS = 3
# Probe settings a change picks from: each fits the slot, and every host gets the same.
SETTINGS: list[dict[str, Any]] = [
    {
        "throughput": {
            "protocols": ["tcp"],
            "streams": [1],
            "duration_seconds": 1,
            "omit_seconds": 0,
            "steady_state": {"enabled": False},
        },
        "rtt": {"interval_seconds": 0.5},
        "loss": {"rate_pps": 5},
    },
    {
        "throughput": {
            "protocols": ["udp"],
            "streams": [1],
            "duration_seconds": 1,
            "omit_seconds": 0,
            "udp_bitrate": "50M",
        },
        "rtt": {"interval_seconds": 0.25},
        "loss": {"rate_pps": 10},
        "mtu": {"enabled": False},
    },
    {
        "throughput": {"protocols": ["tcp"], "streams": [2], "duration_seconds": 1, "omit_seconds": 0},
        "rtt": {"interval_seconds": 1},
        "loss": {"rate_pps": 2},
    },
]
# The storm: a member list this long (the lab's hosts and strangers), asked for by this many SIGHUPs.
STORM_MEMBERS, STORM_SIGHUPS = 10_000, 10
# Tests that ran: an attempt the peer's server cut as it connected (out of turn) held nobody.
TEST_LINE = re.compile(r"throughput test -> (\S+) (\S+): from ([0-9.]+) to ([0-9.]+) \(ran\)")


def metrics_address(host: str) -> str:
    return f"{address(HOSTS.index(host) + 1)}:{METRICS_PORT}"


def config(host: str, work: Path, members: list[str], settings: dict[str, Any], epoch: float | None) -> dict[str, Any]:
    cfg = exporter_config(TOPO, host, work, SLOT, settings)
    cfg["peers"] = [p for p in cfg["peers"] if p["name"] in members]
    cfg["schedule"] = {"slot_seconds": SLOT, "jitter_seconds": 0.5, "timeout_margin_seconds": 1}
    if epoch is not None:
        cfg["mesh"] = {"epoch": epoch}
    return cfg


@dataclass
class Fleet:
    """The running mesh: who is a member, with which settings, and their exporters."""

    work: Path
    members: list[str] = field(default_factory=lambda: list(HOSTS))
    settings: dict[str, Any] = field(default_factory=lambda: SETTINGS[0])
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    left: set[str] = field(default_factory=set)  # members that left and are not back
    changes: list[str] = field(default_factory=list)
    epoch: float | None = None  # the last change's
    storm: Storm | None = None

    def start(self, host: str, epoch: float | None) -> None:
        self.procs[host] = start_exporter(host, config(host, self.work, self.members, self.settings, epoch), self.work)

    def stop(self, host: str) -> None:
        proc = self.procs.pop(host)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, f"{host} did not stop cleanly"

    def roll_out(self, epoch: float, joining: str | None = None) -> None:
        """The new member list and settings to every running member, one at a time, then the joiner."""
        self.epoch = epoch
        for host in list(self.procs):
            if host in self.members:
                path = self.work / f"{host}.yaml"
                path.write_text(yaml.safe_dump(config(host, self.work, self.members, self.settings, epoch)))
                self.procs[host].send_signal(signal.SIGHUP)
                time.sleep(0.3)
        if joining is not None:
            self.start(joining, epoch)


def strangers(n: int) -> list[dict[str, str]]:
    """Members of other regions at addresses no lab host has: nothing answers there."""
    return [
        {
            "name": f"m{i:05d}",
            "address": f"198.19.{i // 250}.{i % 250 + 1}",
            "region": f"x{i % 19}",
            "path_class": "inter_region",
        }
        for i in range(n)
    ]


@dataclass
class Storm:
    """A large reload on one host: how long it took, its reloads, what each peer counted
    against the host meanwhile (idle echoes lost, RTT probes failed), and the peers the large
    list still links it with (a hierarchical mesh links a host with some of another region's
    hosts; it does not answer the others, who count that as designed while their own list
    still has the link)."""

    host: str
    seconds: float
    reloads: float
    counted: dict[str, dict[str, float]]  # peer: kind: count
    linked: set[str]


def against(got: Samples, host: str) -> tuple[dict[str, float], float]:
    """(what a prober counted against `host` when its responders did not answer, by kind: idle
    echoes lost, RTT probes failed by result; its RTT probes answered)."""
    counted = {"idle echoes lost": value(got, "pathprobe_udp_packets_lost_total", peer=host, state="idle") or 0}
    answered = 0.0
    for (name, labels), v in got.items():
        if name == "pathprobe_probe_runs_total" and {("peer", host), ("probe", "rtt")} <= labels:
            result = dict(labels)["result"]
            if result == "ok":
                answered += v
            else:
                kind = f"RTT probes {result}"
                counted[kind] = counted.get(kind, 0) + v
    return counted, answered


def storm(fleet: Fleet, host: str) -> Storm:
    """`host` reloads a STORM_MEMBERS list (a hierarchical mesh, as a fleet that large runs)
    in a burst of STORM_SIGHUPS, then its own list again, while every other member probes it."""
    peers = [p for p in fleet.procs if p != host]
    before = {p: against(scrape(metrics_address(p)), host) for p in peers}
    reloads = "pathprobe_config_reloads_total"
    reloads_before = value(scrape(metrics_address(host)), reloads, result="success") or 0
    own = config(host, fleet.work, fleet.members, fleet.settings, fleet.epoch)
    large = {
        **own,
        "peers": [*own["peers"], *strangers(STORM_MEMBERS - len(fleet.members))],
        "mesh": {**own.get("mesh", {}), "rtt": {"kind": "hierarchical"}},
    }
    path, proc = fleet.work / f"{host}.yaml", fleet.procs[host]
    path.write_text(yaml.safe_dump(large))
    started = time.monotonic()
    for _ in range(STORM_SIGHUPS):  # the first starts a reload, the others ask for one more
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.1)

    def reloaded(n: float) -> Samples | None:
        got = scrape(metrics_address(host))
        return got if (value(got, reloads, result="success") or 0) >= reloads_before + n else None

    got = wait_for(f"{host}: the burst's reloads of {STORM_MEMBERS} members", lambda: reloaded(2), timeout=180)
    linked = {dict(ls)["peer"] for n, ls in got if n == "pathprobe_peer_info"} & set(peers)
    path.write_text(yaml.safe_dump(own))
    proc.send_signal(signal.SIGHUP)
    got = wait_for(f"{host}: back to its own list", lambda: reloaded(3), timeout=60)
    seconds = time.monotonic() - started
    # Each peer's count from a snapshot taken after the storm: more RTT probes of the host answered than now.
    answered = {p: against(scrape(metrics_address(p)), host)[1] for p in peers}

    def newer(peer: str) -> tuple[dict[str, float], float] | None:
        now = against(scrape(metrics_address(peer)), host)
        return now if now[1] > answered[peer] else None

    after = {
        p: wait_for(f"{p}: a snapshot after {host}'s storm", lambda p=p: newer(p), timeout=3 * REFRESH, every=0.5)
        for p in peers
    }
    counted = {p: {kind: n - before[p][0].get(kind, 0) for kind, n in after[p][0].items()} for p in peers}
    return Storm(host, seconds, (value(got, reloads, result="success") or 0) - reloads_before, counted, linked)


def next_epoch(last: float | None) -> float:
    """A slot boundary a few seconds ahead (every host has the change before it takes effect), and
    after the last change's: two changes in one slot would share an epoch, and `healthy` would take
    the first one's as the second applied while the second's reload still ran."""
    ahead = math.ceil((time.time() + 2 * SLOT) / SLOT) * SLOT
    return ahead if last is None else max(ahead, last + SLOT)


def change(fleet: Fleet, rng: random.Random) -> None:
    """One random change: a member leaves, one comes back, or the probe settings change."""
    kind = rng.choice(["leave", "join", "settings"])
    epoch = next_epoch(fleet.epoch)
    if kind == "leave" and len(fleet.members) > MIN_MEMBERS:
        host = rng.choice(fleet.members)
        fleet.members.remove(host)
        fleet.roll_out(epoch)
        time.sleep(max(0.0, epoch - time.time()) + 1)  # it leaves once the new schedule is in force
        fleet.stop(host)
        fleet.left.add(host)
    elif kind == "join" and fleet.left:
        host = rng.choice(sorted(fleet.left))
        fleet.members.append(host)
        fleet.left.discard(host)
        fleet.roll_out(epoch, joining=host)
    else:
        kind = "settings"
        fleet.settings = rng.choice([s for s in SETTINGS if s is not fleet.settings])
        fleet.roll_out(epoch)
    fleet.changes.append(kind)


def healthy(fleet: Fleet) -> None:
    """Every running host answers 200 with a fresh snapshot, no failed render, the reload
    applied, and no series of a member that left. Waiting for the change's epoch also means
    no reload is still running when the next change (or the storm) comes: the storm counts
    its host's reloads, and one left over from the last rollout would add to them."""
    for host in fleet.procs:
        assert fleet.procs[host].poll() is None, f"{host} exited"

        seen: dict[str, object] = {}  # what the last scrape read, for a failure's message

        def fresh(host: str = host, seen: dict[str, object] = seen) -> Samples | None:
            got = scrape(metrics_address(host))  # urllib raises on anything but 200
            gone = [ls for _, ls in got if any(("peer", h) in ls for h in fleet.left)]
            # A reload after the epoch takes effect at the next slot instead: later, never earlier.
            epoch = value(got, "pathprobe_schedule_epoch_timestamp_seconds") or 0
            seen.update(epoch=epoch, age=value(got, "pathprobe_scrape_snapshot_age_seconds"), gone=len(gone))
            applied = fleet.epoch is None or epoch >= fleet.epoch
            return None if gone or not applied else got

        try:
            got = wait_for(
                f"{host}: the epoch {fleet.epoch} (or later) applied, no series of {sorted(fleet.left)}",
                fresh,
                timeout=4 * REFRESH,
                every=0.5,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its last scrape read {seen}") from None
        assert (value(got, "pathprobe_scrape_snapshot_age_seconds") or 0) < 2 * REFRESH, host
        assert value(got, "pathprobe_scrape_render_errors_total") == 0, host
        assert value(got, "pathprobe_config_last_reload_successful") == 1, host
        log = (fleet.work / f"{host}.log").read_text()
        assert "Traceback" not in log and "rendering /metrics failed" not in log, f"{host}: {log[-3000:]}"


def logged_tests(work: Path) -> list[tuple[float, float, str, str]]:
    """(start, end, client, server) of every throughput test the hosts logged."""
    found = []
    for host in HOSTS:
        log = work / f"{host}.log"
        for peer, _, start, end in TEST_LINE.findall(log.read_text() if log.exists() else ""):
            found.append((float(start), float(end), host, peer))
    return found


@pytest.fixture(scope="module")
def rolled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("chaos"))
    net.up(TOPO)
    try:
        for host in HOSTS:
            fleet.start(host, None)
        wait_for(
            "every host has run a test",
            lambda: {c for _, _, c, _ in logged_tests(fleet.work)} == set(HOSTS),
            timeout=6 * 5 * SLOT,
        )
        rng = random.Random(SEED)
        started = time.monotonic()
        for moment in sorted(rng.uniform(0, SPAN) for _ in range(CHANGES)):
            time.sleep(max(0.0, started + moment - time.monotonic()))  # or at once, when the last ran late
            change(fleet, rng)
            healthy(fleet)
        fleet.storm = storm(fleet, next(h for h in fleet.members if h in fleet.procs))
        healthy(fleet)
        yield fleet
        for host in list(fleet.procs):
            fleet.stop(host)
    finally:
        net.down()


def test_every_kind_of_change_was_rolled_out(rolled: Fleet) -> None:
    assert len(rolled.changes) == CHANGES
    assert {"leave", "join", "settings"} <= set(rolled.changes), rolled.changes


def test_a_large_reload_in_a_sighup_burst_costs_the_peers_nothing(rolled: Fleet) -> None:
    got = rolled.storm
    assert got is not None
    counted = {p: {kind: n for kind, n in kinds.items() if n} for p, kinds in got.counted.items()}
    print(
        f"\n{got.host}: a burst of {STORM_SIGHUPS} SIGHUPs for {STORM_MEMBERS} members and back: {got.reloads:g} "
        f"reloads in {got.seconds:.1f} s; its peers counted {counted}, of which it stayed linked with "
        f"{sorted(got.linked)}"
    )
    assert got.reloads == 3, "the burst should cost two reloads, and going back one"
    assert got.linked, "the large list links the host with none of the lab's hosts"
    assert not any(counted[p] for p in got.linked), "linked peers counted idle echoes lost or RTT probes failed"


def test_no_host_was_ever_in_two_tests_at_once(rolled: Fleet) -> None:
    tests = logged_tests(rolled.work)
    assert len(tests) > 100, len(tests)
    for host in HOSTS:
        mine = sorted((s, e, c, p) for s, e, c, p in tests if host in (c, p))
        overlapping = [(x, y) for x, y in pairwise(mine) if y[0] < x[1]]
        assert not overlapping, f"{host} was in two tests at once: {overlapping}"


def test_no_exception_was_logged(rolled: Fleet) -> None:
    for host in HOSTS:
        log = (rolled.work / f"{host}.log").read_text()
        assert "Traceback" not in log and "rendering /metrics failed" not in log, f"{host}: {log[-3000:]}"
