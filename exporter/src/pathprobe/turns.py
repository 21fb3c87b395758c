"""Scheduled throughput tests: this host's client turns (schedule.py), the tests of each
turn, the byte budget, and recording what they measured."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
from collections.abc import Callable, Iterator

from . import ena
from .budget import Budget
from .config import Config, Peer, ThroughputSettings
from .expected import ExpectedTracker
from .probes import ProbeFailure, ThroughputProber, ThroughputTest
from .probes.steady import Detector
from .schedule import Timetable
from .store import Store

log = logging.getLogger(__name__)

# After a test, the shapers' and the peer's queues still hold its last window of data.
DRAIN_SECONDS = 1.0
# A wait for a turn reads the wall clock this often: a stepped clock (NTP) is noticed then.
CLOCK_CHECK_SECONDS = 5.0


class ThroughputTurns:
    def __init__(self, cfg: Config, store: Store, timetable: Timetable, budget: Budget, tracker: ExpectedTracker,
                 clock: Callable[[], float]):  # fmt: skip
        self.store, self.budget, self.clock = store, budget, clock
        self._take(cfg, timetable, tracker)
        self._next: tuple[Config, Timetable, ExpectedTracker] | None = None
        self._last_bytes: dict[tuple[str, tuple[str, str, str]], int] = {}
        self.interface = ena.interface(cfg.host.interface)
        # When this host's own tests ran, with DRAIN_SECONDS after each: RTT samples taken
        # then are "loaded" even where a retried test ran past the schedule's window.
        self._running_since: float | None = None
        self._ran: collections.deque[tuple[float, float]] = collections.deque(maxlen=8)

    def _take(self, cfg: Config, timetable: Timetable, tracker: ExpectedTracker) -> None:
        self.cfg, self.timetable, self.tracker = cfg, timetable, tracker
        self.peers = {p.name: p for p in cfg.peers}
        self.prober = ThroughputProber(cfg.iperf3.binary, cfg.schedule.timeout_margin_seconds)

    def use(self, cfg: Config, timetable: Timetable, tracker: ExpectedTracker) -> None:
        """A reload: the next turn is planned with these (a turn under way ends as planned)."""
        self._next = (cfg, timetable, tracker)

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
                self._take(*self._next)
                self._next = None
            turn = self.timetable.next_turn(host, self.clock())
            if turn is None:  # no throughput peer: nothing to do until a reload brings one
                await self._sleep_until(float("inf"))
                continue
            if (turn.start, turn.peer) == taken:  # its tests are done (or the clock was stepped back into it)
                await self._sleep_until(turn.end)
                continue
            peer = self.peers[turn.peer]
            if not await self._sleep_until(turn.start + random.uniform(0, self.cfg.schedule.jitter_seconds)):
                continue
            taken = (turn.start, turn.peer)
            settings = self.cfg.throughput_for(peer)
            if settings.enabled:
                self.store.schedule_turns += 1
                self.store.last_turn = self.clock()
                try:
                    await self.run_turn(peer, settings, turn.end)
                except Exception as exc:
                    self.store.turn_errors[type(exc).__name__] += 1
                    log.exception("throughput turn against %s failed; going on with the next turn", peer.name)

    async def _sleep_until(self, when: float) -> bool:
        """Wait until the wall clock reads `when`, reading it at least every
        CLOCK_CHECK_SECONDS: a clock stepped forward ends the wait at the next read, one
        stepped back (the time left grew) too, returning False: the caller then takes the
        schedule from the new time instead of waiting out the step; so does a reload."""
        left = when - self.clock()
        while left > 0:
            await asyncio.sleep(min(left, CLOCK_CHECK_SECONDS))
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
        margin = self.cfg.schedule.timeout_margin_seconds
        keys = settings.tests()
        self.tracker.rate_all(peer, keys)
        for key in keys:
            test = self.test(peer, settings, key)
            if not self.budget.allows(self._last_bytes.get((peer.name, key), 0)):
                self.store.skipped[peer.name, "budget"] += 1
                continue
            while True:
                if self.clock() + test.max_seconds(margin) > deadline:
                    self.store.skipped[peer.name, "slot_over"] += 1
                    break
                before = await asyncio.to_thread(ena.read, self.interface)
                try:
                    with self._in_test(peer.name, key):
                        result = await self.prober.run(test)
                except ProbeFailure as exc:
                    self.store.failure("throughput", peer.name, exc.reason)
                    log.info("throughput %s %s: %s", peer.name, key, exc)
                    if exc.reason == "busy":
                        await asyncio.sleep(random.uniform(1, 3))
                        continue
                    break
                self.tracker.rate(peer, key, result)
                self.store.record_throughput((peer.name, *key), result)
                after = await asyncio.to_thread(ena.read, self.interface)
                if before is not None and after is not None:
                    rises = ena.rose(before, after)
                    self.store.allowance_rises[(peer.name, *key)] = rises
                    if rises:
                        log.warning("throughput -> %s %s: %s", peer.name, key, ena.explain(rises))
                self._last_bytes[peer.name, key] = result.moved_bytes()
                log.info("throughput -> %s %s x%s %s: %.4g Mbit/s", peer.name, *key,
                         result.receiver_bytes_per_second * 8e-6)  # fmt: skip
                self.budget.spend(result.moved_bytes())
                break

    @contextlib.contextmanager
    def _in_test(self, peer: str, key: tuple[str, str, str]) -> Iterator[None]:
        # The test's span in the log (Unix seconds): when it held this host and the peer.
        self._running_since = started = self.clock()
        try:
            yield
        finally:
            self._running_since = None
            ended = self.clock()
            self._ran.append((started, ended + DRAIN_SECONDS))
            log.info("throughput test -> %s %s: from %.3f to %.3f", peer, "/".join(key), started, ended)

    def test(self, peer: Peer, s: ThroughputSettings, key: tuple[str, str, str]) -> ThroughputTest:
        protocol, streams, direction = key
        auth = self.cfg.iperf3.auth
        return ThroughputTest(
            address=str(peer.address), port=peer.iperf3_port or self.cfg.iperf3.port,
            protocol=protocol, streams=int(streams), direction=direction,
            duration_seconds=s.duration_seconds, omit_seconds=s.omit_seconds,
            congestion=s.congestion, udp_bitrate=s.udp_bitrate, window_bytes=s.window_bytes,
            username=auth.username if auth else None,
            password_file=auth.password_file if auth else None,
            public_key_file=auth.public_key_file if auth else None,
            steady_state=Detector.of(s.steady_state) if s.steady_state.enabled else None,
            rtt_hint_seconds=self.tracker.windows[peer.name].median(),
        )  # fmt: skip
