"""Config validation: every error names file:line and the field path."""

import subprocess
import sys
from pathlib import Path

import pytest

from pathprobe import config
from pathprobe.yamlfile import ConfigError

EXAMPLE = Path(__file__).parents[1] / "examples" / "pathprobe.yaml"

MINIMAL = """\
host: {name: a, address: 198.18.1.2, region: r1}
peers:
  - {name: b, address: 198.18.2.2, region: r2, path_class: inter_region}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "pathprobe.yaml"
    p.write_text(text)
    return p


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text))
    return info.value.problems


def test_shipped_example_is_valid() -> None:
    cfg = config.load(EXAMPLE)
    assert cfg.host.name == "tokyo-a"
    assert cfg.throughput_for(cfg.peers[1]).streams == [1, 8]


def test_minimal_config_gets_defaults(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, MINIMAL))
    assert cfg.iperf3.port == 5201
    assert cfg.probes.rtt.interval_seconds == 0.1
    assert cfg.budget.daily_bytes == 50 * 10**9


def test_every_error_is_listed_with_line_and_path(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """\
host:
  name: a
  address: 1.2.3
  region: r
  colour: blue
peers:
  - name: b
    address: 198.18.2.2
    region: r
    path_class: sideways
probes:
  rtt: {interval_seconds: -1}
""",
    )
    path = tmp_path / "pathprobe.yaml"
    assert f"{path}:3: host.address: value is not a valid IPv4 or IPv6 address" in found
    assert f"{path}:5: host.colour: Extra inputs are not permitted" in found
    assert any(p.startswith(f"{path}:10: peers.0.path_class:") for p in found)
    assert any(p.startswith(f"{path}:12: probes.rtt.interval_seconds:") for p in found)
    assert len(found) == 4


def test_missing_field_points_at_its_parent(tmp_path: Path) -> None:
    found = problems(tmp_path, "host: {name: a, region: r}\npeers: []\n")
    assert any(":1: host.address: Field required" in p for p in found)
    assert any(":2: peers: List should have at least 1 item" in p for p in found)


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    found = problems(tmp_path, "host:\n  name: a\n  address: [\n")
    assert len(found) == 1 and ":4: YAML syntax" in found[0]


def test_duplicate_names_and_addresses(tmp_path: Path) -> None:
    found = problems(tmp_path, MINIMAL + "  - {name: b, address: 198.18.1.2, region: r3, path_class: inter_region}\n")
    assert "repeated: b" in found[0]


def test_slot_too_short_for_the_tests_says_what_to_set(tmp_path: Path) -> None:
    found = problems(tmp_path, MINIMAL + "schedule: {slot_seconds: 10}\n")
    assert "set slot_seconds >= 48" in found[0]


def test_rates_and_sizes_accept_units(tmp_path: Path) -> None:
    cfg = config.load(
        write(
            tmp_path,
            MINIMAL + "probes: {throughput: {udp_bitrate: 2.5G, window_bytes: 4Mi}}\nbudget: {daily_bytes: 20GB}\n",
        )
    )
    assert cfg.probes.throughput.udp_bitrate == 2.5e9
    assert cfg.probes.throughput.window_bytes == 4 * 2**20
    assert cfg.budget.daily_bytes == 20 * 10**9


def test_check_config_command_exits_2_listing_errors(tmp_path: Path) -> None:
    bad = write(tmp_path, "host: {name: a}\npeers: []\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pathprobe", "check-config", str(bad)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert "host.address: Field required" in proc.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "pathprobe", "check-config", str(EXAMPLE)], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0, ok.stderr


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(tmp_path / "missing.yaml")
