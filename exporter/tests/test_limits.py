"""Expected throughput: the smallest applicable limit, and which one binds."""

import pytest

from pathprobe.config import Peer
from pathprobe.limits import buffer_bound, expected, table, window_share

KERNEL_6_1 = 0.5  # the source article's kernel: tcp_adv_win_scale=1


def peer(path_class: str = "inter_region", instance: str = "c6gn.medium", **limits: object) -> Peer:
    return Peer.model_validate(
        {
            "name": "p",
            "address": "198.18.2.2",
            "region": "r",
            "path_class": path_class,
            "instance_type": instance,
            "limits": limits,
        }
    )


def test_a_default_buffer_flow_between_tokyo_and_osaka_is_window_bound() -> None:
    # [DIO-TOKYO-OSAKA] (docs/SOURCES.md): tcp_rmem max 6291456 at 8 ms allows about 3.1 Gbps.
    e = expected(peer(instance="c6gn.12xlarge"), "c6gn.12xlarge", "tcp", 1, 6291456, 0.008, share=KERNEL_6_1)
    assert e.limit == "receive_window"
    assert e.bits_per_second == pytest.approx(3.15e9, rel=0.01)
    assert e.candidates["per_flow"] == 5e9


def test_tuned_buffers_reach_the_per_flow_limit() -> None:
    e = expected(peer(instance="c6gn.12xlarge"), "c6gn.12xlarge", "tcp", 1, 32 * 2**20, 0.008)
    assert (e.limit, e.bits_per_second) == ("per_flow", 5e9)


def test_many_flows_inter_region_hit_the_region_cap() -> None:
    # 48 vCPUs >= 32: 50% of 75 Gbps.
    e = expected(peer(instance="c6gn.12xlarge"), "c6gn.12xlarge", "tcp", 64, 32 * 2**20, 0.008)
    assert (e.limit, e.bits_per_second) == ("region_cap", 37.5e9)


def test_small_instance_inter_region_is_capped_at_5_gbps() -> None:
    e = expected(peer(), "c6gn.medium", "tcp", 8, 32 * 2**20, 0.008)
    assert (e.limit, e.bits_per_second) == ("region_cap", 5e9)


def test_intra_region_uses_the_full_instance_bandwidth() -> None:
    e = expected(peer("intra_region"), "c6gn.medium", "tcp", 8, 32 * 2**20, 0.0005)
    assert (e.limit, e.bits_per_second) == ("instance", 16e9)


def test_transit_gateway_limit_and_lab_scale() -> None:
    e = expected(peer("transit_gateway", "c6in.32xlarge"), "c6in.32xlarge", "tcp", 64, None, None, scale=10)
    assert (e.limit, e.bits_per_second) == ("transit_gateway", 10e9)


def test_overrides_win() -> None:
    assert expected(peer(expected_bits_per_second="2G"), "", "tcp", 1, None, None).limit == "override"
    e = expected(peer(placement="cluster", instance="m6i.metal"), "m6i.metal", "tcp", 1, None, None)
    assert (e.limit, e.bits_per_second) == ("per_flow", 10e9)


def test_udp_is_bound_by_its_target_rate() -> None:
    e = expected(peer(), "c6gn.medium", "udp", 1, None, None, udp_target=100e6)
    assert (e.limit, e.bits_per_second) == ("target_rate", 100e6)


def test_table_rows_are_sourced() -> None:
    t = table()
    assert t.transit_gateway.gbps == 100
    assert {h.gbps for h in t.transit_gateway.history} == {50, 100}
    for name in (
        "c5n.large",
        "c6gn.medium",
        "c6in.large",
        "c7gn.medium",
        "m5.large",
        "m6i.large",
        "m7i.large",
        "r6i.large",
        "c6gn.12xlarge",
        "m6i.metal",
    ):
        assert name in t.instance_types
    for row in t.instance_types.values():
        assert row.source or not row.checked


def test_buffer_bound_matches_a_fixed_window_at_every_delay() -> None:
    # About 2.9 MB in flight at every delay: 10 ms -> 2.33 Gbps in [BLOG-RTT] (docs/SOURCES.md).
    assert buffer_bound(int(2.912e6 / 0.5), 0.010, 1, 0.5) == pytest.approx(2.33e9, rel=0.01)


def test_send_buffer_binds_when_smaller_than_the_receive_window() -> None:
    # The lab's Tokyo -> Singapore: receiver 6 MiB, sender 4 MiB, 75 ms, kernel 6.18 (share 0.78):
    # measured 347 Mbit/s for one flow.
    e = expected(peer(), "c6gn.medium", "tcp", 1, 6291456, 0.075, scale=10, sender_wmem_max=4194304, share=0.78)
    assert e.limit == "send_buffer"
    assert e.bits_per_second == pytest.approx(347e6, rel=0.02)


@pytest.mark.parametrize(("release", "adv", "share"), [
    ("6.1.55-75.123.amzn2023.x86_64", 1, 0.5), ("5.10.0", 2, 0.75), ("4.19.0", -2, 0.25), ("6.18.44-fc", 1, 0.78),
])  # fmt: skip
def test_window_share_follows_the_kernel(release: str, adv: int, share: float) -> None:
    assert window_share(release, adv) == share
