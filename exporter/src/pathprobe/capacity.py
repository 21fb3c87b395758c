"""Capacity review: a stream sweep's results, the knee, what limits the path (in
words), and the time and cost to move a data set.

Pure functions over measured rows, so that a live sweep and a review built from
Prometheus history share them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from . import ena, ends
from .limits import LIMIT_KINDS, Expected
from .probes.report import describe_one_way
from .units import format_bits

KNEE_SHARE = 0.95  # the knee: the fewest streams within 5% of the best rate
UNEXPLAINED = 0.8  # a rate below 80% of every known limit is not explained by them
ABOVE = 1.05  # a rate this far above the smallest limit exceeds it (AWS often gives more)


@dataclass
class Row:
    streams: int
    bits_per_second: float | None  # receiver side; None when the test failed
    retransmits: int | None = None
    udp_loss_ratio: float | None = None
    error: str | None = None
    expected: Expected | None = None
    # The streams' smoothed RTT over the test (the sender's kernel): the path's RTT with the test's
    # own queue in it. A window-bound flow's rate is its window over this RTT, not the idle one.
    rtt_under_load_seconds: float | None = None
    # ENA allowance counters that rose during the test (None: no such counters on this host).
    allowance_exceeded: dict[str, int] | None = None
    # What of the test's own ends bound it (ends.Bound: a host's CPU or receive buffer, none,
    # unknown), and what would lift it; None where not known (results stored before it was measured).
    ends_bound: str | None = None
    remedy: str = ""

    @property
    def per_stream(self) -> float | None:
        return self.bits_per_second / self.streams if self.bits_per_second is not None else None


@dataclass
class Review:
    target: str
    protocol: str
    direction: str
    rows: list[Row]
    rtt_seconds: float | None
    receiver_rmem_max: int | None
    sender_wmem_max: int | None
    window_share: float
    volume_bytes: float | None
    price_per_gb: float | None
    source: str = "sweep"  # or "prometheus"
    notes: list[str] = field(default_factory=list)
    # The echoes' one-way delays each way with their error bound, or why withheld (RttReport.one_way).
    one_way: dict[str, Any] | None = None

    def measured(self) -> list[Row]:
        return [r for r in self.rows if r.bits_per_second]

    def best(self) -> Row | None:
        rows = self.measured()
        return max(rows, key=lambda r: r.bits_per_second or 0) if rows else None

    def knee(self) -> Row | None:
        best = self.best()
        if best is None or best.bits_per_second is None:
            return None
        return min(
            (r for r in self.measured() if (r.bits_per_second or 0) >= KNEE_SHARE * best.bits_per_second),
            key=lambda r: r.streams,
        )

    def transfer(self, row: Row | None) -> dict[str, float] | None:
        """Seconds to move the volume at the rate this row keeps (burst, then baseline), and
        what the transfer costs; `burst_seconds`: the time at the measured rate, when that
        rate ran on burst credits."""
        if row is None or not row.bits_per_second or not self.volume_bytes:
            return None
        kept = sustained(row)
        out = {"seconds": self.volume_bytes * 8 / kept, "bits_per_second": kept}
        if kept < row.bits_per_second:
            out["burst_seconds"] = self.volume_bytes * 8 / row.bits_per_second
        if self.price_per_gb is not None:
            out["cost"] = self.volume_bytes / 1e9 * self.price_per_gb
        return out

    def to_json(self) -> dict[str, Any]:
        knee, best = self.knee(), self.best()
        return {
            "target": self.target,
            "protocol": self.protocol,
            "direction": self.direction,
            "source": self.source,
            "rtt_seconds": self.rtt_seconds,
            "one_way": self.one_way,
            "receiver_tcp_rmem_max_bytes": self.receiver_rmem_max,
            "sender_tcp_wmem_max_bytes": self.sender_wmem_max,
            "window_share": self.window_share,
            "rows": [
                {
                    **{k: v for k, v in asdict(r).items() if k != "expected"},
                    "per_stream_bits_per_second": r.per_stream,
                    "expected_bits_per_second": r.expected.bits_per_second if r.expected else None,
                    "expected_limit": r.expected.limit if r.expected else None,
                    "expected_peak_bits_per_second": r.expected.peak_bits_per_second if r.expected else None,
                    "expected_peak_limit": r.expected.peak_limit if r.expected else None,
                    "on_burst": on_burst(r),
                }
                for r in self.rows
            ],
            "knee_streams": knee.streams if knee else None,
            "best_streams": best.streams if best else None,
            "diagnosis": {"one_stream": self.diagnose(self._row(1)), "knee": self.diagnose(knee)},
            "volume_bytes": self.volume_bytes,
            "price_per_gb": self.price_per_gb,
            "transfer_at_knee": self.transfer(knee),
            "transfer_at_best": self.transfer(best),
            "notes": self.notes,
        }

    def _row(self, streams: int) -> Row | None:
        return next((r for r in self.measured() if r.streams == streams), None)

    def diagnose(self, row: Row | None) -> str | None:
        """What limits this row's rate, in words."""
        if row is None or not row.bits_per_second or row.expected is None:
            return None
        host = _bound_by_a_host(row)
        if host is not None:
            return host
        rate, c = row.bits_per_second, row.expected.candidates
        flows = "one flow" if row.streams == 1 else f"{row.streams} flows"
        # The binding limit is the smallest one; the rate is explained by it when it comes close.
        limit = min(c, key=lambda k: c[k])
        if rate < UNEXPLAINED * c[limit]:
            known = ", ".join(f"{wording(k)} {format_bits(v)}" for k, v in sorted(c.items(), key=lambda kv: kv[1]))
            return (
                f"{flows} reach {format_bits(rate)}, below every known limit ({known}): look for loss, "
                "congestion, CPU or a limit not in the table (e.g. burst credits spent)"
            )
        if rate > ABOVE * c[limit] and on_burst(row):
            assert row.expected is not None
            return (
                f"{flows} reach {format_bits(rate)} while burst credits last, above the "
                f"{format_bits(c[limit])} floor ({wording(limit)} at the instances' baseline); "
                f"the peak allows {format_bits(row.expected.peak_bits_per_second)}"
            )
        if rate > ABOVE * c[limit]:
            return (
                f"{flows} reach {format_bits(rate)}, above {wording(limit)} that AWS documents "
                f"({format_bits(c[limit])}): documented limits are a floor to plan on, not a ceiling"
            )
        text = f"{flows} {'is' if row.streams == 1 else 'are'} bound by {wording(limit)}"
        buffers = {
            "receive_window": ("tcp_rmem", self.receiver_rmem_max),
            "send_buffer": ("tcp_wmem", self.sender_wmem_max),
        }
        size = buffers[limit][1] if limit in buffers else None
        if size and self.rtt_seconds:
            text += (
                f": {buffers[limit][0]} max {_mib(size)} at {self.rtt_seconds * 1e3:.3g} ms RTT "
                f"allows about {format_bits(c[limit])}"
            )
            rest = {k: v for k, v in c.items() if k not in buffers}
            if rest:
                nxt = min(rest, key=lambda k: rest[k])
                need = rest[nxt] / row.streams * self.rtt_seconds / 8 / self.window_share
                text += f"; {_mib(need)} (on both ends) would reach {wording(nxt)} ({format_bits(rest[nxt])})"
        else:
            text += f" ({format_bits(c[limit])}); measured {format_bits(rate)}"
        return text


def _bound_by_a_host(row: Row) -> str | None:
    """What bound a row's test that was not the path, in words: the instance's allowance (ENA's
    counters rose), or one of the test's own ends (a host's CPU, a receive buffer)."""
    assert row.bits_per_second
    if row.allowance_exceeded:
        return f"{format_bits(row.bits_per_second)}, bound by {ena.explain(row.allowance_exceeded)}"
    if row.ends_bound in ends.HOST_LIMITS:
        return (
            f"{format_bits(row.bits_per_second)}, bound by {wording(row.ends_bound)}, not the path: "
            f"{ends.REMEDIES.get(row.remedy, row.remedy)}"
        )
    return None


def on_burst(row: Row) -> bool:
    """The test ran above a floor that the instances' baseline sets, within their peak: on
    network I/O credits, which a long transfer spends."""
    e = row.expected
    return bool(
        e
        and row.bits_per_second
        and e.peak_bits_per_second > e.bits_per_second
        and row.bits_per_second > e.bits_per_second
    )


def sustained(row: Row) -> float:
    """The rate a long transfer keeps: the measured rate, or the floor when the test ran on
    burst credits. AWS does not publish how long credits last, so a transfer of hours is
    planned at the baseline."""
    assert row.bits_per_second
    return row.expected.bits_per_second if on_burst(row) and row.expected else row.bits_per_second


def wording(limit: str) -> str:
    """A limit's name in words (limits.LIMIT_KINDS), or the name itself for one it does not know."""
    kind = LIMIT_KINDS.get(limit)
    return kind.wording if kind is not None else limit


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.3g} MiB"


def format_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def text_report(r: Review) -> str:
    lines = [
        f"capacity review: this host {'->' if r.direction == 'send' else '<-'} {r.target}, "
        f"{r.protocol.upper()} ({r.source})"
    ]
    if r.rtt_seconds:
        lines.append(
            f"RTT p50 {r.rtt_seconds * 1e3:.3g} ms; receiver tcp_rmem max "
            f"{_mib(r.receiver_rmem_max) if r.receiver_rmem_max else 'unknown'}, sender tcp_wmem max "
            f"{_mib(r.sender_wmem_max) if r.sender_wmem_max else 'unknown'}; "
            f"{r.window_share:.2g} of a buffer in flight"
        )
    if r.one_way is not None:
        lines.append(describe_one_way(r.one_way))
    head = (
        f"{'streams':>7} {'Gbit/s':>8} {'per stream':>10} {'retrans':>8} {'UDP loss':>8} {'RTT ms':>7} "
        f"{'expected':>9}  {'limit':<15} own ends"
    )
    lines += ["", head]
    for row in r.rows:
        if row.bits_per_second is None:
            lines.append(f"{row.streams:>7} {'failed: ' + (row.error or '')}")
            continue
        lines.append(
            f"{row.streams:>7} {row.bits_per_second / 1e9:>8.3f} {(row.per_stream or 0) / 1e9:>10.3f} "
            f"{'' if row.retransmits is None else row.retransmits:>8} "
            f"{'' if row.udp_loss_ratio is None else format(row.udp_loss_ratio, '.2%'):>8} "
            f"{'' if row.rtt_under_load_seconds is None else format(row.rtt_under_load_seconds * 1e3, '.3g'):>7} "
            f"{row.expected.bits_per_second / 1e9 if row.expected else float('nan'):>9.3f}  "
            f"{row.expected.limit if row.expected else '':<15} {row.ends_bound or ''}"
        )
    knee, best = r.knee(), r.best()
    if knee and best and knee.bits_per_second and best.bits_per_second:
        lines += [
            "",
            f"knee: {knee.streams} stream(s) ({knee.bits_per_second / 1e9:.3g} Gbit/s, within 5% of the "
            f"best, {best.bits_per_second / 1e9:.3g} Gbit/s at {best.streams})",
        ]
        for label, maybe in (("one stream", r._row(1)), ("at the knee", knee)):
            d = r.diagnose(maybe)
            if d:
                lines.append(f"{label}: {d}")
        for label, row in (("at the knee", knee), ("at the best rate", best)):
            t = r.transfer(row)
            if t and r.volume_bytes:
                cost = f", transfer cost ${t['cost']:,.0f}" if "cost" in t else ""
                took = f"about {format_duration(t['seconds'])}"
                if "burst_seconds" in t and row.expected:
                    flows = "1 stream reaches" if row.streams == 1 else f"{row.streams} streams reach"
                    took = (
                        f"{flows} {format_bits(row.bits_per_second or 0)} while credits last, then "
                        f"{wording(row.expected.limit)} at the baseline ({format_bits(t['bits_per_second'])}) "
                        f"binds: {took}, not {format_duration(t['burst_seconds'])}"
                    )
                lines.append(f"moving {r.volume_bytes / 1e12:g} TB {label}: {took}{cost}")
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)
