"""The instance-type table from AWS's own data (DescribeInstanceTypes): parsing, bad input,
the atomic write, `pathprobe limits import` (files, moto's snapshot, the live API against
moto's real HTTP server) and `pathprobe limits show`."""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopback_mesh import unused_port

from pathprobe import instance_types
from pathprobe.commands import limits as limits_command

# Two entries in the API's own shape (trimmed to the fields pathprobe reads and a few more).
C6GN_MEDIUM: dict[str, Any] = {
    "InstanceType": "c6gn.medium",
    "CurrentGeneration": True,
    "VCpuInfo": {"DefaultVCpus": 1, "DefaultCores": 1},
    "NetworkInfo": {
        "NetworkPerformance": "Up to 16 Gigabit",
        "MaximumNetworkCards": 1,
        "DefaultNetworkCardIndex": 0,
        "NetworkCards": [
            {
                "NetworkCardIndex": 0,
                "NetworkPerformance": "Up to 16 Gigabit",
                "MaximumNetworkInterfaces": 2,
                "BaselineBandwidthInGbps": 1.6,
                "PeakBandwidthInGbps": 16.0,
            }
        ],
        "EnaSupport": "required",
    },
}
C6IN_32XLARGE: dict[str, Any] = {
    "InstanceType": "c6in.32xlarge",
    "VCpuInfo": {"DefaultVCpus": 128},
    "NetworkInfo": {
        "NetworkPerformance": "200 Gigabit",
        "DefaultNetworkCardIndex": 0,
        "NetworkCards": [
            {"NetworkCardIndex": i, "BaselineBandwidthInGbps": 200.0, "PeakBandwidthInGbps": 200.0} for i in (0, 1)
        ],
        "EnaSupport": "required",
    },
}


def response(*items: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    page: dict[str, Any] = {"InstanceTypes": list(items)}
    if token:
        page["NextToken"] = token
    return page


def run(*argv: str) -> int:
    p = argparse.ArgumentParser()
    limits_command.add_parser(p.add_subparsers())
    args = p.parse_args(["limits", *argv])
    return int(args.func(args))


# --- parsing -----------------------------------------------------------------------


def test_an_api_response_gives_baseline_peak_vcpus_cards_and_ena() -> None:
    types = instance_types.parse([("f", response(C6GN_MEDIUM, C6IN_32XLARGE))])
    m = types["c6gn.medium"]
    assert (m.vcpus, m.ena, m.performance, m.burst) == (1, "required", "Up to 16 Gigabit", True)
    assert (m.baseline_bits_per_second, m.peak_bits_per_second) == (1.6e9, 16e9)
    big = types["c6in.32xlarge"]
    assert (len(big.cards), big.baseline_bits_per_second, big.total_peak_bits_per_second) == (2, 200e9, 400e9)
    assert not big.burst


def test_pages_lists_and_concatenated_documents(tmp_path: Path) -> None:
    # Several pages saved in one file one after the other, a list of pages, and a bare list.
    one = tmp_path / "pages.json"
    one.write_text(json.dumps(response(C6GN_MEDIUM, token="t")) + "\n" + json.dumps(response(C6IN_32XLARGE)))
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([response(C6GN_MEDIUM), response(C6IN_32XLARGE)]))
    bare = tmp_path / "bare.json.gz"
    bare.write_bytes(gzip.compress(json.dumps([C6GN_MEDIUM, C6IN_32XLARGE]).encode()))
    for path in (one, listed, bare):
        assert set(instance_types.from_files([path])) == {"c6gn.medium", "c6in.32xlarge"}, path
    # Two files, one page each.
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(response(C6GN_MEDIUM)))
    b.write_text(json.dumps(response(C6IN_32XLARGE)))
    assert len(instance_types.from_files([a, b])) == 2


def test_moto_snapshot_is_a_dict_keyed_by_type_in_the_api_shape() -> None:
    path, version = instance_types.moto_snapshot()
    raw = json.loads(gzip.decompress(path.read_bytes()))
    assert isinstance(raw, dict) and raw["m7i.large"]["InstanceType"] == "m7i.large"
    types = instance_types.from_files([path])
    assert len(types) > 1000 and version
    assert (types["m7i.large"].card.baseline_gbps, types["m7i.large"].card.peak_gbps) == (0.781, 12.5)


def broken(change: Any) -> dict[str, Any]:
    item = copy.deepcopy(C6GN_MEDIUM)
    change(item)
    return response(item)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            broken(lambda i: i["NetworkInfo"].pop("NetworkCards")),
            "instance type c6gn.medium: NetworkInfo.NetworkCards: missing (no network card data)",
        ),
        (
            broken(lambda i: i["NetworkInfo"].update(NetworkCards=[])),
            "instance type c6gn.medium: NetworkInfo.NetworkCards: missing (no network card data)",
        ),
        (broken(lambda i: i.pop("NetworkInfo")), "instance type c6gn.medium: NetworkInfo: missing"),
        (
            broken(lambda i: i["NetworkInfo"]["NetworkCards"][0].pop("BaselineBandwidthInGbps")),
            "instance type c6gn.medium: NetworkInfo.NetworkCards[0].BaselineBandwidthInGbps: missing",
        ),
        (
            broken(lambda i: i["NetworkInfo"]["NetworkCards"][0].update(PeakBandwidthInGbps="fast")),
            "instance type c6gn.medium: NetworkInfo.NetworkCards[0].PeakBandwidthInGbps: not a positive number: 'fast'",
        ),
        (
            broken(lambda i: i["NetworkInfo"]["NetworkCards"][0].update(PeakBandwidthInGbps=1.0)),
            "instance type c6gn.medium: NetworkInfo.NetworkCards[0].PeakBandwidthInGbps: 1 is below the baseline 1.6",
        ),
        (broken(lambda i: i.pop("VCpuInfo")), "instance type c6gn.medium: VCpuInfo.DefaultVCpus: missing"),
        (
            broken(lambda i: i["VCpuInfo"].update(DefaultVCpus=True)),
            "instance type c6gn.medium: VCpuInfo.DefaultVCpus: not a positive integer: True",
        ),
        (
            broken(lambda i: i["NetworkInfo"].update(DefaultNetworkCardIndex=3)),
            "instance type c6gn.medium: NetworkInfo.DefaultNetworkCardIndex: 3 names no card",
        ),
        (broken(lambda i: i.pop("InstanceType")), "f: InstanceTypes[0]: InstanceType: missing"),
        ({"Reservations": []}, "f: not a DescribeInstanceTypes response"),
        ({"InstanceTypes": {}}, "f: InstanceTypes: not a list"),
        ({"InstanceTypes": []}, "no instance types in the input"),
    ],
)
def test_bad_input_names_the_type_and_the_field(doc: Any, message: str) -> None:
    with pytest.raises(instance_types.InstanceDataError) as e:
        instance_types.parse([("f", doc)])
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"InstanceTypes": [', "not JSON: Expecting value (line 1, column 20)"),
        (b"", "empty"),
        (b"\x1f\x8bnot gzip", "not a valid gzip file"),
        (b"\xff\xfe{}", "not UTF-8 text"),
    ],
)
def test_malformed_files_are_named(tmp_path: Path, raw: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(raw)
    with pytest.raises(instance_types.InstanceDataError) as e:
        instance_types.from_files([path])
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)


# --- the table ----------------------------------------------------------------------


def test_the_packaged_table_is_dated_sourced_and_complete() -> None:
    t = instance_types.load()
    assert t.source.startswith("the DescribeInstanceTypes snapshot in moto ")
    assert t.as_of.isoformat() == "2026-10-27" and t.generated >= t.as_of
    assert len(t.types) == 1395
    figures = {
        n: (t.types[n].card.baseline_gbps, t.types[n].card.peak_gbps)
        for n in (
            "c6gn.medium",
            "m7i.large",
            "m5.large",
            "t3.micro",
            "c5n.large",
            "c6gn.12xlarge",
            "m6i.metal",
            "c7gn.16xlarge",
        )
    }
    assert figures == {
        "c6gn.medium": (1.6, 16),
        "m7i.large": (0.781, 12.5),
        "m5.large": (0.75, 10),
        "t3.micro": (0.064, 5),
        "c5n.large": (3.0, 25),
        "c6gn.12xlarge": (75, 75),
        "m6i.metal": (50, 50),
        "c7gn.16xlarge": (200, 200),
    }
    assert len(t.types["p5.48xlarge"].cards) == 32


def test_the_packaged_table_is_what_import_writes_from_the_same_snapshot(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert run("import", "--moto", "--as-of", "2026-10-27", "--out", str(out)) == 0
    shipped = instance_types.load()
    again = instance_types.read(out)
    assert again.types == shipped.types and (again.source, again.as_of) == (shipped.source, shipped.as_of)


def test_table_round_trips_and_a_broken_table_is_named(tmp_path: Path) -> None:
    types = instance_types.parse([("f", response(C6GN_MEDIUM, C6IN_32XLARGE))])
    t = instance_types.Table(source="test", as_of="2026-01-02", generated="2026-01-03", types=types)
    path = tmp_path / "t.json"
    instance_types.write(t, path)
    text = path.read_text()
    assert text.count("\n") == len(types) + 8  # one type per line
    assert instance_types.read(path) == t
    path.write_text(text.replace('"vcpus": 1,', '"vcpus": 0,'))
    with pytest.raises(instance_types.InstanceDataError, match=r"types\.c6gn\.medium\.vcpus"):
        instance_types.read(path)


# --- pathprobe limits import / show -------------------------------------------------


def test_import_writes_a_dated_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "describe.json", tmp_path / "out.json"
    src.write_text(json.dumps(response(C6GN_MEDIUM, C6IN_32XLARGE)))
    assert run("import", str(src), "--out", str(out), "--as-of", "2026-11-01") == 0
    t = instance_types.read(out)
    assert (len(t.types), t.as_of.isoformat()) == (2, "2026-11-01")
    assert t.source == "EC2 DescribeInstanceTypes output: describe.json"
    assert f"{out}: 2 instance types (1 with a burst above the baseline)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        (
            json.dumps(broken(lambda i: i["NetworkInfo"].pop("NetworkCards"))),
            "instance type c6gn.medium: NetworkInfo.NetworkCards: missing (no network card data)",
        ),
    ],
)
def test_bad_input_exits_2_and_leaves_the_previous_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    good, bad, out = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "out.json"
    good.write_text(json.dumps(response(C6GN_MEDIUM)))
    assert run("import", str(good), "--out", str(out)) == 0
    before = out.read_bytes()
    bad.write_text(content)
    assert run("import", str(bad), "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pathprobe limits: {bad}: ") and message in err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "good.json", "out.json"]  # no temp file left


def test_import_needs_exactly_one_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("import") == 2
    assert run("import", "--moto", "--live") == 2
    assert run("import", "--moto", "--region", "us-east-1") == 2
    assert "give FILE..., or --moto, or --live" in capsys.readouterr().err


def test_show_prints_each_figure_with_source_and_date(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("show", "c6gn.medium") == 0
    out = capsys.readouterr().out
    assert out.startswith("c6gn.medium: 1 vCPUs, 1 network card(s), ENA required")
    assert "baseline" in out and "1.6 Gbit/s" in out and "16 Gbit/s" in out
    assert "BaselineBandwidthInGbps" in out and "(date: 2026-10-27)" in out
    assert "ec2-instance-network-bandwidth.html" in out and "(date: 2024-05-15)" in out
    assert run("show", "m7i.large", "--json") == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["baseline_bits_per_second"], d["peak_bits_per_second"]) == (0.781e9, 12.5e9)
    assert d["figures"]["baseline_bits_per_second"]["date"] == "2026-10-27"


def test_show_an_unknown_type_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("show", "m9z.huge") == 2
    assert capsys.readouterr().err.startswith("pathprobe limits: unknown instance type m9z.huge")


def test_show_reads_another_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "describe.json", tmp_path / "out.json"
    src.write_text(json.dumps(response(C6GN_MEDIUM)))
    assert run("import", str(src), "--out", str(out)) == 0
    assert run("show", "c6in.32xlarge", "--table", str(out)) == 2
    assert run("show", "c6gn.medium", "--table", str(out), "--json") == 0


# --- the live API, against moto's own HTTP server -----------------------------------


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    assert exe is not None, "moto_server is not installed (it is in the dev extra: pip install -e 'exporter[dev]')"
    port = unused_port()
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def fake_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")


@pytest.mark.usefixtures("fake_credentials")
def test_live_import_against_moto_server(moto_server: str, tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    assert run("import", "--live", "--region", "ap-northeast-1", "--endpoint-url", moto_server, "--out", str(out)) == 0
    t = instance_types.read(out)
    assert t.source == "EC2 DescribeInstanceTypes, live API, region ap-northeast-1"
    assert len(t.types) > 1000
    m = t.types["c6gn.medium"]
    assert (m.vcpus, m.card.baseline_gbps, m.card.peak_gbps) == (1, 1.6, 16.0)


@pytest.mark.usefixtures("fake_credentials")
def test_live_import_failure_exits_1_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "live.json"
    dead = f"http://127.0.0.1:{unused_port()}"
    assert run("import", "--live", "--region", "us-east-1", "--endpoint-url", dead, "--out", str(out)) == 1
    assert "DescribeInstanceTypes in us-east-1" in capsys.readouterr().err
    assert not out.exists()
