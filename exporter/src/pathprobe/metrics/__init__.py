"""/metrics: one room per part of the exporter, each owning its state, the recorders that its
probers hand results to, its `use` on a reload, and its `collect()`: several small custom collectors
that client_python's registry merges. Nothing outside a room writes its state, and a result
for a peer the config does not probe is dropped at the room's door. docs/metrics.md documents each
metric; the rules and dashboards depend on these names."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

from ..budget import Budget
from ..clock import ClockErrorBound
from ..config import Config
from ..evidence import EvidenceStore
from ..schedule import Timetable
from .echo import EchoRoom
from .evidence import EvidenceRoom
from .flows import FlowsRoom
from .host import HostRoom
from .info import ConfigInfo
from .outcomes import OutcomesRoom, ProbeKind
from .owd import OwdRoom
from .rtt import Load, RttRoom
from .throughput import ThroughputRoom

__all__ = ["Rooms", "registry"]


class Rooms:
    """Every room of one exporter, in the order /metrics shows them."""

    def __init__(  # noqa: PLR0913, PLR0917 - each room's inputs
        self,
        cfg: Config,
        timetable: Timetable,
        budget: Budget,
        load: Load,
        clock_bound: ClockErrorBound,
        clock: Callable[[], float] = time.time,
        *,
        kinds: Iterable[ProbeKind],
        evidence: EvidenceStore | None = None,
    ):
        self.info = ConfigInfo(cfg)
        self.outcomes = OutcomesRoom(cfg, kinds, clock)
        self.throughput = ThroughputRoom(cfg, self.outcomes.ledger("throughput"))
        self.rtt = RttRoom(cfg, load, clock)
        self.echo = EchoRoom(cfg, load, self.rtt, clock)
        self.owd = OwdRoom(cfg, clock_bound, clock)
        self.host = HostRoom(cfg, timetable, budget, clock)
        self.evidence = EvidenceRoom(cfg, evidence)
        self.flows = FlowsRoom(cfg)

    def use(self, cfg: Config, timetable: Timetable) -> None:
        """A reload: every room serves `cfg` and forgets the peers it no longer probes."""
        for room in (
            self.info,
            self.outcomes,
            self.throughput,
            self.rtt,
            self.echo,
            self.owd,
            self.evidence,
            self.flows,
        ):
            room.use(cfg)
        self.host.use(cfg, timetable)


def registry(rooms: Rooms) -> CollectorRegistry:
    """The registry /metrics serves: the rooms and the client library's process metrics."""
    r = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=r)
    PlatformCollector(registry=r)
    shown = (
        rooms.info,
        rooms.throughput,
        rooms.evidence,
        rooms.rtt,
        rooms.echo,
        rooms.owd,
        rooms.flows,
        rooms.outcomes,
        rooms.host,
    )
    for room in shown:
        r.register(room)
    return r
