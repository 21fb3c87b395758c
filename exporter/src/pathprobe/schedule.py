"""A mesh-wide throughput schedule that every exporter derives on its own.

The hosts (this one and all its peers) are sorted by name and paired by the
circle method of a round-robin tournament: in each round every host meets at
most one other, and over one rotation every pair meets exactly once. A sampled mesh
(config `mesh.throughput`, mesh.py) plays the rounds of an edge colouring of its links
instead (mesh.rounds), also the same on every host. Time is cut
into slots of `slot_seconds` since the Unix epoch; slot k plays round k mod R.
Within a slot the two hosts of a pair take turns as the iperf3 client, one half
each, so that no host is ever in two throughput tests at once, anywhere in the
mesh, without a coordinator. Exporters only need the same member list, the same
slot length and clocks that agree to well under the jitter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from functools import cached_property

from . import mesh


@dataclass(frozen=True)
class Turn:
    """One host's client turn: test `peer` from `start` to `end` (Unix seconds)."""

    slot: int
    peer: str
    start: float
    end: float


@dataclass(frozen=True)
class Schedule:
    members: tuple[str, ...]
    slot_seconds: float
    # The pairs that test each other (a < b); None: every pair (a full mesh).
    pairs: tuple[tuple[str, str], ...] | None = None

    @classmethod
    def of(cls, members: list[str], slot_seconds: float, pairs: set[tuple[str, str]] | None = None) -> Schedule:
        if len(set(members)) != len(members):
            raise ValueError("schedule members must be unique")
        if pairs is None:
            return cls(tuple(sorted(members)), slot_seconds)
        try:
            ordered = mesh.in_order(pairs, members)
        except KeyError as exc:
            raise ValueError(f"schedule pairs name {exc}, not a member") from None
        return cls(tuple(sorted(members)), slot_seconds, tuple(ordered))

    @cached_property
    def rounds(self) -> tuple[tuple[tuple[str, str], ...], ...]:
        if self.pairs is not None:
            return mesh.colour(self.pairs, self.members) or ((),)  # no pair at all: one empty round
        players: list[str | None] = list(self.members)
        if len(players) % 2:
            players.append(None)  # a bye
        n = len(players)
        fixed, rest = players[0], players[1:]
        out = []
        for r in range(n - 1):
            order = [fixed, *rest[r:], *rest[:r]]
            pairs = []
            for i in range(n // 2):
                a, b = order[i], order[n - 1 - i]
                if a is not None and b is not None:
                    pairs.append((min(a, b), max(a, b)))
            out.append(tuple(pairs))
        return tuple(out)

    def projected(self, hosts: Collection[str]) -> Schedule:
        """This schedule as far as `hosts` take part in it: the same rotation, fingerprint and turns
        for them, without the pairs of the others (a 10,000-member sampled mesh has 2.5 million)."""
        keep = set(hosts)
        view = Schedule(self.members, self.slot_seconds)
        if self.pairs is None:
            rounds = tuple(tuple(p for p in r if p[0] in keep or p[1] in keep) for r in self.rounds)
        else:  # coloured with the others' pairs, and only this view's kept
            rounds = mesh.colour(self.pairs, self.members, keep) or ((),)
        view.__dict__["rounds"] = rounds
        view.__dict__["fingerprint"] = self.fingerprint  # cached_property's own slot: set, not computed
        return view

    @property
    def rotation_seconds(self) -> float:
        return len(self.rounds) * self.slot_seconds

    @cached_property
    def fingerprint(self) -> str:
        """Short hash of members, slot length and pairs: equal on every host of a consistent mesh."""
        text = f"{self.slot_seconds:g}|" + ",".join(self.members)
        if self.pairs is not None:
            text += "|" + ",".join(f"{a}-{b}" for a, b in self.pairs)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def partner(self, host: str, slot: int) -> str | None:
        for a, b in self.rounds[slot % len(self.rounds)]:
            if host == a:
                return b
            if host == b:
                return a
        return None

    def turn(self, host: str, slot: int) -> Turn | None:
        """This host's client turn in `slot`, or None when it sits out."""
        peer = self.partner(host, slot)
        if peer is None:
            return None
        # The pair alternates who goes first from one rotation to the next.
        rotation = slot // len(self.rounds)
        first = min(host, peer) if rotation % 2 == 0 else max(host, peer)
        start = slot * self.slot_seconds
        half = self.slot_seconds / 2
        if host != first:
            start += half
        return Turn(slot, peer, start, start + half)

    def busy(self, host: str, now: float, active_seconds: float) -> bool:
        """Whether `host` may be in a throughput test at `now`: it has a partner in this
        slot (so it is the client in one half and the server in the other) and `now` is
        within `active_seconds` of the start of the current half (what a half's tests take
        as run: Config.half_slot_need(with_margin=False))."""
        slot = int(now // self.slot_seconds)
        if self.partner(host, slot) is None:
            return False
        return (now % self.slot_seconds) % (self.slot_seconds / 2) < active_seconds

    def clients_of(self, server: str, now: float, grace: float) -> set[str]:
        """The hosts whose client turn against `server` covers `now`, give or take `grace`
        seconds (hosts' clocks differ a little): who may run a test against it then."""
        slot = int(now // self.slot_seconds)
        found = set()
        for s in (slot - 1, slot, slot + 1):
            peer = self.partner(server, s)
            if peer is None:
                continue
            turn = self.turn(peer, s)
            if turn is not None and turn.start - grace <= now < turn.end + grace:
                found.add(peer)
        return found

    def next_turn(self, host: str, now: float) -> Turn | None:
        """The first turn of `host` that has not ended at `now`."""
        slot = int(now // self.slot_seconds)
        for s in range(slot, slot + len(self.rounds) + 1):
            t = self.turn(host, s)
            if t is not None and t.end > now:
                return t
        return None


@dataclass(frozen=True)
class Timetable:
    """The schedule in force at any time across member-list changes: `current` from `epoch`,
    before it what was in force then (`before`: the timetable a reload replaced; None on a
    fresh start, when this host takes and admits no test until `epoch`). A turn of the old
    schedule that would end after the epoch is not taken, nor a turn of the new one that
    starts before it: every host that loaded the new member list before the epoch switches
    at the same instant, so that no host is in two tests during a rolling change."""

    current: Schedule
    epoch: float = 0.0
    before: Timetable | None = None

    def then(self, schedule: Schedule, epoch: float, now: float) -> Timetable:
        """This timetable with `schedule` in force from `epoch`. What is no longer in force
        at `now` is dropped, so reloads do not pile up."""
        kept = self if self.epoch > now else Timetable(self.current, self.epoch)
        return Timetable(schedule, epoch, kept)

    def at(self, now: float) -> Schedule | None:
        """The schedule in force at `now` (None: none yet)."""
        if now >= self.epoch:
            return self.current
        return self.before.at(now) if self.before is not None else None

    def next_turn(self, host: str, now: float) -> Turn | None:
        if now < self.epoch and self.before is not None:
            turn = self.before.next_turn(host, now)
            if turn is not None and turn.end <= self.epoch:
                return turn
        turn = self.current.next_turn(host, max(now, self.epoch))
        while turn is not None and turn.start < self.epoch:
            turn = self.current.next_turn(host, turn.end)
        return turn

    def busy(self, host: str, now: float, active_seconds: float) -> bool:
        schedule = self.at(now)
        return schedule is not None and schedule.busy(host, now, active_seconds)

    def clients_of(self, server: str, now: float, grace: float) -> set[str]:
        # Both sides of an epoch within `grace`: a client whose clock is a little ahead starts early.
        found: set[str] = set()
        for schedule in {self.at(now - grace), self.at(now + grace)} - {None}:
            assert schedule is not None
            found |= schedule.clients_of(server, now, grace)
        return found
