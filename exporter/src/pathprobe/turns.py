"""Scheduled throughput tests: this host's client turns (schedule.py), the tests of each
turn, the byte budget, and recording what they measured."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import NamedTuple

from . import ena
from .budget import Budget
from .config import Config, Peer, TestSpec, ThroughputSettings
from .expected import ExpectedTracker
from .metrics.common import TestKey
from .metrics.host import HostRoom
from .metrics.throughput import ThroughputRoom
from .probes import PROBERS, Prober, Reason, Target, ThroughputResult, ThroughputTest
from .probes.steady import Detector
from .schedule import Timetable

log = logging.getLogger(__name__)

# After a test, the shapers' and the peer's queues still hold its last window of data.
DRAIN_SECONDS = 1.0
# A wait for a turn reads the wall clock this often: a stepped clock (NTP) is noticed then.
CLOCK_CHECK_SECONDS = 5.0
# A test waiting for a peer's test on this host's server to end looks this often.
SERVED_POLL_SECONDS = 0.1


class Plan(NamedTuple):
    """What turns are planned with; a reload replaces all three at once."""

    cfg: Config
    timetable: Timetable
    tracker: ExpectedTracker


class TestSink:
    """Where one scheduled test's outcome goes (probes.base.ThroughputSink): the throughput
    room, and the log for a test that gave no result."""

    def __init__(self, room: ThroughputRoom, key: TestKey):
        self.room, self.key = room, key

    def result(self, result: ThroughputResult) -> None:
        self.room.record(self.key, result)

    def failure(self, reason: Reason, detail: str) -> None:
        self.room.failed(self.key.peer, reason)
        log.info("throughput %s %s: %s: %s", self.key.peer, "/".join(self.key.spec), reason, detail)


class ThroughputTurns:
    def __init__(  # noqa: PLR0913, PLR0917 - the plan, the rooms and budget it writes to, the clock and its wait
        self, plan: Plan, results: ThroughputRoom, host: HostRoom, budget: Budget,
        clock: Callable[[], float], sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):  # fmt: skip
        self.results, self.host, self.budget, self.clock, self.sleep = results, host, budget, clock, sleep
        self._take(plan)
        self._next: Plan | None = None
        self._last_bytes: dict[tuple[str, TestSpec], int] = {}
        self.interface = ena.interface(plan.cfg.host.interface)
        # Builds each test's prober (target, test, sink); a test may put a stand-in here.
        self.make_prober: Callable[[Target, ThroughputTest, TestSink], Prober] = PROBERS["throughput"]
        # When this host's own tests ran, with DRAIN_SECONDS after each: RTT samples taken
        # then are "loaded" even where a retried test ran past the schedule's window.
        self._running_since: float | None = None
        self._ran: collections.deque[tuple[float, float]] = collections.deque(maxlen=8)

    def _take(self, plan: Plan) -> None:
        self.cfg, self.timetable, self.tracker = plan
        self.peers = {p.name: p for p in plan.cfg.peers}

    def use(self, plan: Plan) -> None:
        """A reload: the next turn is planned with these (a turn under way ends as planned)."""
        self._next = plan

    def in_test(self) -> bool:
        """Whether one of this host's own tests runs now."""
        return self._running_since is not None

    def testing(self, at: float) -> bool:
        """Whether this host was in one of its own tests at `at` (or just after one)."""
        if self._running_since is not None and at >= self._running_since:
            return True
        return any(start <= at < end for start, end in self._ran)

    async def run(self, stop: asyncio.Event) -> None:
        """Take every turn of this host until `stop`. Never ends on an error: a turn that
        fails unexpectedly is logged and counted (pathprobe_schedule_turn_errors_total)
        and the next turn is taken as usual."""
        host = self.cfg.host.name
        # The last turn taken (a slot's number changes with its length on a reload): never take a turn twice.
        taken: tuple[float, str] | None = None
        while not stop.is_set():
            if self._next is not None:
                self._take(self._next)
                self._next = None
            turn = self.timetable.next_turn(host, self.clock())
            if turn is None:  # no throughput peer: nothing to do until a reload brings one
                await self._sleep_until(float("inf"))
                continue
            peer = self.peers.get(turn.peer)
            # Done already (or the clock was stepped back into it); or, until a reload's epoch, a
            # turn of the schedule before it against a member that the new config removed.
            if (turn.start, turn.peer) == taken or peer is None:
                await self._sleep_until(turn.end)
                continue
            if not await self._sleep_until(turn.start + random.uniform(0, self.cfg.schedule.jitter_seconds)):
                continue
            taken = (turn.start, turn.peer)
            await self._take_turn(peer, turn.end)

    async def _take_turn(self, peer: Peer, deadline: float) -> None:
        settings = self.cfg.throughput_for(peer)
        if not settings.enabled:
            return
        self.host.turn_taken()
        try:
            await self.run_turn(peer, settings, deadline)
        except Exception as exc:
            self.host.turn_failed(type(exc).__name__)
            log.exception("throughput turn against %s failed; going on with the next turn", peer.name)

    async def _sleep_until(self, when: float) -> bool:
        """Wait until the wall clock reads `when`, reading it at least every
        CLOCK_CHECK_SECONDS: a clock stepped forward ends the wait at the next read, one
        stepped back (the time left grew) too, returning False: the caller then takes the
        schedule from the new time instead of waiting out the step; so does a reload."""
        left = when - self.clock()
        while left > 0:
            await self.sleep(min(left, CLOCK_CHECK_SECONDS))
            if self._next is not None:  # a reload: plan again with the new timetable
                return False
            now_left = when - self.clock()
            if now_left > left:
                log.warning("the clock stepped back %.3g s: taking the schedule from the new time", now_left - left)
                return False
            left = now_left
        return True

    async def run_turn(self, peer: Peer, settings: ThroughputSettings, deadline: float) -> None:
        """Run every configured test against `peer` before `deadline` (Unix time)."""
        keys = settings.tests()
        self.tracker.rate_all(peer, keys)
        for key in keys:
            if not self.budget.allows(self._last_bytes.get((peer.name, key), 0)):
                self.results.skip(peer.name, "budget")
                continue
            await self._run_test(peer, self.test(peer, settings, key), key, deadline)

    async def _run_test(self, peer: Peer, test: ThroughputTest, spec: TestSpec, deadline: float) -> None:
        """One test, tried again while the peer's server is busy and the turn has time for it."""
        target = Target(str(peer.address), peer.iperf3_port or self.cfg.iperf3.port, self.cfg.host.probe_source)
        key = TestKey.of(peer.name, spec)
        while True:
            if self.clock() + test.max_seconds() > deadline:
                self.results.skip(peer.name, "slot_over")
                return
            before = await asyncio.to_thread(ena.read, self.interface)
            if self.host.iperf3_serving:
                # A peer's test runs on this host's server (its clock is ahead, or its test overran):
                # a host is in one test at a time, so this one waits, or is skipped at the turn's end.
                if not await self._served(deadline - test.max_seconds()):
                    self.results.skip(peer.name, "serving_peer")
                    return
                continue
            with self._in_test(peer.name, spec) as outcome_of:
                outcome = await self.make_prober(target, test, TestSink(self.results, key)).run()
                outcome_of[0] = "ran" if isinstance(outcome, ThroughputResult) else str(outcome)
            if outcome == "busy":
                await self.sleep(random.uniform(1, 3))
                continue
            if isinstance(outcome, ThroughputResult):
                await self._after(peer, key, outcome, before)
            return

    async def _served(self, until: float) -> bool:
        """Wait until no peer's test runs on this host's server, or until `until`: whether it ended."""
        while self.host.iperf3_serving and self.clock() < until:
            await self.sleep(SERVED_POLL_SECONDS)
        return not self.host.iperf3_serving

    async def _after(self, peer: Peer, key: TestKey, result: ThroughputResult, before: dict[str, int] | None) -> None:
        """A test's result: its expected value, the allowance counters it raised, its bytes."""
        self.tracker.rate(peer, key.spec, result)
        after = await asyncio.to_thread(ena.read, self.interface)
        self.host.read_allowances(self.interface, after)
        if before is not None and after is not None:
            rises = ena.rose(before, after)
            self.results.allowances_rose(key, rises)
            if rises:
                log.warning("throughput -> %s %s: %s", peer.name, key.spec, ena.explain(rises))
        self._last_bytes[peer.name, key.spec] = result.moved_bytes()
        log.info("throughput -> %s %s x%s %s: %.4g Mbit/s", peer.name, *key.spec,
                 result.receiver_bytes_per_second * 8e-6)  # fmt: skip
        self.budget.spend(result.moved_bytes())

    @contextlib.contextmanager
    def _in_test(self, peer: str, key: TestSpec) -> Iterator[list[str]]:
        # The test's span in the log (Unix seconds), and its outcome: "ran", or the reason it did not
        # (a test the peer's server cut as it connected, e.g. out of turn, never held the peer).
        self._running_since = started = self.clock()
        outcome = ["error"]
        try:
            yield outcome
        finally:
            self._running_since = None
            ended = self.clock()
            self._ran.append((started, ended + DRAIN_SECONDS))
            log.info("throughput test -> %s %s: from %.3f to %.3f (%s)", peer, "/".join(key), started, ended,
                     outcome[0])  # fmt: skip

    def test(self, peer: Peer, s: ThroughputSettings, key: TestSpec) -> ThroughputTest:
        protocol, streams, direction = key
        auth = self.cfg.iperf3.auth
        return ThroughputTest(
            protocol=protocol, streams=int(streams), direction=direction,
            duration_seconds=s.duration_seconds, omit_seconds=s.omit_seconds,
            congestion=s.congestion, udp_bitrate=s.udp_bitrate, window_bytes=s.window_bytes,
            username=auth.username if auth else None,
            password_file=auth.password_file if auth else None,
            public_key_file=auth.public_key_file if auth else None,
            legacy_rsa_padding=auth.legacy_rsa_padding if auth else False,
            steady_state=Detector.of(s.steady_state) if s.steady_state.enabled else None,
            rtt_hint_seconds=self.tracker.rtt_median(peer.name),
            binary=self.cfg.iperf3.binary, margin_seconds=self.cfg.schedule.timeout_margin_seconds, dscp=s.dscp,
        )  # fmt: skip
