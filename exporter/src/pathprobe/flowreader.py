"""Reads the host's own TCP flows to its peers every flows.interval_seconds (tcpflows.py parses,
sockdiag.py asks the kernel) and hands each read's sums per destination to the flows room
(metrics/flows.py): what each flow did since the last read, by its socket cookie, so that the
room's counters only rise. A flow's last part before it closes (after its last read) is not
counted: sock_diag shows open sockets only.

Past flows.max_sockets flows to peers and networks, a stable sample by cookie is read (the same
sockets from read to read, so their differences hold) and its sums scaled up by the inverse of
the sampled ratio."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from . import sockdiag, tcpflows
from .config import Config
from .tcpflows import LIMITS, Classifier, Destination, Flow

log = logging.getLogger(__name__)

_FAMILIES = (socket.AF_INET, socket.AF_INET6)
_MASK = (1 << 64) - 1


def classifier(cfg: Config) -> Classifier:
    """The destinations of `cfg`: its probed peers (what /metrics names) and flows.networks; its
    own sockets by port: the responders', /metrics' and the ports its probes reach on peers."""
    peers = {str(p.address): Destination(p.name, p.region, p.path_class.value) for p in cfg.probed_peers}
    networks = [
        (str(n), Destination(net.name, net.region, net.path_class.value))
        for net in cfg.flows.networks
        for n in net.networks
    ]
    local = {cfg.responders.rr_port, *cfg.iperf3.ports, cfg.web.address()[1]}  # /metrics' scrapes too
    remote = {cfg.responders.rr_port, *cfg.iperf3.ports}
    for p in cfg.probed_peers:
        remote.add(p.rr_port or cfg.responders.rr_port)
        first = p.iperf3_port or cfg.iperf3.port
        remote.update(range(first, first + cfg.iperf3.processes))
    return Classifier(peers, networks, local, remote)


def _flow(message: bytes, last: dict[int, Flow], ratio: float) -> Flow | None:
    """The flow of `message` if the sample keeps it: the one read last time where its counters did
    not move (most sockets, most reads), else parsed."""
    quick = tcpflows.counters(message)
    if quick is None:  # a kernel without the busy time
        flow = tcpflows.parse(message)
        return flow if flow is not None and (ratio == 1.0 or _kept(flow.cookie, ratio)) else None
    cookie, figures = quick
    if ratio < 1.0 and not _kept(cookie, ratio):
        return None
    known = last.get(cookie)
    return known if known is not None and tcpflows.moved(known) == figures else tcpflows.parse(message)


def _kept(cookie: int, ratio: float) -> bool:
    """Whether a socket is in a sample of `ratio`: by a hash of its cookie, so the same sockets stay in."""
    return ((cookie * 0x9E3779B97F4A7C15) & _MASK) < ratio * _MASK


@dataclass
class Sums:
    """One destination's flows at one read: counts scaled by the sample's inverse."""

    flows: float = 0.0
    app_limited: float = 0.0
    acked: float = 0.0
    received: float = 0.0
    retransmitted: float = 0.0
    delivery_rate: float = 0.0  # bytes/s: the flows that sent since the last read, added
    limited: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LIMITS, 0.0))
    rtts: list[float] = field(default_factory=list)  # seconds, of the flows read

    def rtt_stats(self) -> dict[str, float]:
        if not self.rtts:
            return {}
        return {"min": min(self.rtts), "median": statistics.median(self.rtts), "max": max(self.rtts)}


@dataclass(frozen=True)
class Reading:
    """What one read found."""

    sums: dict[Destination, Sums]
    sockets: int  # TCP sockets in use in the namespace (every state and destination)
    matched: int  # of them, flows to a peer or network
    ratio: float  # the share of `matched` read
    seconds: float  # the read's wall time
    cpu_seconds: float  # the read's CPU time (its thread's)


Dump = Callable[[int], list[bytes]]


def destinations(cfg: Config) -> list[sockdiag.Network]:
    """The networks the kernel is asked for: every probed peer's address and flows.networks."""
    peers = [ipaddress.ip_network(p.address) for p in cfg.probed_peers]
    return [*peers, *(ipaddress.ip_network(n) for net in cfg.flows.networks for n in net.networks)]


def in_use_tcp_sockets(path: str = "/proc/net/sockstat") -> int:
    """The TCP sockets in use in this network namespace (every state and destination): the
    kernel's own count, as the dump returns only the sockets to peers and networks."""
    for line in Path(path).read_text().splitlines():
        if line.startswith("TCP:"):
            fields = line.split()
            return int(fields[fields.index("inuse") + 1])
    raise OSError(errno.ENOENT, f"{path}: no TCP line")


class FlowReader:
    """The state between reads: each sampled socket's last counters, by cookie. `dump` stands in
    for the kernel's (a test's); without it the kernel is asked for the config's destinations only."""

    def __init__(self, cfg: Config, dump: Dump | None = None, clock: Callable[[], float] = time.monotonic):
        self.dump, self.clock = dump or self._kernel_dump, clock
        self.last: dict[int, Flow] = {}
        # Sockets the last read did not list but the one before did: a dump resumes by position and can
        # miss a socket; seen again, it is counted from these figures, not from zero (its whole lifetime).
        self.missing: dict[int, Flow] = {}
        self.last_at: float | None = None
        self.last_ratio = 1.0
        # A reload (use) while a read runs in its thread: that read's state and sums are the old config's.
        self._config_lock, self._generation = threading.Lock(), 0
        self.use(cfg)

    def _kernel_dump(self, family: int) -> list[bytes]:
        return sockdiag.dump(self._requests[family]) if self._requests else []

    def use(self, cfg: Config) -> None:
        wanted = destinations(cfg)
        requests: dict[int, bytes] = {f: sockdiag.established_request(f, wanted) for f in _FAMILIES} if wanted else {}
        with self._config_lock:
            self.cfg, self.classes, self._requests = cfg, classifier(cfg), requests
            self._generation += 1
            if not cfg.flows.enabled:  # read again from scratch if enabled again
                self.last, self.missing, self.last_at, self.last_ratio = {}, {}, None, 1.0
            else:
                # The next read is not fresh: a reload that adds a peer or network (or changes the ports
                # left out) makes its open connections first seen then, and their whole lifetime's bytes
                # and retransmits are not that read's. They are taken as its baseline.
                self.last_ratio = 0.0

    def _matched(self) -> tuple[int, list[tuple[bytes, Destination]]]:
        found = []
        of = self.classes.of
        for family in _FAMILIES:
            for message in self.dump(family):
                _, address, sport, dport = tcpflows.remote_key(message)
                destination = of(address, sport, dport)
                if destination is not None:
                    found.append((message, destination))
        return in_use_tcp_sockets(), found

    def read(self) -> Reading | None:
        """One read (in a thread: it blocks on netlink); None when a reload came meanwhile (the next
        read is the new config's baseline). OSError where the kernel refuses it."""
        started, cpu, generation = self.clock(), time.thread_time(), self._generation
        sockets, matched = self._matched()
        ratio = min(1.0, self.cfg.flows.max_sockets / len(matched)) if matched else 1.0
        seconds = started - self.last_at if self.last_at is not None else 0.0
        # A socket first seen now is new since the last read (counted from 0) unless this is the
        # first read or the sample changed (then it may be old: its history is not this read's).
        fresh = self.last_at is not None and ratio == 1.0 and self.last_ratio == 1.0
        sums: dict[Destination, Sums] = {}
        now: dict[int, Flow] = {}
        scale = 1 / ratio
        last = {**self.missing, **self.last} if self.missing else self.last
        for message, destination in matched:
            flow = _flow(message, last, ratio)
            if flow is None or flow.cookie in now:  # a dump may list a socket twice (it resumes by position)
                continue
            now[flow.cookie] = flow
            s = sums.get(destination)
            if s is None:
                s = sums[destination] = Sums()
            s.flows += scale
            s.app_limited += scale if flow.app_limited else 0.0
            if flow.rtt_us:
                s.rtts.append(flow.rtt_us / 1e6)
            before = last.get(flow.cookie)
            if before is None and not fresh:
                continue
            if before is flow:  # most sockets, most reads: idle
                continue
            change = tcpflows.delta(flow, before)
            s.acked += change.acked * scale
            s.received += change.received * scale
            s.retransmitted += change.retransmitted * scale
            if change.acked:
                s.delivery_rate += flow.delivery_rate * scale
            if flow.chrono and seconds > 0:
                for limit, spent in tcpflows.limited(change, seconds, flow.window_bound).items():
                    s.limited[limit] += spent * scale
        with self._config_lock:
            if generation != self._generation:
                return None
            self.missing = {c: f for c, f in self.last.items() if c not in now}
            self.last, self.last_at, self.last_ratio = now, started, ratio
        return Reading(sums, sockets, len(matched), ratio, self.clock() - started, time.thread_time() - cpu)


class FlowSink(Protocol):
    """What a reader hands its reads to (the flows room)."""

    def record(self, reading: Reading) -> None: ...

    def failed(self) -> None: ...


async def run(reader: FlowReader, sink: FlowSink) -> None:
    """Until cancelled: while the reader's config enables it, a read every flows.interval_seconds,
    in a thread, handed to `sink` on the loop."""
    warned = False
    while True:
        if reader.cfg.flows.enabled:
            try:
                reading = await asyncio.to_thread(reader.read)
                if reading is not None:
                    sink.record(reading)
            except OSError as exc:
                sink.failed()
                if not warned:
                    log.warning("flows: sock_diag refused the read of the host's TCP flows: %s", exc)
                    warned = True
            except Exception:  # a bug must not end the reading for good: counted, logged, next read
                sink.failed()
                log.exception("flows: a read of the host's TCP flows failed")
        await asyncio.sleep(reader.cfg.flows.interval_seconds)
