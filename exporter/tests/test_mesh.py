"""Peer selection (mesh.py): the same links on every host, every region pair measured, few
links moved when one host joins, bad member lists named."""

import contextlib
import random
from itertools import combinations

import pytest
from pydantic import ValidationError

from pathprobe.mesh import Member, MeshError, Policy, links, peers, rounds

HIER = Policy(kind="hierarchical", scope="region", representatives=2)


def fleet(regions: int, per_region: int) -> list[Member]:
    return [
        Member(f"r{r:02d}-h{h:03d}", f"region-{r:02d}", f"region-{r:02d}{'abc'[h % 3]}")
        for r in range(regions)
        for h in range(per_region)
    ]


def test_full_mesh_is_every_pair() -> None:
    members = fleet(3, 4)
    assert len(links(members, Policy())) == 12 * 11 // 2
    assert peers(members, "r00-h000", Policy()) == sorted(m.name for m in members[1:])


def test_hierarchical_is_a_full_mesh_in_a_region_and_k_links_per_region_pair() -> None:
    members = fleet(5, 6)
    found = links(members, HIER)
    region = {m.name: m.region for m in members}
    inside = {p for p in found if region[p[0]] == region[p[1]]}
    assert len(inside) == 5 * (6 * 5 // 2)
    between: dict[tuple[str, str], int] = {}
    for a, b in found - inside:
        key = tuple(sorted((region[a], region[b])))
        between[key] = between.get(key, 0) + 1  # type: ignore[index]
    assert between == {pair: 2 for pair in combinations(sorted(set(region.values())), 2)}


def test_every_host_derives_the_same_links_from_any_order() -> None:
    members = fleet(4, 5)
    shuffled = members[:]
    random.Random(7).shuffle(shuffled)
    assert links(members, HIER) == links(shuffled, HIER)
    for m in members:  # a's peers include b exactly when b's include a
        for p in peers(members, m.name, HIER):
            assert m.name in peers(shuffled, p, HIER)


def test_one_host_joining_moves_few_links() -> None:
    members = fleet(6, 8)
    before = links(members, HIER)
    joined = Member("r02-h999", "region-02", "region-02a")
    after = links([*members, joined], HIER)
    moved = {p for p in before ^ after if joined.name not in p}
    # Its region's representatives shift by at most k per region pair; the rest stays.
    assert len(moved) <= 2 * HIER.representatives * 5
    assert len(moved) < 0.05 * len(before)


def test_zone_scope_links_zones_of_a_region_by_representatives() -> None:
    members = fleet(2, 9)  # three zones of three hosts per region
    found = links(members, Policy(kind="hierarchical", scope="zone", representatives=1))
    zone = {m.name: m.zone for m in members}
    assert {p for p in found if zone[p[0]] == zone[p[1]]} == {
        (a.name, b.name) for a, b in combinations(members, 2) if a.zone == b.zone
    }
    assert len(found) == 2 * 3 * 3 + 2 * 3 + 1  # in-zone meshes, zone pairs of each region, the region pair


def test_bad_member_lists_are_named() -> None:
    members = fleet(2, 3)
    with pytest.raises(MeshError, match="names used twice: r00-h000"):
        links([*members, members[0]], Policy())
    with pytest.raises(MeshError, match="4 is more than the hosts of region"):
        links(members, Policy(kind="hierarchical", scope="region", representatives=4))
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        Policy(kind="hierarchical", representatives=0)


@pytest.mark.parametrize("regions,per_region", [(1, 8), (3, 5), (5, 10)])
def test_a_rotation_needs_between_the_largest_degree_and_twice_it(regions: int, per_region: int) -> None:
    found = links(fleet(regions, per_region), HIER)
    degree: dict[str, int] = {}
    for a, b in found:
        degree[a], degree[b] = degree.get(a, 0) + 1, degree.get(b, 0) + 1
    rotation = rounds(found)
    assert max(degree.values()) <= len(rotation) <= 2 * max(degree.values()) - 1
    assert sorted(p for r in rotation for p in r) == sorted(found)  # every link once
    for r in rotation:  # no host in two tests at once
        hosts = [h for pair in r for h in pair]
        assert len(hosts) == len(set(hosts))


@pytest.mark.parametrize("seed", range(40))
def test_a_hosts_peers_are_its_pairs_of_the_whole_mesh(seed: int) -> None:
    """`peers` finds one host's links without building every host's: it must name the same."""
    rng = random.Random(seed)
    members = [Member(f"h{i:02d}", f"r{rng.randrange(4)}", f"z{rng.randrange(3)}") for i in range(rng.randint(2, 40))]
    for policy in (Policy(), Policy(kind="hierarchical", scope=rng.choice(["region", "zone"]), representatives=2)):
        with contextlib.suppress(MeshError):  # a region smaller than `representatives`
            every = links(members, policy)
            for m in members:
                assert peers(members, m.name, policy) == sorted(
                    b if a == m.name else a for a, b in every if m.name in (a, b)
                ), (policy, m)


def greedy_in_sorted_order(pairs: set[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The colouring as first written (each pair in plain sorted order takes the lowest round free
    at both ends): every version must give it, or a fleet mid-upgrade disagrees on its schedule."""
    out: list[list[tuple[str, str]]] = []
    for a, b in sorted(pairs):
        k = next(k for k, r in enumerate([*out, []]) if not {a, b} & {h for pair in r for h in pair})
        if k == len(out):
            out.append([])
        out[k].append((a, b))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_the_rounds_are_the_greedy_colouring_in_sorted_order(seed: int) -> None:
    # Names whose order as strings is not their order as numbers or lengths.
    rng = random.Random(seed)
    members = [
        Member(rng.choice(["h", "h-", "H", "x"]) + str(rng.randrange(200)), f"r{rng.randrange(3)}")
        for _ in range(rng.randint(3, 60))
    ]
    members = list({m.name: m for m in members}.values())
    for policy in (Policy(), Policy(kind="hierarchical", representatives=1)):
        found = links(members, policy)
        assert [list(r) for r in rounds(found)] == greedy_in_sorted_order(found)
