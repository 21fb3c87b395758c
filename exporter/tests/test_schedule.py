"""The mesh schedule: no host in two throughput tests at once, every pair met."""

import itertools
import random

import pytest

from pathprobe.schedule import Schedule, Timetable


def hosts(n: int) -> list[str]:
    return [f"host-{i:03d}" for i in range(n)]


@pytest.mark.parametrize("n", [*range(2, 21), 47, 100, 199, 200])
def test_every_pair_meets_once_per_rotation(n: int) -> None:
    s = Schedule.of(hosts(n), 60)
    met = [pair for rnd in s.rounds for pair in rnd]
    assert len(met) == len(set(met)) == n * (n - 1) // 2
    assert len(s.rounds) == (n - 1 if n % 2 == 0 else n)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 17, 64, 200])
def test_no_host_in_two_tests_at_once(n: int) -> None:
    s = Schedule.of(hosts(n), 60)
    for slot in range(2 * len(s.rounds)):  # two rotations: the first client alternates
        busy: dict[tuple[float, float], list[str]] = {}
        for h in s.members:
            turn = s.turn(h, slot)
            if turn is None:
                continue
            # A client turn occupies the client and its server for that half-slot.
            busy.setdefault((turn.start, turn.end), []).extend([h, turn.peer])
        for window, involved in busy.items():
            assert len(involved) == len(set(involved)), f"slot {slot} {window}: {involved}"


@pytest.mark.parametrize("n", [2, 5, 12])
def test_both_hosts_of_a_pair_get_one_half_each(n: int) -> None:
    s = Schedule.of(hosts(n), 60)
    for slot in range(len(s.rounds)):
        for a, b in s.rounds[slot % len(s.rounds)]:
            ta, tb = s.turn(a, slot), s.turn(b, slot)
            assert ta is not None and tb is not None
            assert (ta.peer, tb.peer) == (b, a)
            assert {ta.start, tb.start} == {slot * 60, slot * 60 + 30}
            assert ta.end - ta.start == tb.end - tb.start == 30


def test_every_exporter_derives_the_same_schedule_from_any_order() -> None:
    names = hosts(9)
    orders = [Schedule.of(list(p), 45) for p in itertools.islice(itertools.permutations(names), 50)]
    assert len({o.rounds for o in orders}) == 1
    assert len({o.fingerprint for o in orders}) == 1
    assert Schedule.of(names, 46).fingerprint != orders[0].fingerprint


def test_next_turn_is_the_first_not_yet_ended() -> None:
    s = Schedule.of(hosts(4), 60)
    t = s.next_turn("host-000", 1_000_000.0)
    assert t is not None and t.end > 1_000_000.0
    later = s.next_turn("host-000", t.end)
    assert later is not None and later.start >= t.end


def test_duplicate_members_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        Schedule.of(["a", "a"], 60)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_the_client_of_a_server_is_exactly_whose_turn_it_is(n: int) -> None:
    s = Schedule.of(hosts(n), 60)
    for slot in range(2 * len(s.rounds)):
        for client in s.members:
            turn = s.turn(client, slot)
            if turn is None:
                continue
            server = turn.peer
            # Inside the turn: that client only; in the server's own half: nobody tests it.
            assert s.clients_of(server, turn.start + 1, grace=0.5) == {client}
            own = s.turn(server, slot)
            assert own is not None and s.clients_of(server, own.start + 1, grace=0.5) == set()
            # At the edges, the grace admits the turn's client a little early and late.
            assert client in s.clients_of(server, turn.start - 0.4, grace=0.5)
            assert client in s.clients_of(server, turn.end + 0.4, grace=0.5)


def turns_between(t: Timetable, host: str, start: float, end: float) -> list[tuple[float, float, str, str]]:
    """(start, end, client, server) of every turn `host` takes as the client in [start, end)."""
    out, now = [], start
    while (turn := t.next_turn(host, now)) is not None and turn.start < end:
        out.append((turn.start, turn.end, host, turn.peer))
        now = turn.end
    return out


def test_a_rolling_change_of_members_never_puts_a_host_in_two_tests() -> None:
    """5 hosts run one member list; a 6th joins: each old host reloads the new list at its own
    time before the epoch, the new one starts fresh. No host is ever in two tests, and every
    pair of the new mesh meets within one rotation after the epoch."""
    old, new = Schedule.of(hosts(5), 20), Schedule.of(hosts(6), 20)
    epoch = 1_000_000 * 20 + 10  # not on a slot boundary: the partial slot is skipped
    start = epoch - 5 * old.rotation_seconds
    reloaded_at = {h: epoch - 7 - 13 * i for i, h in enumerate(hosts(5))}
    intervals = []
    for h in hosts(5):  # before its reload a host takes the old schedule's turns; after, the timetable's
        before = Timetable(old)
        after = before.then(new, epoch, reloaded_at[h])
        intervals += turns_between(before, h, start, reloaded_at[h])
        intervals += [
            i
            for i in turns_between(after, h, reloaded_at[h], epoch + 2 * new.rotation_seconds)
            if i[0] >= reloaded_at[h]
        ]
    fresh = Timetable(new, epoch)  # the new host, started before the epoch
    joined = turns_between(fresh, "host-005", start, epoch + 2 * new.rotation_seconds)
    assert joined and min(i[0] for i in joined) >= epoch
    intervals += joined
    for h in hosts(6):
        mine = sorted((s, e) for s, e, client, server in intervals if h in (client, server))
        assert all(e1 <= s2 for (_, e1), (s2, _) in itertools.pairwise(mine)), h
    met = {frozenset((c, s)) for b, _, c, s in intervals if epoch <= b < epoch + new.rotation_seconds + 20}
    assert met == {frozenset(p) for p in itertools.combinations(hosts(6), 2)}
    assert fresh.clients_of("host-005", epoch - 30, 1.0) == set()  # admitted by no one before the epoch


def test_timetables_do_not_pile_up_over_reloads() -> None:
    t = Timetable(Schedule.of(hosts(3), 20))
    for k in range(50):
        t = t.then(Schedule.of(hosts(3 + k % 2), 20), 1000.0 + k, 1000.0 + k)
    depth = 0
    while t.before is not None:
        t, depth = t.before, depth + 1
    assert depth <= 2


@pytest.mark.parametrize("seed", range(10))
def test_a_projected_view_has_the_full_schedules_turns_for_its_hosts(seed: int) -> None:
    rng = random.Random(seed)
    members = hosts(rng.randint(3, 40))
    pairs = {p for p in itertools.combinations(members, 2) if rng.random() < 0.4}
    for full in (Schedule.of(members, 20), Schedule.of(members, 20, pairs)):
        keep = set(rng.sample(members, 2))
        view = full.projected(keep)
        assert view.fingerprint == full.fingerprint and len(view.rounds) == len(full.rounds)
        for slot in range(3 * len(full.rounds)):
            assert [view.turn(h, slot) for h in sorted(keep)] == [full.turn(h, slot) for h in sorted(keep)]
            assert {p for p in view.rounds[slot % len(view.rounds)]} == {
                p for p in full.rounds[slot % len(full.rounds)] if keep & set(p)
            }


def test_pairs_of_a_non_member_are_refused() -> None:
    with pytest.raises(ValueError, match="'z', not a member"):
        Schedule.of(["a", "b"], 20, {("a", "z")})
