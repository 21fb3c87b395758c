"""Which members a host probes: the whole mesh, or a hierarchical sample of it.

`full_mesh`: every other member. `hierarchical`: every other member of the same scope
(region or zone), and between two regions `representatives` links, chosen by rendezvous
(highest random weight) hashing so that every host derives the same links from the same
member list, and adding or removing one host moves only the links it ranks in. Every
region pair is linked. The config's `mesh` section holds a policy for the RTT/loss probes
and one for throughput (Config.rtt_peers, Config.throughput_peers); `bench/fleet.py` sizes
fleets with it.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from itertools import combinations
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class Member:
    name: str
    region: str
    zone: str = ""


class Policy(BaseModel):
    """A peer-selection policy, as the config's `mesh.rtt` and `mesh.throughput` hold it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["full_mesh", "hierarchical"] = "full_mesh"
    scope: Literal["region", "zone"] = "region"  # hierarchical: full mesh inside one of these
    representatives: int = Field(default=2, ge=1)  # hierarchical: links per region pair (and zone pair)


class MeshError(ValueError):
    """A member list or policy that cannot give every host its peers; the message names them."""


def check(members: list[Member], policy: Policy, where: str = "mesh") -> None:
    """Raise MeshError, naming `where` (the policy's field path), when the policy cannot link
    every region pair by `representatives` hosts of each side."""
    counts = Counter(m.name for m in members)
    twice = sorted(n for n, k in counts.items() if k > 1)
    if twice:
        raise MeshError(f"members: names used twice: {', '.join(twice)}")
    if policy.kind == "hierarchical":
        by_region = _by_region(members)
        small = sorted(r for r, hosts in by_region.items() if len(hosts) < policy.representatives)
        if small and len(by_region) > 1:
            raise MeshError(
                f"{where}.representatives: {policy.representatives} is more than the hosts of "
                f"region(s) {', '.join(small)}"
            )


def links(members: list[Member], policy: Policy, where: str = "mesh") -> set[tuple[str, str]]:
    """Every probed pair (a, b) with a < b, the same for every host."""
    check(members, policy, where)
    # Combinations of sorted names are pairs (a, b) with a < b as they come: no _pair call for
    # each of a 10,000-member mesh's 2.5 million in-region links.
    if policy.kind == "full_mesh":
        return set(combinations(sorted(m.name for m in members), 2))
    found: set[tuple[str, str]] = set()
    scope = (lambda m: (m.region, m.zone)) if policy.scope == "zone" else (lambda m: (m.region,))
    groups: dict[tuple[str, ...], list[Member]] = defaultdict(list)
    for m in members:
        groups[scope(m)].append(m)
    for group in groups.values():
        found.update(combinations(sorted(m.name for m in group), 2))
    by_region = _by_region(members)
    if policy.scope == "zone":  # zones of one region: linked like regions, by representatives
        for region, hosts in by_region.items():
            zones: dict[str, list[Member]] = defaultdict(list)
            for h in hosts:
                zones[h.zone].append(h)
            for za, zb in combinations(sorted(zones), 2):
                found |= _representatives(f"{region}/{za}", zones[za], f"{region}/{zb}", zones[zb], policy)
    for ra, rb in combinations(sorted(by_region), 2):
        found |= _representatives(ra, by_region[ra], rb, by_region[rb], policy)
    return found


def peers(members: list[Member], host: str, policy: Policy) -> list[str]:
    """The members `host` probes, sorted: its pairs of `links`, found without building every
    other host's (a 10,000-member hierarchical mesh has 2.5 million in-region links)."""
    check(members, policy)
    me = next(m for m in members if m.name == host)
    if policy.kind == "full_mesh":
        return sorted(m.name for m in members if m.name != host)
    scope = (lambda m: (m.region, m.zone)) if policy.scope == "zone" else (lambda m: (m.region,))
    found = {m.name for m in members if scope(m) == scope(me) and m.name != host}
    by_region = _by_region(members)
    groups = [(r, by_region[r]) for r in sorted(by_region)]
    if policy.scope == "zone":  # this host's zone against the other zones of its region
        zones: dict[str, list[Member]] = defaultdict(list)
        for h in by_region[me.region]:
            zones[h.zone].append(h)
        found |= _partners(host, me.zone, [(z, zones[z]) for z in sorted(zones)], policy, prefix=f"{me.region}/")
    found |= _partners(host, me.region, groups, policy)
    return sorted(found)


def _partners(
    host: str, mine: str, groups: list[tuple[str, list[Member]]], policy: Policy, prefix: str = ""
) -> set[str]:
    """Whom `host` (of group `mine`) is linked to by `_representatives` in the other groups;
    `groups` sorted by key, as `links` pairs them."""
    found = set()
    own = dict(groups)[mine]
    for key, hosts in groups:
        if key == mine:
            continue
        ka, a, kb, b = (mine, own, key, hosts) if mine < key else (key, hosts, mine, own)
        for x, y in _representatives(prefix + ka, a, prefix + kb, b, policy):
            if host in (x, y):
                found.add(y if x == host else x)
    return found


def _representatives(ka: str, a: list[Member], kb: str, b: list[Member], policy: Policy) -> set[tuple[str, str]]:
    """`representatives` links between two groups: each group's top hosts by rendezvous weight
    for this pair of groups, paired in rank order."""
    key = f"{ka}|{kb}"
    k = min(policy.representatives, len(a), len(b))
    top_a, top_b = _ranked(key, a)[:k], _ranked(key, b)[:k]
    return {_pair(x, y) for x, y in zip(top_a, top_b, strict=True)}


def _ranked(key: str, hosts: list[Member]) -> list[str]:
    weight = lambda name: hashlib.sha256(f"{key}|{name}".encode()).digest()  # noqa: E731
    return sorted((h.name for h in hosts), key=weight, reverse=True)


def _by_region(members: list[Member]) -> dict[str, list[Member]]:
    out: dict[str, list[Member]] = defaultdict(list)
    for m in members:
        out[m.region].append(m)
    return out


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def rounds(pairs: Collection[tuple[str, str]]) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The rounds of one throughput rotation over these pairs, no host in two pairs of a
    round: a greedy edge colouring in sorted order (at most twice the largest degree
    rounds), so the same on every host."""
    names = {name for pair in pairs for name in pair}
    return colour(in_order(pairs, names), names)


def in_order(pairs: Collection[tuple[str, str]], names: Collection[str]) -> list[tuple[str, str]]:
    """`pairs` (of `names`) in the order of sorted name tuples, sorted by one integer made of the
    two names' ranks: the same order, and a 10,000-member mesh's 2.5 million pairs in half the time."""
    rank = {name: i for i, name in enumerate(sorted(names))}
    n = len(rank)
    return sorted(pairs, key=lambda pair: rank[pair[0]] * n + rank[pair[1]])


def colour(
    ordered: Iterable[tuple[str, str]], names: Collection[str], keep: Collection[str] | None = None
) -> tuple[tuple[tuple[str, str], ...], ...]:
    """`rounds` of pairs (of `names`) already `in_order`; with `keep`, each round holds only the
    pairs of those hosts (a host's view of the rotation: Schedule.projected)."""
    # Each host's used colours as the bits of an int: the lowest colour free at both ends is
    # the lowest zero bit of their union (a 10,000-member mesh: 2.5 million pairs, 700 colours).
    used = dict.fromkeys(names, 0)
    out: list[list[tuple[str, str]]] = []
    for pair in ordered:
        a, b = pair
        taken = used[a] | used[b]
        bit = (taken + 1) & ~taken
        used[a] |= bit
        used[b] |= bit
        k = bit.bit_length() - 1
        if k == len(out):
            out.append([])
        if keep is None or a in keep or b in keep:
            out[k].append(pair)
    return tuple(map(tuple, out))
