"""The outcome of every probe attempt, by probe and peer: runs by result, the last success,
the bytes moved and what they cost. Each prober's room writes here through its `Ledger`."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any, NamedTuple, Protocol

from prometheus_client.core import Metric

from ..config import Config, Peer
from ..probes import REASONS, Reason
from ..probes.base import Rejection
from .common import Room, counter, gauge

log = logging.getLogger(__name__)

# A peer's rejected answers are logged at most this often, per probe and peer (the counter has all).
REJECTION_LOG_SECONDS = 60.0


class ProbeKind(Protocol):
    """What the outcomes room reads of each probe kind (kinds.Kind): its name and whom it probes."""

    @property
    def name(self) -> str: ...
    @property
    def peers(self) -> Callable[[Config], list[Peer]]: ...


class ProbeKey(NamedTuple):
    probe: str
    peer: str


class RunKey(NamedTuple):
    probe: str
    peer: str
    result: str  # "ok" or a failure reason


class OutcomesRoom(Room):
    def __init__(self, cfg: Config, kinds: Iterable[ProbeKind], clock: Callable[[], float] = time.time):
        super().__init__(cfg)
        self.kinds, self.clock = tuple(kinds), clock
        self.runs: Counter[RunKey] = Counter()
        self.last_success: dict[ProbeKey, float] = {}
        self.bytes_sent: Counter[ProbeKey] = Counter()
        self.rejected: Counter[RunKey] = Counter()  # (probe, peer, rejection)
        self._logged: dict[ProbeKey, tuple[float, int]] = {}  # when last logged, and the rejections since

    def tables(self) -> list[MutableMapping[Any, Any]]:
        return [self.runs, self.last_success, self.bytes_sent, self.rejected, self._logged]

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

    def reject(self, probe: str, peer: str, reason: Rejection, detail: str = "") -> None:
        """A field of a peer's answer not taken: counted, and logged at most once a minute per probe and peer."""
        if not self.admits(peer):
            return
        self.rejected[RunKey(probe, peer, reason)] += 1
        key, now = ProbeKey(probe, peer), time.monotonic()
        last, since = self._logged.get(key, (-REJECTION_LOG_SECONDS, 0))
        if now - last < REJECTION_LOG_SECONDS:
            self._logged[key] = (last, since + 1)
            return
        self._logged[key] = (now, 0)
        more = f" ({since} more since the last line)" if since else ""
        log.warning("%s answer from %s not taken: %s%s%s", probe, peer, reason, f": {detail}" if detail else "", more)

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
        rejected = counter(
            "pathprobe_probe_answers_rejected",
            "Fields of peers' answers not taken because they are not physically possible (a hold beyond the round "
            "trip, a count above what was sent, a clock a day off, ...), by probe and reason: the figures they "
            "would have made are left out, never clamped. Absent for a peer until its first.",
            ["probe", "peer", "reason"],
        )
        for (probe, peer, reason), n in dict(self.rejected).items():
            rejected.add_metric([probe, peer, reason], n)
        yield rejected

    def _runs(self, cfg: Config) -> Metric:
        runs = counter(
            "pathprobe_probe_runs",
            "Probe attempts by outcome: a throughput test, an RTT request/response, or a UDP echo packet.",
            ["probe", "peer", "result"],
        )
        counted = dict(self.runs)
        compact = cfg.compact_peers
        for kind in self.kinds:  # every outcome from zero, so that increase() sees the first failure
            # A kind the config turns off runs nothing: its series would all stay at zero, and what
            # a reload that turns it on counts starts from zero then (no rule reads it before).
            enabled = getattr(cfg.probes, kind.name).enabled
            for peer in kind.peers(cfg):
                for reason in REASONS:
                    n = counted.get(RunKey(kind.name, peer.name, reason), 0)
                    if n or (enabled and peer.name not in compact):  # compact: the outcomes that happened
                        runs.add_metric([kind.name, peer.name, reason], n)
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

    def reject(self, peer: str, reason: Rejection, detail: str = "") -> None:
        self.room.reject(self.probe, peer, reason, detail)
