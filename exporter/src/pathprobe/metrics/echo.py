"""The UDP echo and path MTU room: packets by outcome and load state, RTT variation, loss by
direction, failing flows (of the echo and the request/response probes), and which packet
sizes each path carries."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from prometheus_client.core import Metric

from ..config import Config
from ..probes import Reason
from ..probes.base import Rejection
from ..probes.echo import OneWay
from .common import PEER, STATE_DOC, Room, Scope, counter, gauge, peer_labels
from .outcomes import Ledger
from .owd import OwdRoom
from .rtt import STATES, Load, RttKey, RttRoom

UDP_COUNTS = ("sent", "received", "lost", "duplicate", "reordered", "late")
COMPACT_UDP_COUNTS = ("sent", "lost")  # what a compact peer (mesh.compact_outside) keeps: what the rules read
UDP_DOCS = {
    "sent": "UDP echo packets sent.",
    "received": "UDP echo packets answered in time.",
    "lost": "UDP echo packets with no answer within the timeout.",
    "duplicate": "Second and later echoes of one packet.",
    "reordered": "Echoes that arrived after the echo of a later packet.",
    "late": "Echoes that arrived after the packet was counted lost.",
}


class UdpKey(NamedTuple):
    peer: str
    state: str  # "idle" or "loaded" when the packet was sent


class FlowsKey(NamedTuple):
    peer: str
    protocol: str  # tcp: the request/response probe; udp: the echo probe


class MtuKey(NamedTuple):
    peer: str
    size: int  # IP packet size


class MarkKey(NamedTuple):
    peer: str
    direction: str  # forward: the echo to the peer; reverse: its answer back


class Marks(NamedTuple):
    sent: int  # the DSCP the packet left with
    received: int  # the one it arrived with (the last packet's)
    changed: int  # packets whose mark arrived changed, so far


class LostByDirection(NamedTuple):
    forward: int  # on the way to the peer
    reverse: int  # on the way back


@dataclass(frozen=True)
class MtuState:
    carried: bool  # by the last probe of the size
    last_carried: float | None  # when a probe of the size was last carried


class EchoRoom(Room):
    def __init__(self, cfg: Config, load: Load, rtt: RttRoom, clock: Callable[[], float] = time.time):
        super().__init__(cfg)
        self.load, self.rtt, self.clock = load, rtt, clock
        self.udp: dict[UdpKey, Counter[str]] = {}
        self.jitter: dict[str, float] = {}
        self.worst_flow_loss: dict[str, float] = {}
        self.lost_by_direction: dict[str, LostByDirection] = {}
        self.clock_offset: dict[str, float] = {}
        self.marks: dict[MarkKey, Marks] = {}
        self.failing: dict[FlowsKey, int] = {}
        self.mtu: dict[MtuKey, MtuState] = {}

    def tables(self) -> list[MutableMapping[Any, Any]]:
        return [
            self.udp,
            self.jitter,
            self.worst_flow_loss,
            self.lost_by_direction,
            self.clock_offset,
            self.marks,
            self.failing,
            self.mtu,
        ]

    # --- writers
    def count(self, peer: str, what: str, age: float = 0.0) -> None:
        """One packet's outcome. Loss under this host's or the peer's own throughput test is
        self-inflicted: kept apart, by when the packet was sent (`age` seconds ago), not when
        its timeout ran out."""
        if self.admits(peer):
            self.tally(UdpKey(peer, self.load.of(peer, self.clock() - age)), what)

    def tally(self, key: UdpKey, what: str) -> None:
        """One packet's outcome, of an admitted peer in the state its key says."""
        counts = self.udp.get(key)
        if counts is None:
            counts = self.udp[key] = Counter()
        counts[what] += 1

    def flows_failing(self, peer: str, protocol: str, count: int) -> None:
        if self.admits(peer):
            self.failing[FlowsKey(peer, protocol)] = count

    def set_worst_flow_loss(self, peer: str, ratio: float) -> None:
        if self.admits(peer):
            self.worst_flow_loss[peer] = ratio

    def set_lost_by_direction(self, peer: str, lost: LostByDirection) -> None:
        if self.admits(peer):
            self.lost_by_direction[peer] = lost

    def set_clock_offset(self, peer: str, seconds: float) -> None:
        if self.admits(peer):
            self.clock_offset[peer] = seconds

    def mark_seen(self, peer: str, direction: str, sent: int, received: int) -> None:
        if self.admits(peer):
            key = MarkKey(peer, direction)
            before = self.marks.get(key)
            if before is None or received != sent or before[:2] != (sent, received):  # else nothing changes
                changed = (before.changed if before else 0) + (received != sent)
                self.marks[key] = Marks(sent, received, changed)

    def mtu_probed(self, peer: str, size: int, carried: bool) -> None:
        if not self.admits(peer):
            return
        key = MtuKey(peer, size)
        before = self.mtu.get(key)
        last = self.clock() if carried else (before.last_carried if before else None)
        self.mtu[key] = MtuState(carried, last)

    # --- metrics
    def collect(self) -> Iterator[Metric]:
        scope = self.scope
        yield from self._packets(scope)
        yield self._per_peer(
            scope,
            self.jitter,
            "pathprobe_udp_rtt_variation_seconds",
            "Smoothed variation of successive UDP echo round-trip times (RFC 3550's jitter "
            "estimator, gain 1/16, applied to RTTs: not the one-way jitter of "
            "pathprobe_throughput_udp_jitter_seconds).",
        )
        yield self._per_peer(
            scope,
            self.clock_offset,
            "pathprobe_clock_offset_seconds",
            "The peer's wall clock minus this host's, from the least-delayed of the last 64 UDP "
            "echoes (NTP's on-wire method; error at most half that echo's RTT). Throughput turns "
            "allow 1 s.",
        )
        yield from self._loss(scope)
        yield from self._marks(scope)
        yield self._failing(scope)
        yield from self._mtu(scope)

    def _packets(self, scope: Scope) -> Iterator[Metric]:
        cfg = scope.cfg
        families = {
            k: counter(f"pathprobe_udp_packets_{k}", UDP_DOCS[k] + STATE_DOC, [*PEER, "state"]) for k in UDP_COUNTS
        }
        udp = dict(self.udp)
        # A peer's packets are "loaded" while this host or the peer is in any throughput test,
        # whether or not the two test each other (load.LoadState): both states for every
        # peer wherever this mesh runs tests.
        states = STATES if cfg.half_slot_need(with_margin=False) else ("idle",)
        if cfg.probes.loss.enabled:
            compact = cfg.compact_peers
            for peer in cfg.rtt_peers:
                for state in ("idle",) if peer.name in compact else states:
                    counts = dict(udp.get(UdpKey(peer.name, state), {}))
                    for k in COMPACT_UDP_COUNTS if peer.name in compact else UDP_COUNTS:
                        # every series from zero, so that increase() sees the first loss
                        families[k].add_metric([*peer_labels(peer), state], counts.get(k, 0))
        yield from families.values()

    @staticmethod
    def _per_peer(scope: Scope, table: dict[str, float], name: str, documentation: str) -> Metric:
        """A gauge with one value per peer."""
        family = gauge(name, documentation, PEER)
        for peer, _, value in scope.entries(table):
            family.add_metric(peer, value)
        return family

    def _loss(self, scope: Scope) -> Iterator[Metric]:
        forward = counter(
            "pathprobe_udp_packets_lost_forward",
            "UDP echo packets lost on the way to the peer (the peer's responder never counted them).",
            PEER,
        )
        reverse = counter(
            "pathprobe_udp_packets_lost_reverse",
            "UDP echo packets the peer's responder counted whose echo never came back.",
            PEER,
        )
        worst = gauge(
            "pathprobe_udp_worst_flow_loss_ratio",
            "Loss ratio of the worst of the echo probe's flows (source ports) over its last 32 packets.",
            PEER,
        )
        by_direction, worst_loss = dict(self.lost_by_direction), dict(self.worst_flow_loss)
        if scope.cfg.probes.loss.enabled:
            for peer in scope.cfg.rtt_peers:
                f, r = by_direction.get(peer.name, (0, 0))
                forward.add_metric(peer_labels(peer), f)
                reverse.add_metric(peer_labels(peer), r)
                if peer.name in worst_loss:
                    worst.add_metric(peer_labels(peer), worst_loss[peer.name])
        yield from (forward, reverse, worst)

    def _marks(self, scope: Scope) -> Iterator[Metric]:
        info = gauge(
            "pathprobe_dscp_received_info",
            "The DSCP the last UDP echo (forward: to the peer) or its answer (reverse: sent with the mark "
            "the echo arrived with) left with and arrived with: a path that bleaches or rewrites marks "
            "shows received != sent. The probes' marks: probes.*.dscp.",
            [*PEER, "direction", "sent", "received"],
        )
        changed = counter(
            "pathprobe_dscp_changed", "UDP echo packets whose DSCP mark arrived changed.", [*PEER, "direction"]
        )
        for peer, key, marks in scope.entries(self.marks):
            if key.peer in scope.cfg.compact_peers:  # what the rules read only
                continue
            info.add_metric([*peer, key.direction, str(marks.sent), str(marks.received)], 1)
            changed.add_metric([*peer, key.direction], marks.changed)
        yield from (info, changed)

    def _failing(self, scope: Scope) -> Metric:
        failing = gauge(
            "pathprobe_probe_flows_failing",
            "Flows (source ports) of a continuous probe whose recent probes mostly failed: one broken "
            "member of an ECMP group fails some flows of a path and not others.",
            [*PEER, "protocol"],
        )
        for peer, key, n in scope.entries(self.failing):
            failing.add_metric([*peer, key.protocol], n)
        return failing

    def _mtu(self, scope: Scope) -> Iterator[Metric]:
        carried = gauge(
            "pathprobe_path_mtu_carried",
            "1 when the last DF-set probe of this IP packet size reached the peer and came back, else 0.",
            [*PEER, "size_bytes"],
        )
        last = gauge(
            "pathprobe_path_mtu_last_carried_timestamp_seconds",
            "Unix time at which a probe of this IP packet size was last carried (absent: never).",
            [*PEER, "size_bytes"],
        )
        for peer, key, state in scope.entries(self.mtu):
            labels = [*peer, str(key.size)]
            carried.add_metric(labels, 1 if state.carried else 0)
            if state.last_carried is not None:
                last.add_metric(labels, state.last_carried)
        yield from (carried, last)


class EchoRecorder:
    """UDP echo outcomes of one peer (probes.echo.EchoSink); its RTTs go to the RTT room."""

    def __init__(self, room: EchoRoom, ledger: Ledger, peer: str, owd: OwdRoom):
        self.room, self.ledger, self.peer, self.owd = room, ledger, peer, owd

    def sent(self, size: int) -> None:
        self.room.count(self.peer, "sent")
        self.ledger.moved(self.peer, size)

    def received(
        self, rtt: float, age: float = 0.0, jitter: float | None = None, one_way: OneWay | None = None
    ) -> None:
        room, peer = self.room, self.peer
        if not room.admits(peer):  # the RTT and one-way delay rooms serve the same config (Rooms.use)
            return
        now = room.clock() - age
        state = room.load.of(peer, now)  # once for all of the echo's figures: 5 times a second a peer
        room.tally(UdpKey(peer, state), "received")
        room.rtt.add(RttKey(peer, "udp", state), rtt, now)
        if jitter is not None:
            room.jitter[peer] = jitter
        if one_way is not None:
            self.owd.observe(peer, one_way, now, state)
        self.ledger.success(peer)

    def lost(self, age: float) -> None:
        self.room.count(self.peer, "lost", age)
        self.ledger.failure(self.peer, "timeout")

    def clocks(self, peer_bound: float | None, clocks_apart: float) -> None:
        if self.room.admits(self.peer):
            self.owd.agree(self.peer, peer_bound, clocks_apart)

    def rejected(self, reason: Rejection, answered: bool = False) -> None:
        self.ledger.reject(self.peer, reason)
        if answered:  # it came back: no loss, and no figure from it
            self.room.count(self.peer, "received")

    def duplicate(self) -> None:
        self.room.count(self.peer, "duplicate")

    def reordered(self) -> None:
        self.room.count(self.peer, "reordered")

    def late(self) -> None:
        self.room.count(self.peer, "late")

    def failure(self, reason: Reason) -> None:
        self.ledger.failure(self.peer, reason)

    def flows_failing(self, count: int, worst_loss_ratio: float) -> None:
        self.room.flows_failing(self.peer, "udp", count)
        self.room.set_worst_flow_loss(self.peer, worst_loss_ratio)

    def lost_by_direction(self, forward: int, reverse: int) -> None:
        self.room.set_lost_by_direction(self.peer, LostByDirection(forward, reverse))

    def clock_offset(self, seconds: float) -> None:
        self.room.set_clock_offset(self.peer, seconds)

    def marks(self, sent: int, forward: int, reverse: int | None) -> None:
        self.room.mark_seen(self.peer, "forward", sent, forward)
        if reverse is not None:
            self.room.mark_seen(self.peer, "reverse", forward, reverse)


class MtuRecorder:
    """Path MTU outcomes of one peer (probes.mtu.MtuSink)."""

    def __init__(self, room: EchoRoom, ledger: Ledger, peer: str):
        self.room, self.ledger, self.peer = room, ledger, peer

    def mtu(self, size: int, carried: bool, reason: Reason | None) -> None:
        self.room.mtu_probed(self.peer, size, carried)
        if carried:
            self.ledger.success(self.peer)
        else:
            self.ledger.failure(self.peer, reason or "error")
