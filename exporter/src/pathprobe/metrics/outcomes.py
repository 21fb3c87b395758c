"""The outcome of every probe attempt, by probe and peer: runs by result, the last success,
the bytes moved and what they cost. Each prober's room writes here through its `Ledger`."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, NamedTuple

from prometheus_client.core import Metric

from ..config import Config, Peer
from ..probes import REASONS, Reason
from .common import Room, counter, gauge

PROBES = ("throughput", "rtt", "loss", "mtu")


class ProbeKey(NamedTuple):
    probe: str
    peer: str


class RunKey(NamedTuple):
    probe: str
    peer: str
    result: str  # "ok" or a failure reason


class OutcomesRoom(Room):
    def __init__(self, cfg: Config, clock: Callable[[], float] = time.time):
        super().__init__(cfg)
        self.clock = clock
        self.runs: Counter[RunKey] = Counter()
        self.last_success: dict[ProbeKey, float] = {}
        self.bytes_sent: Counter[ProbeKey] = Counter()

    def tables(self) -> list[MutableMapping[Any, Any]]:
        return [self.runs, self.last_success, self.bytes_sent]

    def ledger(self, probe: str) -> Ledger:
        return Ledger(self, probe)

    def success(self, probe: str, peer: str) -> None:
        if self.admits(peer):
            self.runs[RunKey(probe, peer, "ok")] += 1
            self.last_success[ProbeKey(probe, peer)] = self.clock()

    def failure(self, probe: str, peer: str, reason: Reason) -> None:
        if self.admits(peer):
            self.runs[RunKey(probe, peer, reason)] += 1

    def moved(self, probe: str, peer: str, n: int) -> None:
        if self.admits(peer):
            self.bytes_sent[ProbeKey(probe, peer)] += n

    def collect(self) -> Iterator[Metric]:
        cfg = self.scope.cfg
        yield self._runs(cfg)
        last = gauge(
            "pathprobe_probe_last_success_timestamp_seconds",
            "Unix time of the last successful probe.",
            ["probe", "peer"],
        )
        for (probe, peer), ts in dict(self.last_success).items():
            last.add_metric([probe, peer], ts)
        yield last
        yield from self._moved(self.scope.peers, cfg.budget.price_per_gb)

    def _runs(self, cfg: Config) -> Metric:
        runs = counter(
            "pathprobe_probe_runs",
            "Probe attempts by outcome: a throughput test, an RTT request/response, or a UDP echo packet.",
            ["probe", "peer", "result"],
        )
        counted = dict(self.runs)
        probed = {"throughput": cfg.throughput_peers, "rtt": cfg.rtt_peers}
        compact = cfg.compact_peers
        for probe in PROBES:  # every outcome from zero, so that increase() sees the first failure
            for peer in probed.get(probe, cfg.rtt_peers):  # loss and mtu go with rtt
                for reason in REASONS:
                    n = counted.get(RunKey(probe, peer.name, reason), 0)
                    if n or peer.name not in compact:  # compact: the outcomes that happened
                        runs.add_metric([probe, peer.name, reason], n)
        return runs

    def _moved(self, peers: dict[str, Peer], prices: dict[Any, float]) -> Iterator[Metric]:
        moved = counter(
            "pathprobe_probe_bytes_sent",
            "Bytes moved by probes this host started (throughput: both directions, what inter-region transfer bills).",
            ["probe", "peer"],
        )
        cost = counter(
            "pathprobe_probe_cost_dollars",
            "What the bytes of pathprobe_probe_bytes_sent_total cost at budget.price_per_gb of the peer's "
            "path class (only for classes with a price).",
            ["probe", "peer"],
        )
        for (probe, name), n in dict(self.bytes_sent).items():
            peer = peers.get(name)
            if peer is None:  # forgotten by a reload since the copy
                continue
            moved.add_metric([probe, name], n)
            price = prices.get(peer.path_class)
            if price is not None:
                cost.add_metric([probe, name], n / 1e9 * price)
        yield from (moved, cost)


class Ledger:
    """One probe's writer of the outcomes room: what a prober's room reports of each attempt."""

    def __init__(self, room: OutcomesRoom, probe: str):
        self.room, self.probe = room, probe

    def success(self, peer: str) -> None:
        self.room.success(self.probe, peer)

    def failure(self, peer: str, reason: Reason) -> None:
        self.room.failure(self.probe, peer, reason)

    def moved(self, peer: str, n: int) -> None:
        self.room.moved(self.probe, peer, n)
