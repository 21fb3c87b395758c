"""The one-way delay room: each UDP echo's forward and reverse delays (probes/echo.py), as
quantiles over the RTT window, idle and under load apart, exported only while the two clocks'
error bounds (clock.py) make them worth reading.

A one-way delay subtracts a time read on one host from a time read on the other, so it is off
by the offset between the two clocks, which is at most the two error bounds added. The room
withholds the quantiles (and says why, `pathprobe_owd_untrusted_info`) when:
- no_bound: either end states no bound;
- clocks_disagree: the echoes' own estimate of the offset (NTP's on-wire method), less its own
  error (half its exchange's delay), exceeds the bounds added, or a delay came out negative: a
  clock is further off than it says;
- bound_too_wide: the bounds added exceed clock.max_error_share of a direction's median delay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, NamedTuple

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..clock import ClockErrorBound, one_way_untrusted
from ..config import Config
from ..probes.echo import OneWay
from .common import PEER, Room
from .rtt import RELATIVE_ACCURACY, WindowedQuantiles

DIRECTIONS = ("forward", "reverse")  # this host -> peer, peer -> this host


class OwdKey(NamedTuple):
    peer: str
    direction: str  # one of DIRECTIONS
    state: str  # idle or loaded, as the RTT room's


class OwdRoom(Room):
    def __init__(self, cfg: Config, bound: ClockErrorBound, clock: Callable[[], float] = time.time):
        super().__init__(cfg)
        self.bound, self.clock = bound, clock
        self.windows: dict[OwdKey, WindowedQuantiles] = {}
        self.peer_bounds: dict[str, float | None] = {}  # the bound the peer's responder last stated
        self.clocks_apart: dict[str, float] = {}  # how far the clocks are apart at least, as last estimated
        self.negative: dict[str, float] = {}  # when a delay to the peer last came out negative

    def tables(self) -> list[MutableMapping[Any, Any]]:
        return [self.windows, self.peer_bounds, self.clocks_apart, self.negative]

    def use(self, cfg: Config) -> None:
        before = self.scope.cfg.probes.rtt.quantile_window_seconds
        super().use(cfg)
        if cfg.probes.rtt.quantile_window_seconds != before:
            for window in list(self.windows.values()):
                window.resize(cfg.probes.rtt.quantile_window_seconds)

    def agree(self, peer: str, peer_bound: float | None, clocks_apart: float) -> None:
        """What an admitted peer's echo says of the two clocks: the bound its responder states, and
        how far apart the clocks are at least."""
        self.peer_bounds[peer] = peer_bound
        self.clocks_apart[peer] = clocks_apart

    def observe(self, peer: str, one_way: OneWay, now: float, state: str) -> None:
        """An admitted peer's echo's delays, taken at `now` in `state` (the echo sink's received())."""
        self.agree(peer, one_way.peer_bound, one_way.clocks_apart)
        if one_way.forward < 0 or one_way.reverse < 0:
            self.negative[peer] = now
            return
        window_seconds = self.scope.cfg.probes.rtt.quantile_window_seconds
        for direction, seconds in zip(DIRECTIONS, (one_way.forward, one_way.reverse), strict=True):
            key = OwdKey(peer, direction, state)
            window = self.windows.get(key)
            if window is None:
                window = self.windows[key] = WindowedQuantiles(window_seconds)
            window.observe(seconds, now)

    def _untrusted(self, peer: str, error: float | None, medians: list[float], now: float) -> str:
        """Why the peer's delays are not worth reading now (a delay below zero within the window
        counts), or "" when they are."""
        cfg = self.scope.cfg
        window = cfg.probes.rtt.quantile_window_seconds
        negative = now - self.negative.get(peer, -window) < window
        return one_way_untrusted(error, self.clocks_apart.get(peer, 0.0), negative, medians, cfg.clock.max_error_share)

    def collect(self) -> Iterator[Metric]:
        scope, now = self.scope, self.clock()
        own = GaugeMetricFamily(
            "pathprobe_clock_error_bound_seconds",
            "This host's clock error bound as its time service states it (clock.source: "
            "ClockBound, chronyd's tracking, or stated); absent when none is known.",
            labels=["source"],
        )
        if self.bound.seconds is not None:
            own.add_metric([self.bound.source], self.bound.seconds)
        yield own
        owd = Metric(
            "pathprobe_owd_seconds",
            "One-way delay of UDP echoes, direction=forward (this host to the peer) or reverse: quantiles "
            f"over the RTT window (within {RELATIVE_ACCURACY:.1%} of the value) and count and sum since "
            "start, each figure within pathprobe_owd_error_bound_seconds of the true delay; only while "
            "pathprobe_owd_trusted is 1. state as pathprobe_rtt_seconds'.",
            "summary",
        )
        error_bound = GaugeMetricFamily(
            "pathprobe_owd_error_bound_seconds",
            "Both clocks' error bounds added: how far each one-way delay may be off.",
            labels=PEER,
        )
        trusted = GaugeMetricFamily(
            "pathprobe_owd_trusted",
            "1 while the one-way delays to the peer are exported, else 0 (pathprobe_owd_untrusted_info says why).",
            labels=PEER,
        )
        why = GaugeMetricFamily(
            "pathprobe_owd_untrusted_info",
            "Why the one-way delays to the peer are withheld: no_bound, clocks_disagree or bound_too_wide.",
            labels=[*PEER, "reason"],
        )
        windows: dict[str, list[tuple[OwdKey, dict[float, float], WindowedQuantiles]]] = {}
        for _, key, window in scope.entries(self.windows):
            windows.setdefault(key.peer, []).append((key, window.quantiles(now), window))
        for labels, peer, peer_bound in scope.entries(self.peer_bounds):
            if peer in scope.cfg.compact_peers:  # what the rules read only: no one-way delays
                continue
            error = None if peer_bound is None or self.bound.seconds is None else self.bound.seconds + peer_bound
            found = windows.get(peer, [])
            medians = [q[0.5] for key, q, _ in found if key.state == "idle" and 0.5 in q]
            reason = self._untrusted(peer, error, medians, now)
            if error is not None:
                error_bound.add_metric(labels, error)
            trusted.add_metric(labels, 0 if reason else 1)
            if reason:
                why.add_metric([*labels, reason], 1)
                continue
            for key, quantiles, window in found:
                base = dict(zip(PEER, labels, strict=True)) | {"direction": key.direction, "state": key.state}
                for q, v in quantiles.items():
                    owd.add_sample("pathprobe_owd_seconds", base | {"quantile": floatToGoString(q)}, v)  # type: ignore[no-untyped-call]
                owd.add_sample("pathprobe_owd_seconds_count", base, window.count)
                owd.add_sample("pathprobe_owd_seconds_sum", base, window.total)
        yield from (owd, error_bound, trusted, why)
