"""How often a host's throughput tests fit its daily byte budget: the slot length, the rotation
time and the tests per day that the budget allows, from the config the exporter runs
(`pathprobe plan`).

One rotation of the schedule gives a host one turn with each of its throughput peers, in which
it runs each of its tests as the client (schedule.py); the budget counts the bytes of the tests
a host starts (budget.py). So a host's bytes per day are its tests' bytes per rotation times the
rotations per day, and the rotation is the schedule's rounds times the slot: the budget sets the
slot. The schedule is shared, so the mesh's slot is the largest of its hosts' plans.

A test's bytes are its rate times its seconds: the rate is the model's expected peak for the path
(limits.py: what a test reaches while burst credits last; the window bound left out, which only
lowers it), so the plan errs towards fewer tests, never towards an exhausted budget."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import Config, PathClass, Peer
from .limits import expected
from .probe_settings import TestSpec
from .schedule import Schedule

SECONDS_PER_DAY = 86_400
# A steady-state test stops once its rate has settled (probes/steady.py). Measured in the lab
# (bench/throughput_cost.py: 1-150 ms RTT, 200 and 500 Mbit/s, 1 and 4 streams) the stopped tests
# moved 10-20% of a 10 s test's bytes: at most 2 s at their rate, the figure planned with.
STEADY_STATE_SECONDS = 2.0


@dataclass(frozen=True)
class PlannedTest:
    """One test this host runs in each rotation, and what it moves."""

    peer: str
    path_class: PathClass
    test: TestSpec
    bits_per_second: float
    seconds: float

    @property
    def bytes(self) -> float:
        return self.bits_per_second / 8 * self.seconds


@dataclass(frozen=True)
class Cadence:
    slot_seconds: float
    rotation_seconds: float
    tests_per_peer_per_day: float
    bytes_per_day: float
    cost_per_day: float  # dollars, at budget.price_per_gb (classes without a price cost nothing)


@dataclass(frozen=True)
class Plan:
    host: str
    rounds: int  # of one rotation of the shared schedule
    tests: tuple[PlannedTest, ...]  # this host's, in one rotation
    needed_slot_seconds: float  # what one turn's tests take (the config's own check)
    daily_bytes: int
    prices: dict[PathClass, float]

    @property
    def bytes_per_rotation(self) -> float:
        return sum(t.bytes for t in self.tests)

    def cadence(self, slot_seconds: float) -> Cadence:
        rotation = self.rounds * slot_seconds
        per_day = SECONDS_PER_DAY / rotation
        peers = {t.peer for t in self.tests}
        return Cadence(
            slot_seconds,
            rotation,
            per_day * len(self.tests) / max(1, len(peers)),
            per_day * self.bytes_per_rotation,
            per_day * sum(t.bytes / 1e9 * self.prices.get(t.path_class, 0.0) for t in self.tests),
        )

    def within_budget(self) -> Cadence:
        """The shortest whole-second slot whose rotations move no more than the daily budget
        (an endless one for a budget of nothing)."""
        if self.daily_bytes <= 0 < self.bytes_per_rotation:
            return self.cadence(math.inf)
        budget_slot = self.bytes_per_rotation * SECONDS_PER_DAY / (self.rounds * max(1, self.daily_bytes))
        return self.cadence(float(math.ceil(max(self.needed_slot_seconds, budget_slot))))


def _seconds(cfg: Config, peer: Peer, test: TestSpec, steady_state: bool | None) -> float:
    settings = cfg.throughput_for(peer)
    steady = settings.steady_state.enabled if steady_state is None else steady_state
    if steady and test.protocol == "tcp":
        return min(STEADY_STATE_SECONDS, settings.duration_seconds)
    return settings.omit_seconds + settings.duration_seconds


def plan(cfg: Config, steady_state: bool | None = None) -> Plan:
    """This host's plan; `steady_state`: plan TCP tests as stopping at their steady state (True)
    or running their full length (False) whatever the config says (None: as it says)."""
    schedule = Schedule.of([m.name for m in cfg.members], cfg.schedule.slot_seconds, cfg.throughput_pairs)
    tests = []
    for peer in cfg.throughput_peers:
        settings = cfg.throughput_for(peer)
        if not settings.enabled:
            continue
        for test in settings.tests():
            e = expected(
                peer, cfg.host.instance_type, test.protocol, int(test.streams), None, None, settings.udp_bitrate
            )
            rate = e.peak_bits_per_second if math.isfinite(e.peak_bits_per_second) else e.bits_per_second
            tests.append(PlannedTest(peer.name, peer.path_class, test, rate, _seconds(cfg, peer, test, steady_state)))
    return Plan(
        cfg.host.name,
        len(schedule.rounds),
        tuple(tests),
        2 * cfg.half_slot_need(),
        cfg.budget.daily_bytes,
        dict(cfg.budget.price_per_gb),
    )
