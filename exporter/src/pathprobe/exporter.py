"""`pathprobe run`: wires one exporter together. Config -> schedule -> probes -> rooms ->
/metrics (docs/ARCHITECTURE.md): the responders answer peers, a continuous RTT, UDP echo and
MTU prober run per peer, the throughput turns take this host's turns of the schedule, and
everything they measure lands in the room (metrics/) that owns it and that /metrics reads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel

from . import ena, responders
from .allow import AllowList
from .budget import Budget
from .clock import ClockErrorBound
from .config import Config, Peer
from .expected import ExpectedTracker
from .metrics import Rooms
from .probes import CONTINUOUS, PROBERS, Prober, Target
from .probes.base import Pacer
from .schedule import Schedule, Timetable
from .turns import Plan, ThroughputTurns

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
# How often the ENA allowance counters are read (in the background: ethtool may take seconds).
ALLOWANCES_READ_SECONDS = 10.0
# What a reload cannot change: the listening sockets, the iperf3 server and the budget's file
# are set up once at start (systemctl restart applies them).
RESTART_ONLY = ("host", "responders", "iperf3", "web", "budget", "clock")


class Prepared(NamedTuple):
    """A new config and this host's view of its schedule, computed off the event loop (reloads.py)."""

    cfg: Config
    schedule: Schedule


class ReloadError(Exception):
    """A new config that cannot replace the running one; the running one is kept."""


def schedule_of(cfg: Config) -> Schedule:
    return Schedule.of([m.name for m in cfg.members], cfg.schedule.slot_seconds, cfg.throughput_pairs)


def schedule_view(cfg: Config) -> Schedule:
    """The mesh's schedule as far as this host and the peers it probes take part: all an exporter
    reads of it (its turns, its clients, whether a peer is in a test)."""
    return schedule_of(cfg).projected({cfg.host.name, *(p.name for p in cfg.probed_peers)})


def epoch_of(cfg: Config, now: float = 0.0) -> float:
    """When `cfg`'s schedule takes effect: mesh.epoch (at the latest `now`), up to the next
    slot boundary, which every host computes alike (no turn of the old schedule spans it)."""
    at = max(cfg.mesh.epoch.timestamp() if cfg.mesh.epoch is not None else 0.0, now)
    return math.ceil(at / cfg.schedule.slot_seconds) * cfg.schedule.slot_seconds


# mesh.epoch further ahead than this is taken for a mistake: a rollout sets it minutes or
# hours ahead (the last host must load the config before it), and until it a fresh start
# takes no throughput test and a reload keeps the old schedule.
EPOCH_AHEAD_LIMIT_SECONDS = 86400.0


def epoch_too_far_ahead(cfg: Config, now: float) -> str | None:
    """What is wrong with `cfg`'s mesh.epoch when it is more than EPOCH_AHEAD_LIMIT_SECONDS
    after `now` (check-config warns of it; the exporter logs it and runs on), else None."""
    if cfg.mesh.epoch is None:
        return None
    at = cfg.mesh.epoch.timestamp()
    ahead = at - now
    if ahead <= EPOCH_AHEAD_LIMIT_SECONDS:
        return None
    far = f"{ahead / 3600:.1f} h" if ahead < 2 * 86400 else f"{ahead / 86400:.0f} days"
    return (f"mesh.epoch: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(at))} is {far} "
            f"ahead of this host's clock: this member list's throughput schedule starts only then (until then "
            f"a fresh start takes no test and a reload keeps the old schedule); more than "
            f"{EPOCH_AHEAD_LIMIT_SECONDS / 3600:g} h ahead is taken for a mistake")  # fmt: skip


class Exporter:
    def __init__(self, cfg: Config, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):  # fmt: skip
        """`clock` and `sleep` are the wall clock and the wait the schedule keeps its turns by: a test
        may pass a virtual pair (time that moves only when the schedule waits)."""
        self.clock = clock
        self.budget = Budget(cfg.budget.daily_bytes, cfg.budget.state_file, clock)
        self.timetable = Timetable(schedule_view(cfg), epoch_of(cfg))
        # Late-bound: a test may put its own load_state on the exporter.
        load_state = lambda peer, now: self.load_state(peer, now)  # noqa: E731, PLW0108 - late binding, see above
        self.clock_bound = ClockErrorBound(cfg.clock)
        self.rooms = Rooms(cfg, self.timetable, self.budget, load_state, self.clock_bound, clock)
        self._configure(cfg, ExpectedTracker(cfg, self.rooms.throughput))
        self.turns = ThroughputTurns(Plan(cfg, self.timetable, self.tracker), self.rooms.throughput, self.rooms.host,
                                     self.budget, clock, sleep)  # fmt: skip
        self.allowed = AllowList.of(cfg)  # the responders hold this object: a reload updates it in place
        self.interface = ena.interface(cfg.host.interface)
        if cfg.host.probe_source is None:
            log.warning("host.address %s is not one of this host's addresses: probes leave from the route's "
                        "address, which peers admit only by responders.allow (host.source_address names it)",
                        cfg.host.address)  # fmt: skip
        self._probing: list[asyncio.Task[object]] = []
        self.responders_listening = False  # from the responders' start to their close

    def unready(self) -> str | None:
        """Why this exporter is not ready (GET /-/ready says it with 503), or None: its config is loaded
        (it is, to exist), its responders listen and its iperf3 server runs, so peers can probe it."""
        if not self.responders_listening:
            return "the responders are not listening yet"
        if not self.rooms.host.iperf3_server_up:
            return "the iperf3 server is not running (pathprobe_iperf3_server_up; the log says why)"
        return None

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
                self.rooms.host.turns_expected()

    @property
    def schedule(self) -> Schedule:
        """The newest schedule (in force from its epoch)."""
        return self.timetable.current

    def check_reloadable(self, cfg: Config) -> None:
        """Raise ReloadError when `cfg` changes what only a restart applies."""
        changed = [name for name in RESTART_ONLY if getattr(cfg, name) != getattr(self.cfg, name)]
        if changed:
            raise ReloadError(f"{', '.join(changed)} changed: only a restart applies them; the running config is kept")

    def apply(self, prepared: Prepared) -> None:
        """Replace the running config (peers, mesh, probes, schedule and limits) by a prepared
        one; a new member list's schedule takes effect at `mesh.epoch` (at once without one)."""
        cfg, now = prepared.cfg, self.clock()
        before, after = {p.name for p in self.cfg.probed_peers}, {p.name for p in cfg.probed_peers}
        self.timetable = self.timetable.then(prepared.schedule, epoch_of(cfg, now), now)
        tracker = ExpectedTracker(cfg, self.rooms.throughput)
        tracker.windows.update({k: w for k, w in self.tracker.windows.items() if k in tracker.windows})
        self.rooms.use(cfg, self.timetable)  # first: the rooms admit the new peers' expected values
        self._configure(cfg, tracker)
        self.allowed.replace(AllowList.of(cfg))
        self.turns.use(Plan(cfg, self.timetable, tracker))
        if self._probing:  # running: the continuous probes restart with the new peers and settings
            for task in self._probing:
                task.cancel()
            self._probing = self._start_probers()
        log.info("config reloaded: %d peers probed for RTT, %d for throughput; schedule %s from %s",
                 len(cfg.rtt_peers), len(cfg.throughput_peers), self.timetable.current.fingerprint,
                 time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.timetable.epoch)))  # fmt: skip
        if len(after) * 2 < len(before):
            # Fewer than half the peers left is more often a file cut short than a rollout: said and counted.
            self.rooms.host.reload_dropped_most()
            log.warning("config reload left %d of %d probed peers (dropped: %s): a file cut short?",
                        len(after), len(before), ", ".join(sorted(before - after)[:5]))  # fmt: skip

    def reload(self, cfg: Config) -> None:
        """Check, prepare and apply `cfg` here and now (the exporter's reloads prepare off the loop: reloads.py)."""
        self.check_reloadable(cfg)
        self.apply(Prepared(cfg, schedule_view(cfg)))

    def _start_probers(self) -> list[asyncio.Task[object]]:
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
        whose client turn against this host it is not by the schedule, or any peer while this
        host runs a test of its own: whatever the clocks, a host is in one test at a time)."""
        peer = self._peer_at.get(AllowList.normalize(address))
        if peer is None:
            return "ok" if self._extra_allowed.allows(address) else "not_allowed"
        if self.cfg.iperf3.admit == "peers":
            return "ok"
        if self._extra_allowed.allows(address):
            return "ok"
        if self.turns.in_test():
            return "out_of_turn"  # by its own clock it is this host's turn: two tests would measure each other
        clients = self.timetable.clients_of(self.cfg.host.name, self.clock(), TURN_GRACE_SECONDS)
        return "ok" if peer in clients else "out_of_turn"

    def probers(self) -> list[tuple[str, Prober]]:
        """(task name, prober) of every continuous probe of every peer."""
        local_mtu = host_max_mtu()
        found = []
        for peer in self.cfg.rtt_peers:
            for kind in CONTINUOUS:
                settings = self._settings(kind, peer, local_mtu)
                if settings is not None:
                    prober = PROBERS[kind](self._target(kind, peer), settings, self._sink(kind, peer))
                    found.append((f"{kind}-{peer.name}", prober))
        return found

    def _target(self, kind: str, peer: Peer) -> Target:
        """The responder a continuous probe of `kind` reaches: rr for RTT, echo for loss and MTU."""
        responders = self.cfg.responders
        port = (peer.rr_port or responders.rr_port) if kind == "rtt" else (peer.echo_port or responders.echo_port)
        return Target(str(peer.address), port, self.cfg.host.probe_source)

    def _settings(self, kind: str, peer: Peer, local_mtu: int | None) -> BaseModel | None:
        """The settings model of a continuous probe of `kind` (None: disabled); MTU sizes as this path
        and this host allow."""
        settings = getattr(self.cfg.probes, kind)
        if not settings.enabled:
            return None
        if kind != "mtu":
            return settings  # type: ignore[no-any-return]
        wanted = settings.sizes_for(peer.path_class.value)
        sizes = [s for s in wanted if local_mtu is None or s <= local_mtu]
        if sizes != wanted:
            log.warning("mtu probes to %s: sizes above this host's largest interface MTU (%s) left out: %s",
                        peer.name, local_mtu, sorted(set(wanted) - set(sizes)))  # fmt: skip
        return settings.model_copy(update={"sizes": sizes})  # type: ignore[no-any-return]

    def _sink(self, kind: str, peer: Peer) -> object:
        if kind == "rtt":  # the RTT room, and the window the expected values read
            return self.rooms.rtt_sink(peer.name, self.cfg.probes.rtt.size_bytes, self.tracker.windows[peer.name])
        return self.rooms.echo_sink(peer.name) if kind == "loss" else self.rooms.mtu_sink(peer.name)

    async def read_allowances(self) -> None:
        """Until cancelled: the ENA allowance counters for /metrics (none where the driver is not)."""
        while True:
            counters = await asyncio.to_thread(ena.read, self.interface)
            self.rooms.host.read_allowances(self.interface, counters)
            await asyncio.sleep(ALLOWANCES_READ_SECONDS)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; raises responders.ResponderError when a port is taken."""
        running = await responders.start(self.cfg.responders, self.cfg.iperf3, self.allowed, self.rooms.host,
                                         self.iperf3_admission, lambda: self.clock_bound.seconds)  # fmt: skip
        self.responders_listening = True
        Pacer.of(asyncio.get_running_loop()).late = self.rooms.host
        self._probing = self._start_probers()
        background = [asyncio.create_task(self.turns.run(stop), name="throughput"),
                      asyncio.create_task(self.read_allowances(), name="allowances"),
                      asyncio.create_task(self.clock_bound.run(), name="clock-bound")]  # fmt: skip
        try:
            await stop.wait()
        finally:
            tasks = [*self._probing, *background]
            self._probing = []
            for t in tasks:
                t.cancel()
            _, stuck = await asyncio.wait(tasks, timeout=STOP_SECONDS)
            for t in stuck:
                log.error("task %s did not stop", t.get_name())
            self.responders_listening = False
            await running.close()
