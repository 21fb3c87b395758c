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
