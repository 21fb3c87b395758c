"""Expected throughput: the smallest applicable limit, and which one binds; the floor
(instance baselines) and the peak (instance peaks)."""

import datetime as dt

import pytest

from pathprobe import instance_types
from pathprobe.config import Config, Peer
from pathprobe.limits import Expected, buffer_bound, describe, expected, table, unknown_instance_types, window_share

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


def test_small_instance_inter_region_floor_is_its_baseline_and_peak_the_5_gbps_cap() -> None:
    # c6gn.medium: 1.6 Gbps baseline, 16 peak, 1 vCPU (< 32: inter-region 5 Gbps).
    e = expected(peer(), "c6gn.medium", "tcp", 8, 32 * 2**20, 0.008)
    assert (e.limit, e.bits_per_second) == ("instance", 1.6e9)
    assert (e.peak_limit, e.peak_bits_per_second) == ("region_cap", 5e9)
    assert e.candidates["region_cap"] == e.peak_candidates["region_cap"] == 5e9


def test_intra_region_floor_is_the_baseline_and_peak_the_burst() -> None:
    # A healthy instance whose credits are spent still reaches its baseline: the floor;
    # 4 streams reaching 11.7 Gbps (the article's burst) is within the peak.
    e = expected(peer("intra_region"), "c6gn.medium", "tcp", 8, 32 * 2**20, 0.0005)
    assert (e.limit, e.bits_per_second, e.floor_bits_per_second) == ("instance", 1.6e9, 1.6e9)
    assert (e.peak_limit, e.peak_bits_per_second) == ("instance", 16e9)
    m7i = expected(peer("intra_region", "m7i.large"), "m7i.large", "tcp", 8, 32 * 2**20, 0.0005)
    assert (m7i.bits_per_second, m7i.peak_bits_per_second) == (0.781e9, 12.5e9)


def test_the_smaller_end_binds() -> None:
    e = expected(peer("intra_region", "m7i.large"), "c6gn.12xlarge", "tcp", 64, None, None)
    assert (e.limit, e.bits_per_second, e.peak_bits_per_second) == ("instance", 0.781e9, 12.5e9)


def test_fixed_bandwidth_instances_have_floor_equal_to_peak() -> None:
    e = expected(peer(instance="c6gn.12xlarge"), "c6gn.12xlarge", "tcp", 64, 32 * 2**20, 0.008)
    assert e.bits_per_second == e.peak_bits_per_second == 37.5e9
    assert e.limit == e.peak_limit == "region_cap"


def test_the_floor_is_never_above_the_peak() -> None:
    types = instance_types.load()
    for name in ("t3.micro", "m5.large", "c5n.large", "c7i-flex.8xlarge", "p5.48xlarge", "c6in.32xlarge"):
        for path_class in ("intra_region", "inter_region", "transit_gateway"):
            e = expected(peer(path_class, name), name, "tcp", 16, None, None, types=types)
            assert e.bits_per_second <= e.peak_bits_per_second, (name, path_class)


def test_unknown_instance_types_are_named_not_guessed() -> None:
    e = expected(peer("intra_region", "m9z.huge"), "c6gn.medium", "tcp", 8, None, None)
    assert e.unknown_instance_types == ("m9z.huge",)
    assert e.candidates["instance"] == 1.6e9  # the known end still counts
    both = expected(peer("intra_region", "m9z.huge"), "m9z.huge", "tcp", 8, None, None)
    assert both.unknown_instance_types == ("m9z.huge",)
    assert "instance" not in both.candidates and both.limit == "per_flow"
    assert expected(peer(instance=""), "", "tcp", 1, None, None).unknown_instance_types == ()


def test_check_config_names_unknown_types_with_their_field() -> None:
    cfg = Config.model_validate(
        {
            "host": {"name": "h", "address": "198.18.1.1", "region": "r", "instance_type": "c6gn.mediun"},
            "peers": [
                {
                    "name": "a",
                    "address": "198.18.2.2",
                    "region": "r",
                    "path_class": "intra_region",
                    "instance_type": "m7i.large",
                },
                {
                    "name": "b",
                    "address": "198.18.2.3",
                    "region": "r",
                    "path_class": "intra_region",
                    "instance_type": "x9.large",
                },
                {"name": "c", "address": "198.18.2.4", "region": "r", "path_class": "intra_region"},
            ],
        }
    )
    problems = unknown_instance_types(cfg)
    assert len(problems) == 2
    assert problems[0].startswith("host.instance_type: unknown instance type 'c6gn.mediun'")
    assert problems[1].startswith("peers.1.instance_type: unknown instance type 'x9.large'")


def test_expected_built_with_three_fields_has_peak_equal_to_floor() -> None:
    e = Expected(2e9, "override", {"override": 2e9})
    assert (e.peak_bits_per_second, e.peak_limit, dict(e.peak_candidates)) == (2e9, "override", {"override": 2e9})


def test_transit_gateway_limit_and_lab_scale() -> None:
    # c6in.32xlarge: two cards of 200 Gbps; one ENI is on one card: 200, not 400.
    e = expected(peer("transit_gateway", "c6in.32xlarge"), "c6in.32xlarge", "tcp", 64, None, None, scale=10)
    assert (e.limit, e.bits_per_second) == ("transit_gateway", 10e9)
    assert e.candidates["instance"] == 20e9


def test_overrides_win() -> None:
    o = expected(peer(expected_bits_per_second="2G"), "", "tcp", 1, None, None)
    assert (o.limit, o.peak_limit, o.bits_per_second, o.peak_bits_per_second) == ("override", "override", 2e9, 2e9)
    i = expected(peer("intra_region", instance_bits_per_second="3G"), "c6gn.medium", "tcp", 8, None, None)
    assert (i.limit, i.bits_per_second, i.peak_bits_per_second) == ("instance", 3e9, 3e9)
    e = expected(peer(placement="cluster", instance="m6i.metal"), "m6i.metal", "tcp", 1, None, None)
    assert (e.limit, e.bits_per_second) == ("per_flow", 10e9)


def test_udp_is_bound_by_its_target_rate() -> None:
    e = expected(peer(), "c6gn.medium", "udp", 1, None, None, udp_target=100e6)
    assert (e.limit, e.bits_per_second) == ("target_rate", 100e6)


def test_every_rule_row_cites_an_aws_page_and_a_date() -> None:
    t = table()
    rows = [*t.per_flow.values(), t.region_cap, *t.transit_gateway.history]
    for row in rows:
        assert row.source.url.startswith("https://docs.aws.amazon.com/")
        assert row.source.title and row.source.read >= dt.date(2024, 1, 1)
    assert {k: r.gbps for k, r in t.per_flow.items()} == {"default": 5, "cluster": 10, "ena_express": 25}
    assert (t.region_cap.share, t.region_cap.min_vcpus, t.region_cap.small_instance_gbps) == (0.5, 32, 5)
    # The two TGW figures disagree; the one used is chosen on purpose and is in the history.
    assert t.transit_gateway.gbps == 100
    assert {h.gbps for h in t.transit_gateway.history} == {50, 100}
    assert t.transit_gateway.source().url.endswith("transit-gateway-quotas.html#bandwidth-quotas")


def test_the_newer_wording_of_the_region_cap_only_raises_large_low_baseline_types() -> None:
    # "or 5 Gbps, whichever is larger": the same figure wherever 50% of the baseline is >= 5 Gbps.
    cap = table().region_cap.model_copy(update={"larger_of_share_and_small": True})
    older = table().region_cap
    differ = [
        name
        for name, e in instance_types.load().types.items()
        if cap.gbps(e.vcpus, e.card.baseline_gbps) != older.gbps(e.vcpus, e.card.baseline_gbps)
    ]
    assert "m7i-flex.8xlarge" in differ and len(differ) == 14  # the count limits.yaml states
    assert older.gbps(32, 6.25) == 3.125 and cap.gbps(32, 6.25) == 5


def test_describe_gives_every_figure_with_source_and_date() -> None:
    d = describe("c6gn.medium")
    assert (d["baseline_bits_per_second"], d["peak_bits_per_second"], d["default_vcpus"]) == (1.6e9, 16e9, 1)
    assert d["burst"] is True and d["ena_support"] == "required"
    for key, fig in d["figures"].items():
        assert key.endswith("_bits_per_second")
        assert fig["source"] and dt.date.fromisoformat(fig["date"])
    assert d["figures"]["inter_region_cap_floor_bits_per_second"]["bits_per_second"] == 5e9
    assert "PeakBandwidthInGbps" in d["figures"]["peak_bits_per_second"]["source"]
    many = describe("p5.48xlarge")
    assert len(many["network_cards"]) == 32 and many["total_peak_bits_per_second"] == 3200e9
    assert many["peak_bits_per_second"] == 100e9
    with pytest.raises(KeyError):
        describe("m9z.huge")


def test_buffer_bound_matches_a_fixed_window_at_every_delay() -> None:
    # About 2.9 MB in flight at every delay: 10 ms -> 2.33 Gbps in [BLOG-RTT] (docs/SOURCES.md).
    assert buffer_bound(int(2.912e6 / 0.5), 0.010, 1, 0.5) == pytest.approx(2.33e9, rel=0.01)


def test_send_buffer_binds_when_smaller_than_the_receive_window() -> None:
    # The lab's Tokyo -> Singapore: receiver 6 MiB, sender 4 MiB, 75 ms, kernel 6.18 (share 0.78):
    # measured 347 Mbit/s for one flow. c6gn.medium's scaled peak (1.6 Gbit/s) leaves the
    # send buffer binding; its scaled baseline (160 Mbit/s) is the floor.
    e = expected(peer(), "c6gn.medium", "tcp", 1, 6291456, 0.075, scale=10, sender_wmem_max=4194304, share=0.78)
    assert e.peak_limit == "send_buffer"
    assert e.peak_bits_per_second == pytest.approx(347e6, rel=0.02)
    assert (e.limit, e.bits_per_second) == ("instance", pytest.approx(160e6))


@pytest.mark.parametrize(
    ("release", "adv", "share"),
    [
        ("6.1.55-75.123.amzn2023.x86_64", 1, 0.5),
        ("5.10.0", 2, 0.75),
        ("4.19.0", -2, 0.25),
        ("6.18.44-fc", 1, 0.78),
    ],
)
def test_window_share_follows_the_kernel(release: str, adv: int, share: float) -> None:
    assert window_share(release, adv) == share
