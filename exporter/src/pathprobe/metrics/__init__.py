"""/metrics: one room per part of the exporter, each owning its state, the writers its probers'
sinks call, its `forget` on a reload, and its `collect()`: several small custom collectors
that client_python's registry merges. Nothing outside a room writes its state, and a result
for a peer the config does not probe is dropped at the room's door. README.md documents each
metric; the rules and dashboards depend on these names."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

from ..budget import Budget
from ..clock import ClockErrorBound
from ..config import Config
from ..probes.base import EchoSink, MtuSink, RttSink, RttTee
from ..schedule import Timetable
from .common import TestKey
from .echo import EchoRoom
from .echo import EchoSink as EchoRoomSink
from .echo import MtuSink as MtuRoomSink
from .host import HostRoom
from .info import ConfigInfo
from .outcomes import OutcomesRoom
from .owd import OwdRoom
from .rtt import LoadState, RttRoom
from .rtt import RttSink as RttRoomSink
from .throughput import ThroughputRoom

__all__ = ["Rooms", "TestKey", "registry"]


class Rooms:
    """Every room of one exporter, in the order /metrics shows them."""

    def __init__(self, cfg: Config, timetable: Timetable, budget: Budget, load_state: LoadState,  # noqa: PLR0913, PLR0917 - each room's inputs
                 clock_bound: ClockErrorBound, clock: Callable[[], float] = time.time):  # fmt: skip
        self.info = ConfigInfo(cfg)
        self.outcomes = OutcomesRoom(cfg, clock)
        self.throughput = ThroughputRoom(cfg, self.outcomes.ledger("throughput"))
        self.rtt = RttRoom(cfg, load_state, clock)
        self.echo = EchoRoom(cfg, load_state, self.rtt, clock)
        self.owd = OwdRoom(cfg, clock_bound, clock)
        self.host = HostRoom(cfg, timetable, budget, clock)

    def use(self, cfg: Config, timetable: Timetable) -> None:
        """A reload: every room serves `cfg` and forgets the peers it no longer probes."""
        for room in (self.info, self.outcomes, self.throughput, self.rtt, self.echo, self.owd):
            room.use(cfg)
        self.host.use(cfg, timetable)

    def rtt_sink(self, peer: str, size: int, window: RttSink) -> RttSink:
        """The RTT prober's sink: the RTT room, and the window the expected values read."""
        return RttTee(RttRoomSink(self.rtt, self.outcomes.ledger("rtt"), self.echo, peer, size), window)

    def echo_sink(self, peer: str) -> EchoSink:
        return EchoRoomSink(self.echo, self.outcomes.ledger("loss"), peer, self.owd)

    def mtu_sink(self, peer: str) -> MtuSink:
        return MtuRoomSink(self.echo, self.outcomes.ledger("mtu"), peer)


def registry(rooms: Rooms) -> CollectorRegistry:
    """The registry /metrics serves: the rooms and the client library's process metrics."""
    r = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=r)
    PlatformCollector(registry=r)
    for room in (rooms.info, rooms.throughput, rooms.rtt, rooms.echo, rooms.owd, rooms.outcomes, rooms.host):
        r.register(room)
    return r
