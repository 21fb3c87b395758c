"""Scheduled throughput tests: this host's client turns (schedule.py), the tests of each
turn, the byte budget, and recording what they measured."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

from . import ena, evidence
from .budget import Budget
from .config import Config, Peer
from .expected import ExpectedTracker
from .keys import TestKey
from .kinds import THROUGHPUT
from .limits import Expected
from .load import OwnTests
from .metrics.evidence import EvidenceRoom
from .metrics.host import HostRoom
from .metrics.throughput import TestRecorder, ThroughputRoom
from .probe_settings import TestSpec, ThroughputSettings
from .probes import Prober, Target, ThroughputResult, ThroughputTest
from .probes.steady import Detector
from .probes.throughput import ThroughputSink
from .responders import Iperf3ServerState
from .schedule import Timetable

log = logging.getLogger(__name__)

# A wait for a turn reads the wall clock this often: a stepped clock (NTP) is noticed then.
CLOCK_CHECK_SECONDS = 5.0
# A test waiting for a peer's test on this host's server to end looks this often.
SERVED_POLL_SECONDS = 0.1
# A test cut at its turn's end is killed this long before it, so that the kill and the reaping of
# its processes are done when the next half's test, whose jitter may be none, starts (a lab test that
# started 0.26 s late, the processes' start and exit under load, ran 0.13 s into the next half).
TURN_END_GUARD_SECONDS = 0.1


class TurnInputs(NamedTuple):
    """What turns are planned with; a reload replaces all three at once."""

    cfg: Config
    timetable: Timetable
    tracker: ExpectedTracker


@dataclass
class _Logged:
    """What the log says of one test: its outcome and, for one that ran, its iperf3's span."""

    outcome: str = "error"
    span: tuple[float, float] | None = None


class ThroughputTurns:
    def __init__(  # noqa: PLR0913, PLR0917 - the plan, the rooms and budget it writes to, what it waits on, the clock and its wait
        self,
        plan: TurnInputs,
        results: ThroughputRoom,
        host: HostRoom,
        budget: Budget,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        *,
        own: OwnTests,
        server: Iperf3ServerState,
        evidence: tuple[evidence.EvidenceStore, EvidenceRoom] | None = None,
    ):
        self.results, self.host, self.budget, self.clock, self.sleep = results, host, budget, clock, sleep
        self.own, self.server = own, server
        self.evidence = evidence  # where each test's whole record is kept, and the room of its id
        self._take(plan)
        self._next: TurnInputs | None = None
        self._last_bytes: dict[tuple[str, TestSpec], int] = {}
        self.interface = ena.interface(plan.cfg.host.interface)
        # Builds each test's prober (target, test, sink); a test may put a stand-in here.
        self.make_prober: Callable[[Target, ThroughputTest, ThroughputSink], Prober] = THROUGHPUT.prober

    def _take(self, plan: TurnInputs) -> None:
        self.cfg, self.timetable, self.tracker = plan
        self.peers = {p.name: p for p in plan.cfg.peers}

    def use(self, plan: TurnInputs) -> None:
        """A reload: the next turn is planned with these (a turn under way ends as planned)."""
        self._next = plan

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
        target = THROUGHPUT.target(self.cfg, peer)
        key = TestKey.of(peer.name, spec)
        while True:
            if self.clock() + test.max_seconds() > deadline:
                self.results.skip(peer.name, "slot_over")
                return
            before = await asyncio.to_thread(ena.read, self.interface)
            if self.server.serving:
                # A peer's test runs on this host's server (its clock is ahead, or its test overran):
                # a host is in one test at a time, so this one waits, or is skipped at the turn's end.
                if not await self._served(deadline - test.max_seconds()):
                    self.results.skip(peer.name, "serving_peer")
                    return
                continue
            witness = evidence.Witness(TestRecorder(self.results, key))
            started = self.clock()
            with self._in_test(peer.name, spec) as logged:
                kill_at = time.monotonic() + deadline - TURN_END_GUARD_SECONDS - self.clock()
                outcome = await self.make_prober(target, replace(test, kill_at=kill_at), witness).run()
                logged.outcome = "ran" if isinstance(outcome, ThroughputResult) else str(outcome)
                if isinstance(outcome, ThroughputResult) and outcome.started_timestamp:
                    logged.span = (outcome.started_timestamp, outcome.timestamp)
            if outcome == "busy":
                await self.sleep(random.uniform(1, 3))
                continue
            expected, after = None, None
            if isinstance(outcome, ThroughputResult):
                expected, after = await self._after(peer, key, outcome, before)
            span = (started, self.clock())
            ran = outcome if isinstance(outcome, ThroughputResult) else str(outcome)
            record = self._record(key, test, span, ran, witness.detail, expected, (before, after))
            await self._keep(key, record)
            return

    async def _served(self, until: float) -> bool:
        """Wait until no peer's test runs on this host's server, or until `until`: whether it ended."""
        while self.server.serving and self.clock() < until:
            await self.sleep(SERVED_POLL_SECONDS)
        return not self.server.serving

    async def _after(
        self, peer: Peer, key: TestKey, result: ThroughputResult, before: dict[str, int] | None
    ) -> tuple[Expected, dict[str, int] | None]:
        """A test's result: its expected value, the allowance counters it raised, its bytes; returns
        the expected value and the counters after it."""
        expected = self.tracker.rate(peer, key.spec, result)
        after = await asyncio.to_thread(ena.read, self.interface)
        self.host.read_allowances(self.interface, after)
        if before is not None and after is not None:
            rises = ena.rose(before, after)
            self.results.allowances_rose(key, rises)
            share = ena.srd_share(before, after)
            if share is not None:
                self.results.srd_share(key, share)
            if rises:
                log.warning("throughput -> %s %s: %s", peer.name, key.spec, ena.explain(rises))
        self._last_bytes[peer.name, key.spec] = result.moved_bytes()
        log.info(
            "throughput -> %s %s x%s %s: %.4g Mbit/s", peer.name, *key.spec, result.receiver_bytes_per_second * 8e-6
        )
        self.budget.spend(result.moved_bytes())
        return expected, after

    def _record(  # noqa: PLR0913, PLR0917 - what one test's record holds
        self,
        key: TestKey,
        test: ThroughputTest,
        span: tuple[float, float],
        outcome: ThroughputResult | str,
        detail: str,
        expected: Expected | None,
        counters: tuple[dict[str, int] | None, dict[str, int] | None],
    ) -> dict[str, object]:
        """The test's record for the evidence store: its settings, its whole result or why it gave
        none, what it should have reached and the limit that says so, the ENA counters around it."""
        before, after = counters
        ran = isinstance(outcome, ThroughputResult)
        settings = {k: v for k, v in asdict(test).items() if k != "steady_state"}
        return evidence.record(
            test_id=evidence.new_id(span[0]),
            host=self.cfg.host.name,
            key=key,
            started=span[0],
            ended=span[1],
            outcome="ran" if ran else str(outcome),
            detail=detail,
            settings={**settings, "steady": test.steady is not None},
            result=outcome.to_json() if isinstance(outcome, ThroughputResult) else None,
            expected=asdict(expected) if expected is not None else None,
            ena=_counters(before, after) if before or after else None,
            rtt_median_seconds=self.tracker.rtt_median(key.peer),
        )

    async def _keep(self, key: TestKey, record: dict[str, object]) -> None:
        """Keep the record (in a thread: the store writes and syncs a file); a full disk or a
        broken directory is counted by the store and logged, never the turn's failure."""
        if self.evidence is None:
            return
        store, room = self.evidence
        try:
            kept = await asyncio.to_thread(store.add, record)
        except evidence.StoreError as exc:
            log.warning("throughput -> %s: its record is not kept (%s): %s", key.peer, exc.reason, exc)
            return
        room.kept(key, kept.id)

    @contextlib.contextmanager
    def _in_test(self, peer: str, key: TestSpec) -> Iterator[_Logged]:
        # The test's span in the log (Unix seconds), and its outcome: "ran", or the reason it did not
        # (a test the peer's server cut as it connected, e.g. out of turn, never held the peer). A test
        # that ran logs the span its iperf3 processes ran in: the version check and the peer's report
        # of its end come after, while the peer's server may already run the next host's test.
        started = self.clock()
        self.own.started(started)  # RTT samples from now are "loaded", even past the schedule's window
        logged = _Logged()
        try:
            yield logged
        finally:
            ended = self.clock()
            self.own.ended(ended)
            began, over = logged.span or (started, ended)
            log.info(
                "throughput test -> %s %s: from %.3f to %.3f (%s)", peer, "/".join(key), began, over, logged.outcome
            )

    def test(self, peer: Peer, s: ThroughputSettings, key: TestSpec) -> ThroughputTest:
        protocol, streams, direction = key
        auth = self.cfg.iperf3.auth
        return ThroughputTest(
            protocol=protocol,
            streams=int(streams),
            direction=direction,
            duration_seconds=s.duration_seconds,
            omit_seconds=s.omit_seconds,
            congestion=s.congestion,
            udp_bitrate=s.udp_bitrate,
            window_bytes=s.window_bytes,
            username=auth.username if auth else None,
            password_file=auth.password_file if auth else None,
            public_key_file=auth.public_key_file if auth else None,
            legacy_rsa_padding=auth.legacy_rsa_padding if auth else False,
            steady_state=Detector.of(s.steady_state) if s.steady_state.enabled else None,
            rtt_hint_seconds=self.tracker.rtt_median(peer.name),
            binary=self.cfg.iperf3.binary,
            margin_seconds=self.cfg.schedule.timeout_margin_seconds,
            dscp=s.dscp,
            report_port=peer.rr_port or self.cfg.responders.rr_port,
            processes=self.cfg.iperf3.processes,
        )


def _counters(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, object]:
    """A record's ENA counters: before and after the test, the allowances that rose, SRD's share."""
    rose, share = ena.rose(before, after), ena.srd_share(before, after)
    return {"before": before, "after": after, "rose": rose, "srd_share": share}
