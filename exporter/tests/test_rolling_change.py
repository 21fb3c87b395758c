"""A rolling change of the member list, in virtual time: six exporters' turns on one timeline,
five rolled one at a time onto a list with a sixth member and a shared epoch, the sixth started
fresh. Their tests stand in for iperf3 as the servers' exporters would admit them (each client
asks its server's `iperf3_admission` as it connects; the server is busy while it serves). The lab
runs the same change with real exporters and iperf3 (tests/test_fleet_lab.py); here it runs
in a moment, for several jitters, with no margin for this machine's speed."""

import asyncio
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import combinations, pairwise
from pathlib import Path

import pytest
from virtual_time import VirtualTime

from pathprobe.config import Config
from pathprobe.exporter import Exporter
from pathprobe.probes import Reason, Target, ThroughputResult, ThroughputTest

HOSTS = [f"h{i}" for i in range(6)]
NEW = HOSTS[-1]  # joins the mesh of the other five
SLOT = 6.0
ROTATION = 5 * SLOT  # 5 and 6 members: 5 rounds each
ROLLOUT_GAP = 1.5  # between two hosts' reloads
START = VirtualTime().time()


def address(host: str) -> str:
    return f"198.18.{HOSTS.index(host) + 1}.2"


def config(tmp_path: Path, host: str, members: list[str], epoch: float | None = None) -> Config:
    return Config.model_validate(
        {
            "host": {"name": host, "address": address(host), "region": "r1"},
            "peers": [
                {"name": p, "address": address(p), "region": "r1", "path_class": "intra_region"}
                for p in members
                if p != host
            ],
            "schedule": {"slot_seconds": SLOT, "jitter_seconds": 0.5, "timeout_margin_seconds": 1},
            "probes": {"throughput": {"streams": [1], "duration_seconds": 1, "omit_seconds": 0}},
            "mesh": {"epoch": datetime.fromtimestamp(epoch, UTC)} if epoch is not None else {},
            "budget": {"state_file": str(tmp_path / f"{host}-budget.json")},
            "tcp_rmem_max_bytes": 6291456,
            "tcp_wmem_max_bytes": 4194304,
            "tcp_window_share": 0.5,
        }
    )


@dataclass
class Fleet:
    """The exporters running (by host name) and what their tests met."""

    virtual: VirtualTime
    exporters: dict[str, Exporter]
    ran: list[tuple[float, float, str, str]]  # (start, end, client, server)
    cut: list[tuple[float, str, str, str]]  # (when, client, server, why): a test its server refused


class StandInTest:
    """One client's test as its server admits it: refused as it connects unless the server's
    exporter admits the client now and serves no other test; else it holds the server for the
    test's length."""

    def __init__(self, fleet: Fleet, client: str, target: Target, test: ThroughputTest) -> None:
        self.fleet, self.client, self.test = fleet, client, test
        self.server = next(h for h in HOSTS if address(h) == target.address)

    async def run(self) -> ThroughputResult | Reason:
        fleet, now = self.fleet, self.fleet.virtual.time()
        server = fleet.exporters.get(self.server)
        if server is None:
            fleet.cut.append((now, self.client, self.server, "not_running"))
            return "refused"
        admitted = server.iperf3_admission(address(self.client))
        if admitted != "ok" or server.iperf3.serving:
            fleet.cut.append((now, self.client, self.server, "busy" if admitted == "ok" else admitted))
            return "busy" if admitted == "ok" else "out_of_turn"
        server.iperf3.set_serving(True)
        try:
            await fleet.virtual.sleep(self.test.duration_seconds)
        finally:
            server.iperf3.set_serving(False)
        fleet.ran.append((now, fleet.virtual.time(), self.client, self.server))
        return ThroughputResult(
            "tcp",
            1,
            "send",
            self.test.duration_seconds,
            0,
            None,
            None,
            50e6,
            50e6,
            10**6,
            retransmits=0,
            sender_rtt_seconds=None,
            timestamp=now,
        )


def start(fleet: Fleet, cfg: Config, tasks: list[asyncio.Task[None]]) -> None:
    host = cfg.host.name
    e = Exporter(cfg, clock=fleet.virtual.time, sleep=fleet.virtual.sleep)
    e.turns.make_prober = lambda target, test, sink: StandInTest(fleet, host, target, test)
    fleet.exporters[host] = e
    tasks.append(asyncio.create_task(e.turns.run(asyncio.Event()), name=f"turns-{host}"))


def rolled(tmp_path: Path) -> tuple[Fleet, float]:
    """The fleet after one rotation of the old mesh, the rolling change and two rotations of the
    new mesh after its epoch; and the epoch."""
    fleet = Fleet(VirtualTime(), {}, [], [])
    old = HOSTS[:-1]
    epoch = math.ceil((fleet.virtual.time() + ROTATION + 20) / SLOT) * SLOT  # 20 s after a rotation
    end = epoch + 2 * ROTATION

    async def scenario() -> None:
        tasks: list[asyncio.Task[None]] = []
        for h in old:
            start(fleet, config(tmp_path, h, old), tasks)

        async def rollout() -> None:
            await fleet.virtual.sleep(ROTATION)
            for h in old:  # one host at a time, as a rollout tool does
                fleet.exporters[h].reload(config(tmp_path, h, HOSTS, epoch))
                await fleet.virtual.sleep(ROLLOUT_GAP)
            start(fleet, config(tmp_path, NEW, HOSTS, epoch), tasks)

        tasks.append(asyncio.create_task(rollout(), name="rollout"))
        await fleet.virtual.drive(tasks, lambda: fleet.virtual.time() >= end)
        for task in tasks:
            task.cancel()

    asyncio.run(scenario())
    return fleet, epoch


@pytest.mark.parametrize("seed", range(4))
def test_a_rolling_change_meets_every_pair_after_the_epoch_and_no_host_is_in_two_tests(
    tmp_path: Path, seed: int
) -> None:
    random.seed(seed)  # the turns' start jitter
    fleet, epoch = rolled(tmp_path)
    assert fleet.cut == []  # every test admitted by its server's exporter, none met a busy server
    for h in HOSTS:
        mine = sorted((s, e) for s, e, c, p in fleet.ran if h in (c, p))
        assert all(e1 <= s2 for (_, e1), (s2, _) in pairwise(mine)), f"{h} was in two tests at once"
    assert {c for s, _, c, _ in fleet.ran if s < START + ROTATION} == set(HOSTS[:-1])  # the old mesh, before the change
    assert min(s for s, _, c, p in fleet.ran if NEW in (c, p)) >= epoch  # the new host waits for the epoch
    first_rotation = [(c, p) for s, _, c, p in fleet.ran if epoch <= s < epoch + ROTATION]
    every = {(a, b) for a, b in combinations(HOSTS, 2)}
    assert sorted(first_rotation) == sorted(every | {(b, a) for a, b in every})  # each pair, both ways, once


def test_a_turn_that_waits_for_a_busy_server_is_skipped_at_its_end(tmp_path: Path) -> None:
    # The server's own serving flag (a peer's test that overran) holds the client back; a test
    # that no longer fits the turn is skipped as "serving_peer", not run across the next turn.
    fleet = Fleet(VirtualTime(), {}, [], [])

    async def scenario() -> None:
        tasks: list[asyncio.Task[None]] = []
        for h in HOSTS[:3]:
            start(fleet, config(tmp_path, h, HOSTS[:3]), tasks)
        client = fleet.exporters["h0"]
        client.iperf3.set_serving(True)  # and never done
        await fleet.virtual.drive(tasks, lambda: fleet.virtual.time() >= START + 3 * 3 * SLOT)
        for task in tasks:
            task.cancel()

    asyncio.run(scenario())
    assert not [t for t in fleet.ran if t[2] == "h0"]
    skipped = fleet.exporters["h0"].rooms.throughput.skipped
    assert sum(n for key, n in skipped.items() if key.reason == "serving_peer") >= 2  # a turn in 2 of every 3 slots
