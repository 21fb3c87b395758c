"""The RTT room: the round-trip times of the TCP request/response and UDP echo probes, as
exact quantiles over a sliding window, idle and under load apart."""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, NamedTuple, Protocol

from ddsketch import DDSketch
from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

from ..config import Config
from ..probes import Reason
from .common import PEER, Room
from .outcomes import Ledger

# RTT quantiles: exact to RELATIVE_ACCURACY of the value (DDSketch), over a window
# (probes.rtt.quantile_window_seconds) that slides in WINDOW_STEPS steps.
QUANTILES = (0.5, 0.9, 0.99)
RELATIVE_ACCURACY = 0.002
WINDOW_STEPS = 10
STATES = ("idle", "loaded")  # loaded: this host or the peer may be in a throughput test
# What a compact peer (mesh.compact_outside) keeps: what the rules read.
COMPACT_QUANTILES = (0.5, 0.99)

# "idle" or "loaded" for a peer at a time (Exporter.load_state).
LoadState = Callable[[str, float], str]


class RttKey(NamedTuple):
    peer: str
    protocol: str  # tcp (request/response) or udp (echo)
    state: str  # one of STATES


class WindowedQuantiles:
    """RTT samples of one path: quantiles over the last `window_seconds` (a ring of DDSketch
    sketches, one per step, merged at scrape time), and the cumulative count and sum."""

    def __init__(self, window_seconds: float) -> None:
        self._lock = threading.Lock()  # observe() on the event loop, quantiles() on the render thread
        self.step_seconds = window_seconds / WINDOW_STEPS
        self.steps: dict[int, DDSketch] = {}  # step number (time // step_seconds) -> sketch
        # (step, the merge of the window's earlier steps) as of the last read in that step: a
        # render merges that and the current step's sketch, not every step's (merges were most
        # of a render's cost), until the step ends or a sample lands in an earlier step.
        self._earlier: tuple[int, DDSketch] | None = None
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
            sketch = self.steps.get(step)
            if sketch is None:
                sketch = self.steps[step] = DDSketch(relative_accuracy=RELATIVE_ACCURACY)
                for old in [k for k in self.steps if k <= step - WINDOW_STEPS]:
                    del self.steps[old]
            if self._earlier is not None and step < self._earlier[0]:
                self._earlier = None  # a sample in a step already merged (the wall clock stepped back)
            sketch.add(value)
            self.count += 1
            self.total += value

    def quantiles(self, now: float) -> dict[float, float]:
        """Each of QUANTILES over the window ending now; empty when the window has no sample."""
        step = int(now // self.step_seconds)
        window = DDSketch(relative_accuracy=RELATIVE_ACCURACY)
        with self._lock:
            if self._earlier is None or self._earlier[0] != step:
                earlier = DDSketch(relative_accuracy=RELATIVE_ACCURACY)
                for k, sketch in self.steps.items():
                    if step - WINDOW_STEPS < k < step:
                        earlier.merge(sketch)
                self._earlier = (step, earlier)
            window.merge(self._earlier[1])
            if step in self.steps:
                window.merge(self.steps[step])
        if window.count == 0:
            return {}
        return _quantiles(window, QUANTILES)


def _quantiles(sketch: DDSketch, qs: tuple[float, ...]) -> dict[float, float]:
    """Quantiles as the probes' own summary (probes/report.py) takes them: linear
    interpolation between the two closest ranks, each read from the sketch's bins.

    One pass over the bins for all of them (DDSketch's own lookup walks the bins in
    Python once per call). It reads the sketch's store and mapping, which are private:
    the ddsketch version is pinned for that reason."""
    store, mapping = sketch._store, sketch._mapping
    below = sketch._zero_count + sketch._negative_store.count  # RTTs are positive: both 0
    running = list(itertools.accumulate(store.bins))

    def at(rank: int) -> float:  # the sample of this rank: in the first bin whose running count exceeds it
        i = min(bisect.bisect_right(running, rank - below), len(running) - 1)
        return float(mapping.value(i + store.offset))

    last = int(sketch.count) - 1
    out = {}
    for q in qs:
        rank = q * last
        lo, hi = math.floor(rank), math.ceil(rank)
        low = at(lo)
        out[q] = low if hi == lo else low + (at(hi) - low) * (rank - lo)
    return out


class RttRoom(Room):
    def __init__(self, cfg: Config, load_state: LoadState, clock: Callable[[], float] = time.time):
        super().__init__(cfg)
        self.load_state, self.clock = load_state, clock
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
            self.add(RttKey(peer, protocol, self.load_state(peer, now)), seconds, now)

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


class RttSink:
    """TCP request/response outcomes of one peer (probes.base.RttSink)."""

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
