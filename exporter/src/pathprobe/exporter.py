"""`pathprobe run`: wires one exporter together. Config -> schedule -> probes -> store ->
collector -> /metrics (docs/ARCHITECTURE.md): the responders answer peers, a continuous
RTT and a UDP echo prober run per peer, the throughput turns take this host's turns of
the schedule, and everything they measure lands in the store that /metrics reads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from . import config, responders
from .allow import AllowList
from .budget import Budget
from .collector import Collector
from .config import Config
from .expected import ExpectedTracker
from .probes import EchoProber, MtuProber, RttProber, Target
from .probes.base import RttTee
from .schedule import Schedule, Timetable
from .store import Store
from .turns import ThroughputTurns
from .yamlfile import ConfigError

log = logging.getLogger(__name__)


def host_max_mtu() -> int | None:
    """The largest MTU of this host's network interfaces but loopback (None where /sys does not say)."""
    mtus = []
    for f in Path("/sys/class/net").glob("*/mtu"):
        if f.parent.name == "lo":
            continue
        with contextlib.suppress(OSError, ValueError):
            mtus.append(int(f.read_text()))
    return max(mtus, default=None)


# How far hosts' clocks may disagree before a peer's test looks out of its turn (the
# schedule already assumes clocks that agree to well under its jitter; NTP gives ms).
TURN_GRACE_SECONDS = 1.0
# SIGTERM must stop the exporter within 5 s whatever a task does.
STOP_SECONDS = 4.0
# What a reload cannot change: the listening sockets, the iperf3 server and the budget's file
# are set up once at start (systemctl restart applies them).
RESTART_ONLY = ("host", "responders", "iperf3", "web", "budget")


class ReloadError(Exception):
    """A new config that cannot replace the running one; the running one is kept."""


def schedule_of(cfg: Config) -> Schedule:
    return Schedule.of([m.name for m in cfg.members], cfg.schedule.slot_seconds, cfg.throughput_pairs)


def epoch_of(cfg: Config, now: float = 0.0) -> float:
    """When `cfg`'s schedule takes effect: mesh.epoch (at the latest `now`), up to the next
    slot boundary, which every host computes alike (no turn of the old schedule spans it)."""
    at = max(cfg.mesh.epoch.timestamp() if cfg.mesh.epoch is not None else 0.0, now)
    return math.ceil(at / cfg.schedule.slot_seconds) * cfg.schedule.slot_seconds


class Exporter:
    def __init__(self, cfg: Config, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.store = Store(clock)
        self.store.load_state = self.load_state
        self.budget = Budget(cfg.budget.daily_bytes, cfg.budget.state_file, clock)
        self.timetable = Timetable(schedule_of(cfg), epoch_of(cfg))
        self._configure(cfg, ExpectedTracker(cfg, self.store))
        self.turns = ThroughputTurns(cfg, self.store, self.timetable, self.budget, self.tracker, clock)
        self.collector = Collector(cfg, self.timetable, self.budget, self.store)
        self.allowed = AllowList.of(cfg)  # the responders hold this object: a reload updates it in place
        self._probing: list[asyncio.Task[None]] = []

    def _configure(self, cfg: Config, tracker: ExpectedTracker) -> None:
        self.cfg, self.tracker = cfg, tracker
        self._peer_at = {AllowList.normalize(str(p.address)): p.name for p in cfg.probed_peers}
        self._extra_allowed = AllowList(cfg.responders.allow)
        # How long a half-slot's tests run, as scheduled.
        self.test_seconds = cfg.half_slot_need(with_margin=False)
        for peer in cfg.throughput_peers:
            settings = cfg.throughput_for(peer)
            if settings.enabled:
                self.tracker.rate_all(peer, settings.tests())
                if self.store.last_turn is None:
                    self.store.last_turn = self.clock()

    @property
    def schedule(self) -> Schedule:
        """The newest schedule (in force from its epoch)."""
        return self.timetable.current

    def reload(self, cfg: Config) -> None:
        """Replace the running config by `cfg`: peers, mesh, probes, schedule and limits; a new
        member list's schedule takes effect at `mesh.epoch` (at once without one). Raises
        ReloadError, keeping the running config, when `cfg` changes what only a restart applies."""
        changed = [name for name in RESTART_ONLY if getattr(cfg, name) != getattr(self.cfg, name)]
        if changed:
            raise ReloadError(f"{', '.join(changed)} changed: only a restart applies them; the running config is kept")
        now = self.clock()
        self.timetable = self.timetable.then(schedule_of(cfg), epoch_of(cfg, now), now)
        tracker = ExpectedTracker(cfg, self.store)
        tracker.windows.update({k: w for k, w in self.tracker.windows.items() if k in tracker.windows})
        with self.collector.lock:
            self._configure(cfg, tracker)
            self.store.forget({p.name for p in cfg.probed_peers})
            self.collector.use(cfg, self.timetable)
        self.allowed.replace(AllowList.of(cfg))
        self.turns.use(cfg, self.timetable, tracker)
        if self._probing:  # running: the continuous probes restart with the new peers and settings
            for task in self._probing:
                task.cancel()
            self._probing = self._start_probers()
        log.info("config reloaded: %d peers probed for RTT, %d for throughput; schedule %s from %s",
                 len(cfg.rtt_peers), len(cfg.throughput_peers), self.timetable.current.fingerprint,
                 time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.timetable.epoch)))  # fmt: skip

    def reload_from(self, path: str | Path) -> str | None:
        """Load the config at `path` and reload it (SIGHUP, POST /-/reload): None when applied,
        else what is wrong with it (logged and counted; the running config is kept)."""
        try:
            self.reload(config.load(path, check_files=True))
        except (ConfigError, ReloadError) as exc:
            self.store.reloads["failure"] += 1
            self.store.last_reload_ok = False
            log.error("config reload refused: %s", exc)
            return str(exc)
        self.store.reloads["success"] += 1
        self.store.last_reload_ok = True
        return None

    def _start_probers(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(p.run(), name=name) for name, p in self.probers()]

    def load_state(self, peer: str, now: float) -> str:
        """RTT samples taken while this host or the peer may be in a throughput test sit
        behind that test's queue: they are kept apart as "loaded". "May be" is the schedule's
        window for both hosts, and for this host also the time its own tests really ran
        (a retried test can run past the window)."""
        active = self.test_seconds
        busy = self.timetable.busy
        if active and (busy(self.cfg.host.name, now, active) or busy(peer, now, active)):
            return "loaded"
        return "loaded" if self.turns.testing(now) else "idle"

    def iperf3_admission(self, address: str) -> str:
        """Whether a test from `address` may run on this host's iperf3 server now: "ok",
        "not_allowed" (neither a peer nor in responders.allow) or "out_of_turn" (a peer
        whose client turn against this host it is not, by the schedule)."""
        peer = self._peer_at.get(AllowList.normalize(address))
        if peer is None:
            return "ok" if self._extra_allowed.allows(address) else "not_allowed"
        if self.cfg.iperf3.admit == "peers":
            return "ok"
        clients = self.timetable.clients_of(self.cfg.host.name, self.clock(), TURN_GRACE_SECONDS)
        return "ok" if peer in clients or self._extra_allowed.allows(address) else "out_of_turn"

    def probers(self) -> list[tuple[str, RttProber | EchoProber | MtuProber]]:
        """(task name, prober) of every continuous probe of every peer."""
        cfg = self.cfg
        probes: list[tuple[str, RttProber | EchoProber | MtuProber]] = []
        local_mtu = host_max_mtu()
        for peer in cfg.rtt_peers:
            addr = str(peer.address)
            if cfg.probes.rtt.enabled:
                target = Target(addr, peer.rr_port or cfg.responders.rr_port)
                sink = RttTee(
                    self.store.rtt_sink(peer.name, cfg.probes.rtt.size_bytes), self.tracker.windows[peer.name]
                )
                probes.append((f"rtt-{peer.name}", RttProber(target, cfg.probes.rtt, sink)))
            if cfg.probes.loss.enabled:
                target = Target(addr, peer.echo_port or cfg.responders.echo_port)
                probes.append(
                    (f"loss-{peer.name}", EchoProber(target, cfg.probes.loss, self.store.echo_sink(peer.name)))
                )
            if cfg.probes.mtu.enabled:
                target = Target(addr, peer.echo_port or cfg.responders.echo_port)
                wanted = cfg.probes.mtu.sizes_for(peer.path_class.value)
                sizes = [s for s in wanted if local_mtu is None or s <= local_mtu]
                if sizes != wanted:
                    log.warning("mtu probes to %s: sizes above this host's largest interface MTU (%s) left out: %s",
                                peer.name, local_mtu, sorted(set(wanted) - set(sizes)))  # fmt: skip
                mtu = MtuProber(target, cfg.probes.mtu, sizes, self.store.mtu_sink(peer.name))
                probes.append((f"mtu-{peer.name}", mtu))
        return probes

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; raises responders.ResponderError when a port is taken."""
        s = self.store
        running = await responders.start(
            self.cfg.responders, self.cfg.iperf3, self.allowed, s.count_request, s.set_iperf3_up,
            s.iperf3_restarted, self.iperf3_admission,
        )  # fmt: skip
        self._probing = self._start_probers()
        turns = asyncio.create_task(self.turns.run(stop), name="throughput")
        try:
            await stop.wait()
        finally:
            tasks = [*self._probing, turns]
            self._probing = []
            for t in tasks:
                t.cancel()
            _, stuck = await asyncio.wait(tasks, timeout=STOP_SECONDS)
            for t in stuck:
                log.error("task %s did not stop", t.get_name())
            await running.close()
