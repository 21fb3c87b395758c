"""The flows room: the host's own TCP flows to each peer and configured network (flowreader.py),
beside what the probes measure of the same path. Labels per destination and limit only: never a
flow, a port or a process."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..config import Config
from ..flowreader import Reading
from ..tcpflows import LIMITS, Destination
from .common import PEER, Room, counter, gauge, one


@dataclass
class Totals:
    """One destination's counters since start, and its last read's gauges."""

    destination: Destination
    acked: float = 0.0
    received: float = 0.0
    retransmitted: float = 0.0
    limited: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LIMITS, 0.0))
    flows: float = 0.0
    app_limited: float = 0.0
    delivery_rate: float = 0.0
    rtt: dict[str, float] = field(default_factory=dict)


def _names(cfg: Config) -> set[str]:
    return {p.name for p in cfg.probed_peers} | {n.name for n in cfg.flows.networks}


class FlowsRoom(Room):
    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.enabled = cfg.flows.enabled
        # By the destination's name: a reload that changes a peer's region or path class keeps one
        # series under its new labels, not a second under the old ones.
        self.totals: dict[str, Totals] = {}
        self.last: Reading | None = None
        self.reads = {"ok": 0, "error": 0}
        self.cpu_seconds = 0.0

    def use(self, cfg: Config) -> None:
        super().use(cfg)
        self.enabled = cfg.flows.enabled
        keep = _names(cfg)
        for name in [name for name in self.totals if name not in keep]:
            del self.totals[name]

    def record(self, reading: Reading) -> None:
        """One read's sums (the reader's, on the event loop)."""
        self.reads["ok"] += 1
        self.cpu_seconds += reading.cpu_seconds
        self.last = reading
        sums = {d.peer: s for d, s in reading.sums.items()}
        for destination, s in reading.sums.items():
            t = self.totals.setdefault(destination.peer, Totals(destination))
            t.destination = destination
            t.acked += s.acked
            t.received += s.received
            t.retransmitted += s.retransmitted
            for limit, seconds in s.limited.items():
                t.limited[limit] += seconds
        # Each destination's gauges replaced at once, not zeroed first: a scrape renders on another
        # thread, and would read a destination with flows as none in between.
        for name, t in self.totals.items():
            now = sums.get(name)
            t.flows, t.app_limited, t.delivery_rate, t.rtt = (
                (now.flows, now.app_limited, now.delivery_rate, now.rtt_stats())
                if now is not None
                else (0.0, 0.0, 0.0, {})
            )

    def failed(self) -> None:
        self.reads["error"] += 1

    def collect(self) -> Iterator[Metric]:
        if self.enabled:
            yield from self._destinations()
            yield from self._reads()

    def _destinations(self) -> Iterator[Metric]:
        flows = gauge(
            "pathprobe_tcp_flows",
            "Established TCP connections of this host's applications to the peer (or flows.networks entry) "
            "at the last read; pathprobe's own probes and responders left out.",
            PEER,
        )
        app_limited = gauge(
            "pathprobe_tcp_flows_app_limited",
            "Of pathprobe_tcp_flows, those whose last delivery-rate sample was limited by the application "
            "(tcp_info's delivery_rate_app_limited).",
            PEER,
        )
        acked = counter(
            "pathprobe_tcp_flows_bytes_acked",
            "Bytes this host's flows to the peer sent that the peer acknowledged (tcpi_bytes_acked).",
            PEER,
        )
        received = counter(
            "pathprobe_tcp_flows_bytes_received",
            "Bytes this host's flows received from the peer (tcpi_bytes_received).",
            PEER,
        )
        retransmitted = counter(
            "pathprobe_tcp_flows_retransmitted_segments",
            "Segments this host's flows to the peer retransmitted (tcpi_total_retrans).",
            PEER,
        )
        limited = counter(
            "pathprobe_tcp_flows_limited_seconds",
            "Flow-seconds this host's flows to the peer spent sending limited by limit=receive_window (the "
            "peer's advertised window full), send_buffer (this host's send buffer full), network (the rest of "
            "the time with data in flight: congestion window, retransmissions) or application (a flow that "
            "sent, with nothing in flight). Linux 4.10 on.",
            [*PEER, "limit"],
        )
        rtt = gauge(
            "pathprobe_tcp_flows_rtt_seconds",
            "Smoothed RTT (tcpi_rtt) over this host's flows to the peer at the last read: stat=min, median, max.",
            [*PEER, "stat"],
        )
        rate = gauge(
            "pathprobe_tcp_flows_delivery_rate_bytes_per_second",
            "The kernel's delivery rate of this host's flows to the peer that sent since the read before, added.",
            PEER,
        )
        scope = self.scope
        for d, t in [(t.destination, t) for t in self.totals.values()]:
            labels = scope.labels(d.peer) or [d.peer, d.region, d.path_class]
            flows.add_metric(labels, t.flows)
            app_limited.add_metric(labels, t.app_limited)
            acked.add_metric(labels, t.acked)
            received.add_metric(labels, t.received)
            retransmitted.add_metric(labels, t.retransmitted)
            for limit in LIMITS:
                limited.add_metric([*labels, limit], t.limited[limit])
            for stat, seconds in t.rtt.items():
                rtt.add_metric([*labels, stat], seconds)
            rate.add_metric(labels, t.delivery_rate)
        yield from (flows, app_limited, acked, received, retransmitted, limited, rtt, rate)

    def _reads(self) -> Iterator[Metric]:
        last = self.last
        reads = CounterMetricFamily(
            "pathprobe_tcp_flows_reads",
            "Reads of the host's TCP flows (sock_diag), by result=ok or error.",
            labels=["result"],
        )
        for result, n in self.reads.items():
            reads.add_metric([result], n)
        yield reads
        yield one(
            CounterMetricFamily,
            "pathprobe_tcp_flows_read_cpu_seconds",
            "CPU time the reads of the host's TCP flows took (their thread's).",
            self.cpu_seconds,
        )
        if last is None:
            return
        yield one(
            GaugeMetricFamily,
            "pathprobe_tcp_flows_sockets",
            "TCP sockets in use on this host at the last read (every state and destination: /proc/net/sockstat).",
            last.sockets,
        )
        yield one(
            GaugeMetricFamily,
            "pathprobe_tcp_flows_sampled_ratio",
            "Share of the flows to peers and networks that the last read read: 1, or flows.max_sockets over "
            "their number (a stable sample by socket cookie, its counts scaled up by the inverse).",
            last.ratio,
        )
        yield one(GaugeMetricFamily, "pathprobe_tcp_flows_read_seconds", "Wall time of the last read.", last.seconds)
