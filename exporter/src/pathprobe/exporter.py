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

from . import ena, flowreader, responders
from .allow import AllowList
from .budget import Budget
from .clock import ClockErrorBound
from .config import Config, Iperf3Settings
from .evidence import EvidenceStore
from .expected import ExpectedTracker
from .kinds import KINDS, Wiring
from .load import LoadState, OwnTests
from .metrics import Rooms
from .probes import Prober
from .probes.pacer import Pacer
from .schedule import Schedule, Timetable
from .turns import ThroughputTurns, TurnInputs

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
# What a reload cannot change: the listening sockets, the iperf3 server, the budget's file and the
# evidence store are set up once at start (systemctl restart applies them).
RESTART_ONLY = ("host", "responders", "iperf3", "web", "budget", "evidence", "clock")


def evidence_store(cfg: Config) -> EvidenceStore | None:
    """The evidence store of `cfg` (evidence.py), read back from its directory; None where it is disabled."""
    e = cfg.evidence
    return EvidenceStore(e.path(cfg.budget, cfg.host.name), e.max_tests, e.max_bytes).open() if e.enabled else None


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
    return (
        f"mesh.epoch: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(at))} is {far} "
        f"ahead of this host's clock: this member list's throughput schedule starts only then (until then "
        f"a fresh start takes no test and a reload keeps the old schedule); more than "
        f"{EPOCH_AHEAD_LIMIT_SECONDS / 3600:g} h ahead is taken for a mistake"
    )


class Exporter:
    def __init__(
        self,
        cfg: Config,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        """`clock` and `sleep` are the wall clock and the wait the schedule keeps its turns by: a test
        may pass a virtual pair (time that moves only when the schedule waits)."""
        self.clock = clock
        self.budget = Budget(cfg.budget.daily_bytes, cfg.budget.state_file, clock)
        self.timetable = Timetable(schedule_view(cfg), epoch_of(cfg))
        self.own_tests = OwnTests()  # the turns write when this host's tests run; the load state reads it
        self.load = LoadState(cfg.host.name, self.timetable, cfg.half_slot_need(with_margin=False), self.own_tests)
        self.clock_bound = ClockErrorBound(cfg.clock)
        self.evidence = evidence_store(cfg)
        kinds = KINDS.values()
        self.rooms = Rooms(
            cfg, self.timetable, self.budget, self.load, self.clock_bound, clock, kinds=kinds, evidence=self.evidence
        )
        self.iperf3 = responders.Iperf3ServerState(self.rooms.host)  # the responders keep it; it tells the room
        self._configure(cfg, ExpectedTracker(cfg, self.rooms.throughput))
        self.turns = ThroughputTurns(
            TurnInputs(cfg, self.timetable, self.tracker),
            self.rooms.throughput,
            self.rooms.host,
            self.budget,
            clock,
            sleep,
            own=self.own_tests,
            server=self.iperf3,
            evidence=(self.evidence, self.rooms.evidence) if self.evidence is not None else None,
        )
        self.allowed = AllowList.of(cfg)  # the responders hold this object: a reload updates it in place
        self.interface = ena.interface(cfg.host.interface)
        if cfg.host.probe_source is None:
            log.warning(
                "host.address %s is not one of this host's addresses: probes leave from the route's "
                "address, which peers admit only by responders.allow (host.source_address names it)",
                cfg.host.address,
            )
        self.flows = flowreader.FlowReader(cfg)  # reads while flows.enabled (a reload may change it)
        self._probing: list[asyncio.Task[object]] = []
        self.responders_listening = False  # from the responders' start to their close

    def unready(self) -> str | None:
        """Why this exporter is not ready (GET /-/ready says it with 503), or None: its config is loaded
        (it is, to exist), its responders listen and its iperf3 server runs, so peers can probe it."""
        if not self.responders_listening:
            return "the responders are not listening yet"
        if not self.iperf3.up:
            return "the iperf3 server is not running (pathprobe_iperf3_server_up; the log says why)"
        return None

    def _configure(self, cfg: Config, tracker: ExpectedTracker) -> None:
        self.cfg, self.tracker = cfg, tracker
        self._peer_at = {AllowList.normalize(str(p.address)): p.name for p in cfg.probed_peers}
        self._extra_allowed = AllowList(cfg.responders.allow)
        # How long a half-slot's tests run, as scheduled.
        self.test_seconds = cfg.half_slot_need(with_margin=False)
        self.load.use(self.timetable, self.test_seconds)
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
        self.turns.use(TurnInputs(cfg, self.timetable, tracker))
        self.flows.use(cfg)
        if self._probing:  # running: the continuous probes restart with the new peers and settings
            for task in self._probing:
                task.cancel()
            self._probing = self._start_probers()
        log.info(
            "config reloaded: %d peers probed for RTT, %d for throughput; schedule %s from %s",
            len(cfg.rtt_peers),
            len(cfg.throughput_peers),
            self.timetable.current.fingerprint,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.timetable.epoch)),
        )
        if len(after) * 2 < len(before):
            # Fewer than half the peers left is more often a file cut short than a rollout: said and counted.
            self.rooms.host.reload_dropped_most()
            log.warning(
                "config reload left %d of %d probed peers (dropped: %s): a file cut short?",
                len(after),
                len(before),
                ", ".join(sorted(before - after)[:5]),
            )

    def reload(self, cfg: Config) -> None:
        """Check, prepare and apply `cfg` here and now (the exporter's reloads prepare off the loop: reloads.py)."""
        self.check_reloadable(cfg)
        self.apply(Prepared(cfg, schedule_view(cfg)))

    def _start_probers(self) -> list[asyncio.Task[object]]:
        return [asyncio.create_task(p.run(), name=name) for name, p in self.probers()]

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
        if self.own_tests.running():
            return "out_of_turn"  # by its own clock it is this host's turn: two tests would measure each other
        clients = self.timetable.clients_of(self.cfg.host.name, self.clock(), TURN_GRACE_SECONDS)
        return "ok" if peer in clients else "out_of_turn"

    def probers(self) -> list[tuple[str, Prober]]:
        """(task name, prober) of every continuous probe of every peer it probes (kinds.KINDS)."""
        local_mtu = host_max_mtu()
        wiring = Wiring(self.rooms, self.cfg, self.tracker.windows)
        found = []
        for kind in KINDS.values():
            if not kind.continuous or kind.recorder is None:
                continue
            for peer in kind.peers(self.cfg):
                settings = kind.settings(self.cfg, peer, local_mtu)
                if settings is not None:
                    prober = kind.prober(kind.target(self.cfg, peer), settings, kind.recorder(wiring, peer.name))
                    found.append((f"{kind.name}-{peer.name}", prober))
        return found

    def recorder(self, kind: str, peer: str) -> object:
        """The sink that `kind`'s prober of `peer` hands its results to (what probers() builds)."""
        record = KINDS[kind].recorder
        assert record is not None, f"{kind} is recorded per test"
        return record(Wiring(self.rooms, self.cfg, self.tracker.windows), peer)

    async def read_allowances(self) -> None:
        """Until cancelled: the ENA allowance counters for /metrics (none where the driver is not)."""
        while True:
            counters = await asyncio.to_thread(ena.read, self.interface)
            self.rooms.host.read_allowances(self.interface, counters)
            await asyncio.sleep(ALLOWANCES_READ_SECONDS)

    @staticmethod
    def iperf3_settings(cfg: Config) -> Iperf3Settings:
        """The iperf3 servers' settings: a peer's test on them takes at most half a slot (a turn's
        length), plus the clocks' grace, unless iperf3.max_test_seconds says otherwise."""
        if cfg.iperf3.max_test_seconds is not None:
            return cfg.iperf3
        return cfg.iperf3.model_copy(update={"max_test_seconds": cfg.schedule.slot_seconds / 2 + TURN_GRACE_SECONDS})

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; raises responders.ResponderError when a port is taken."""
        running = await responders.start(
            self.cfg.responders,
            self.iperf3_settings(self.cfg),
            self.allowed,
            self.rooms.host,
            self.iperf3_admission,
            lambda: self.clock_bound.seconds,
            self.iperf3,
        )
        self.responders_listening = True
        Pacer.of(asyncio.get_running_loop()).late = self.rooms.host
        self._probing = self._start_probers()
        background = [
            asyncio.create_task(self.turns.run(stop), name="throughput"),
            asyncio.create_task(flowreader.run(self.flows, self.rooms.flows), name="flows"),
            asyncio.create_task(self.read_allowances(), name="allowances"),
            asyncio.create_task(self.clock_bound.run(), name="clock-bound"),
        ]
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
