"""The RTT room: the round-trip times of the TCP request/response and UDP echo probes, as
exact quantiles over a sliding window, idle and under load apart."""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from array import array
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any, NamedTuple, Protocol

from ddsketch.mapping import LogarithmicMapping
from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

from ..config import Config
from ..probes import Reason
from ..probes.base import Rejection
from .common import PEER, Room
from .outcomes import Ledger

# RTT quantiles: exact to RELATIVE_ACCURACY of the value (DDSketch's bins), over a window
# (probes.rtt.quantile_window_seconds) that slides in WINDOW_STEPS steps.
QUANTILES = (0.5, 0.9, 0.99)
RELATIVE_ACCURACY = 0.002
WINDOW_STEPS = 10
STATES = ("idle", "loaded")  # loaded: this host or the peer may be in a throughput test
# What a compact peer (mesh.compact_outside) keeps: what the rules read.
COMPACT_QUANTILES = (0.5, 0.99)


class Load(Protocol):
    """ "idle" or "loaded" for a peer's sample taken at a time (load.LoadState)."""

    def of(self, peer: str, now: float) -> str: ...


class RttKey(NamedTuple):
    peer: str
    protocol: str  # tcp (request/response) or udp (echo)
    state: str  # one of STATES


# DDSketch's bins at RELATIVE_ACCURACY (the mapping its DDSketch uses): a sample is kept as its
# bin's key, read back as the bin's value, within RELATIVE_ACCURACY of the sample.
MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)


class Bins:
    """Samples as DDSketch's bins: the keys that have a sample, sorted, and each one's count, in two
    compact arrays (a sketch per step, a list of floats over every key from the lowest to the
    highest, was most of the exporter's memory); `zeros`: samples too small for a bin (none of an
    RTT), counted below the lowest."""

    __slots__ = ("counts", "keys", "zeros")

    def __init__(self) -> None:
        self.keys, self.counts, self.zeros = array("i"), array("I"), 0

    def add(self, value: float) -> None:
        if value <= MAPPING.min_possible:
            self.zeros += 1
            return
        key = MAPPING.key(value)
        keys = self.keys
        i = bisect.bisect_left(keys, key)
        if i < len(keys) and keys[i] == key:
            self.counts[i] += 1
        else:
            keys.insert(i, key)
            self.counts.insert(i, 1)

    @classmethod
    def merged(cls, parts: Sequence[Bins]) -> Bins:
        """The sum of `parts`: the first (the largest, the window's earlier steps at a read) taken
        whole, the others' bins added to it one by one."""
        out = cls()
        if not parts:
            return out
        counts = dict(zip(parts[0].keys, parts[0].counts, strict=True))
        out.zeros = parts[0].zeros
        for part in parts[1:]:
            out.zeros += part.zeros
            for key, n in zip(part.keys, part.counts, strict=True):
                counts[key] = counts.get(key, 0) + n
        keys = sorted(counts)
        out.keys, out.counts = array("i", keys), array("I", map(counts.__getitem__, keys))
        return out

    def quantiles(self, qs: tuple[float, ...]) -> dict[float, float]:
        """Quantiles as the probes' own summary (probes/report.py) takes them: linear interpolation
        between the two closest ranks, each read from its bin; empty without a sample."""
        running = list(itertools.accumulate(self.counts))
        if not running:
            return {}

        def at(rank: int) -> float:  # the sample of this rank: in the first bin whose running count exceeds it
            i = min(bisect.bisect_right(running, rank - self.zeros), len(running) - 1)
            return float(MAPPING.value(self.keys[i]))

        last = running[-1] + self.zeros - 1
        out = {}
        for q in qs:
            rank = q * last
            lo, hi = math.floor(rank), math.ceil(rank)
            low = at(lo)
            out[q] = low if hi == lo else low + (at(hi) - low) * (rank - lo)
        return out


class WindowedQuantiles:
    """RTT samples of one path: quantiles over the last `window_seconds` (a ring of bins, one per
    step, merged at scrape time), and the cumulative count and sum."""

    def __init__(self, window_seconds: float) -> None:
        self._lock = threading.Lock()  # observe() on the event loop, quantiles() on the render thread
        self.step_seconds = window_seconds / WINDOW_STEPS
        self.steps: dict[int, Bins] = {}  # step number (time // step_seconds) -> its samples
        # (step, the merge of the window's earlier steps) as of the last read in that step: a
        # render merges that and the current step's bins, not every step's (merges were most
        # of a render's cost), until the step ends or a sample lands in an earlier step.
        self._earlier: tuple[int, Bins] | None = None
        self.count = 0
        self.total = 0.0

    def resize(self, window_seconds: float) -> None:
        """A new window length: the quantiles start over (the count and sum go on)."""
        with self._lock:
            self.step_seconds = window_seconds / WINDOW_STEPS
            self.steps.clear()
            self._earlier = None

    def observe(self, value: float, now: float) -> None:
        step = int(now // self.step_seconds)
        with self._lock:
            bins = self.steps.get(step)
            if bins is None:
                bins = self.steps[step] = Bins()
                for old in [k for k in self.steps if k <= step - WINDOW_STEPS]:
                    del self.steps[old]
            if self._earlier is not None and step < self._earlier[0]:
                self._earlier = None  # a sample in a step already merged (the wall clock stepped back)
            bins.add(value)
            self.count += 1
            self.total += value

    def quantiles(self, now: float) -> dict[float, float]:
        """Each of QUANTILES over the window ending now; empty when the window has no sample."""
        step = int(now // self.step_seconds)
        with self._lock:
            if self._earlier is None or self._earlier[0] != step:
                earlier = [bins for k, bins in self.steps.items() if step - WINDOW_STEPS < k < step]
                self._earlier = (step, Bins.merged(earlier))
            window = Bins.merged([self._earlier[1], *([self.steps[step]] if step in self.steps else [])])
        return window.quantiles(QUANTILES)


class RttRoom(Room):
    def __init__(self, cfg: Config, load: Load, clock: Callable[[], float] = time.time):
        super().__init__(cfg)
        self.load, self.clock = load, clock
        self.windows: dict[RttKey, WindowedQuantiles] = {}

    def tables(self) -> list[MutableMapping[Any, Any]]:
        return [self.windows]

    @property
    def window_seconds(self) -> float:
        return self.scope.cfg.probes.rtt.quantile_window_seconds

    def use(self, cfg: Config) -> None:
        before = self.window_seconds
        super().use(cfg)
        if self.window_seconds != before:
            for window in list(self.windows.values()):
                window.resize(self.window_seconds)

    def observe(self, peer: str, protocol: str, seconds: float, age: float = 0.0) -> None:
        """A sample taken `age` seconds ago: its state and window step are those of that time."""
        if self.admits(peer):
            now = self.clock() - age
            self.add(RttKey(peer, protocol, self.load.of(peer, now)), seconds, now)

    def add(self, key: RttKey, seconds: float, now: float) -> None:
        """A sample of an admitted peer, taken at `now` in the state its key says."""
        window = self.windows.get(key)
        if window is None:
            window = self.windows[key] = WindowedQuantiles(self.window_seconds)
        window.observe(seconds, now)

    def collect(self) -> Iterator[Metric]:
        family = Metric(
            "pathprobe_rtt_seconds",
            f"Round-trip time of TCP request/response (protocol=tcp) and UDP echo (protocol=udp) probes: "
            f"quantiles over the last {self.window_seconds:g} s (within {RELATIVE_ACCURACY:.1%} of the value), "
            "count and sum since start. state=loaded: this host or the peer may be in a throughput test.",
            "summary",
        )
        scope, now = self.scope, self.clock()
        compact = scope.cfg.compact_peers
        for peer, (name, protocol, state), window in scope.entries(self.windows):
            if name in compact and state != "idle":
                continue
            labels = dict(zip(PEER, peer, strict=True)) | {"protocol": protocol, "state": state}
            for q, v in window.quantiles(now).items():
                if name in compact and q not in COMPACT_QUANTILES:
                    continue
                family.add_sample("pathprobe_rtt_seconds", labels | {"quantile": floatToGoString(q)}, v)  # type: ignore[no-untyped-call]
            family.add_sample("pathprobe_rtt_seconds_count", labels, window.count)
            family.add_sample("pathprobe_rtt_seconds_sum", labels, window.total)
        yield family


class FailingFlows(Protocol):
    """Where a continuous prober's failing flows are counted (EchoRoom.flows_failing)."""

    def flows_failing(self, peer: str, protocol: str, count: int) -> None: ...


class RttRecorder:
    """TCP request/response outcomes of one peer (probes.rtt.RttSink)."""

    def __init__(self, room: RttRoom, ledger: Ledger, flows: FailingFlows, peer: str, size: int):
        self.room, self.ledger, self.flows, self.peer, self.size = room, ledger, flows, peer, size

    def rtt(self, seconds: float, age: float = 0.0) -> None:
        self.room.observe(self.peer, "tcp", seconds, age)
        self.ledger.moved(self.peer, self.size)
        self.ledger.success(self.peer)

    def failure(self, reason: Reason) -> None:
        self.ledger.failure(self.peer, reason)

    def flows_failing(self, count: int) -> None:
        self.flows.flows_failing(self.peer, "tcp", count)

    def rejected(self, reason: Rejection) -> None:
        self.ledger.reject(self.peer, reason)
