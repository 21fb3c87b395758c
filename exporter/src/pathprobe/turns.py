"""Scheduled throughput tests: this host's client turns (schedule.py), the tests of each
turn, the byte budget, and recording what they measured."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from . import ena
from .budget import Budget
from .config import Config, Peer, ThroughputSettings
from .expected import ExpectedTracker
from .probes import ProbeFailure, ThroughputProber, ThroughputTest
from .probes.steady import Detector
from .schedule import Schedule
from .store import Store

log = logging.getLogger(__name__)


class ThroughputTurns:
    def __init__(self, cfg: Config, store: Store, schedule: Schedule, budget: Budget, tracker: ExpectedTracker,
                 clock: Callable[[], float]):  # fmt: skip
        self.cfg, self.store, self.schedule, self.budget, self.tracker = cfg, store, schedule, budget, tracker
        self.clock = clock
        self.peers = {p.name: p for p in cfg.peers}
        self.prober = ThroughputProber(cfg.iperf3.binary, cfg.schedule.timeout_margin_seconds)
        self._last_bytes: dict[tuple[str, tuple[str, str, str]], int] = {}
        self.interface = ena.interface(cfg.host.interface)

    async def run(self, stop: asyncio.Event) -> None:
        """Take every turn of this host until `stop`. Never ends on an error: a turn that
        fails unexpectedly is logged and counted (pathprobe_schedule_turn_errors_total)
        and the next turn is taken as usual."""
        host = self.cfg.host.name
        while not stop.is_set():
            turn = self.schedule.next_turn(host, self.clock())
            if turn is None:
                return
            peer = self.peers[turn.peer]
            delay = turn.start - self.clock() + random.uniform(0, self.cfg.schedule.jitter_seconds)
            if delay > 0:
                await asyncio.sleep(delay)
            settings = self.cfg.throughput_for(peer)
            if settings.enabled:
                self.store.schedule_turns += 1
                self.store.last_turn = self.clock()
                try:
                    await self.run_turn(peer, settings, turn.end)
                except Exception as exc:
                    self.store.turn_errors[type(exc).__name__] += 1
                    log.exception("throughput turn against %s failed; going on with the next turn", peer.name)
            # Never take the same turn twice.
            await asyncio.sleep(max(0.0, turn.end - self.clock()))

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
