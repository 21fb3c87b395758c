"""ENA allowance counters from recorded `ethtool -S` outputs (the ENA layout is the one AWS
documents in "Monitor network performance for ENA settings on your EC2 instance"; the
veth one was recorded in the lab)."""

from pathlib import Path

from pathprobe import ena

FIXTURES = Path(__file__).parent / "fixtures"


def test_the_allowance_counters_are_read_and_nothing_else() -> None:
    counters = ena.parse((FIXTURES / "ethtool-S-ena.txt").read_text())
    assert counters == {
        "bw_in_allowance_exceeded": 0,
        "bw_out_allowance_exceeded": 1278,
        "pps_allowance_exceeded": 0,
        "conntrack_allowance_exceeded": 0,
        "linklocal_allowance_exceeded": 0,
    }


def test_a_driver_without_them_is_absent_not_zero() -> None:
    assert ena.parse((FIXTURES / "ethtool-S-veth.txt").read_text()) is None
    assert ena.parse("") is None


def test_what_rose_during_a_test_is_named_as_the_instance_not_the_path() -> None:
    before = ena.parse((FIXTURES / "ethtool-S-ena.txt").read_text())
    after = dict(before or {}, bw_out_allowance_exceeded=1500, pps_allowance_exceeded=3)
    rises = ena.rose(before, after)
    assert rises == {"bw_out_allowance_exceeded": 222, "pps_allowance_exceeded": 3}
    assert ena.explain(rises).startswith("the instance's allowance, not the path: bw_out_allowance_exceeded rose")
    assert ena.rose(None, after) == {} and ena.rose(before, before) == {}


def test_the_default_route_interface(tmp_path: Path) -> None:
    table = tmp_path / "route"
    table.write_text(
        "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
        "ens5\t0012A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "ens5\t00000000\t0112A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
    )
    assert ena.default_interface(table) == "ens5"
    assert ena.default_interface(tmp_path / "missing") is None


def test_ena_express_counters_are_read_beside_the_allowances() -> None:
    # The ENA layout above with the ENA Express lines that "Monitor ENA Express settings on your EC2
    # instance" (Amazon EC2 User Guide) names, as ethtool -S prints them on an instance with it on.
    counters = ena.parse((FIXTURES / "ethtool-S-ena-express.txt").read_text())
    assert counters is not None
    assert {k: counters[k] for k in ena.EXPRESS} == {
        "ena_srd_mode": 1,
        "ena_srd_tx_pkts": 1825211,
        "ena_srd_eligible_tx_pkts": 1825304,
        "ena_srd_rx_pkts": 1617739,
        "ena_srd_resource_utilization": 3,
    }
    assert ena.rose(counters, dict(counters, ena_srd_tx_pkts=2_000_000)) == {}  # not an allowance


def test_srd_falling_back_is_a_share_below_one() -> None:
    before = ena.parse((FIXTURES / "ethtool-S-ena-express.txt").read_text())
    assert before is not None
    on_srd = dict(
        before,
        ena_srd_tx_pkts=before["ena_srd_tx_pkts"] + 1000,
        ena_srd_eligible_tx_pkts=before["ena_srd_eligible_tx_pkts"] + 1000,
    )
    fell_back = dict(before, ena_srd_eligible_tx_pkts=before["ena_srd_eligible_tx_pkts"] + 1000)
    assert ena.srd_share(before, on_srd) == 1.0 and ena.srd_share(before, fell_back) == 0.0
    assert ena.srd_share(before, before) is None  # nothing eligible went out
    plain = ena.parse((FIXTURES / "ethtool-S-ena.txt").read_text())
    assert ena.srd_share(plain, plain) is None


def test_metrics_show_ena_express_beside_the_allowances(tmp_path: Path) -> None:
    from test_collector import config, samples, value

    from pathprobe.exporter import Exporter

    e = Exporter(config(tmp_path))
    e.rooms.host.read_allowances("ens5", ena.parse((FIXTURES / "ethtool-S-ena-express.txt").read_text()))
    got = samples(e)
    assert value(got, "pathprobe_ena_srd_mode", interface="ens5") == 1
    assert value(got, "pathprobe_ena_srd_eligible_tx_packets_total", interface="ens5") == 1825304
    assert value(got, "pathprobe_ena_srd_resource_utilization_ratio", interface="ens5") == 0.03
    assert value(got, "pathprobe_ena_allowance_exceeded_total", counter="bw_out_allowance_exceeded") == 1278
    assert not [
        n for n, labels in got if n == "pathprobe_ena_allowance_exceeded_total" and "srd" in dict(labels)["counter"]
    ]
    e.rooms.host.read_allowances("ens5", ena.parse((FIXTURES / "ethtool-S-ena.txt").read_text()))
    assert not [n for n, _ in samples(e) if n.startswith("pathprobe_ena_srd")]  # absent, not zero, without ENA Express
