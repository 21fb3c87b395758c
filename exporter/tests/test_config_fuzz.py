"""Config loader fuzzing: whatever the file holds, loading gives a Config or a
ConfigError, never another exception. Bounded: a fixed number of examples, no deadline flakiness."""

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pathprobe import config
from pathprobe.yamlfile import ConfigError

FUZZ = settings(
    max_examples=300,
    deadline=None,  # wall-clock per example varies on a busy machine; the total is bounded by max_examples
    derandomize=True,  # the same examples every run: a failure here is a bug, not bad luck
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

VALID: dict[str, Any] = {
    "host": {"name": "a", "address": "198.18.1.2", "region": "r1"},
    "peers": [{"name": "b", "address": "198.18.2.2", "region": "r2", "path_class": "inter_region"}],
    "probes": {"throughput": {"udp_bitrate": "100M", "window_bytes": "4Mi", "streams": [1, 8]}},
    "schedule": {"slot_seconds": 120},
    "budget": {"daily_bytes": "20GB", "state_file": "/tmp/b.json"},
    "web": {"listen": "0.0.0.0:9469"},
}

# Paths of the valid config where a value may be replaced by anything.
FIELDS = [
    ("host",),
    ("host", "name"),
    ("host", "address"),
    ("peers",),
    ("peers", 0),
    ("peers", 0, "address"),
    ("peers", 0, "name"),
    ("peers", 0, "throughput"),
    ("peers", 0, "limits"),
    ("peers", 0, "iperf3_port"),
    ("probes", "throughput", "udp_bitrate"),
    ("probes", "throughput", "window_bytes"),
    ("probes", "throughput", "streams"),
    ("schedule", "slot_seconds"),
    ("budget", "daily_bytes"),
    ("budget", "state_file"),
    ("web", "listen"),
    ("web",),
    ("probes",),
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["500M", "1e999", "-1", "4Mi", "0x10", ".inf", "::ffff:198.18.2.2", "198.18.2.2", "1:99999"]),
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)


def load(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    try:
        config.load(path)
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)


@FUZZ
@given(data=st.binary(max_size=512))
def test_any_bytes(tmp_path: Path, data: bytes) -> None:
    load(tmp_path, data)


yaml_fragments = st.sampled_from(
    [
        "host:",
        " name: a",
        "  - ",
        "peers:",
        "[",
        "]",
        "{",
        "}",
        ": ",
        "&a ",
        "*a",
        "&b ",
        "*b",
        "<<: ",
        ", ",
        "!!str ",
        "!!binary ",
        "---",
        "...",
        "? ",
        "'",
        '"',
        "\\x00",
        "\t",
        "\n",
        "#",
        "%YAML 1.1\n",
        "!x ",
        "1e999",
        ".nan",
        "~",
        "\ufeff",
    ]
)


@FUZZ
@given(parts=st.lists(st.one_of(yaml_fragments, st.text(max_size=8)), max_size=40))
def test_any_yaml_like_text(tmp_path: Path, parts: list[str]) -> None:
    load(tmp_path, "".join(parts).encode("utf-8", "surrogatepass"))


@FUZZ
@given(value=values)
def test_any_yaml_document(tmp_path: Path, value: Any) -> None:
    load(tmp_path, yaml.safe_dump(value, allow_unicode=True).encode("utf-8", "surrogatepass"))


@FUZZ
@given(field=st.sampled_from(FIELDS), value=values)
def test_any_value_in_any_field(tmp_path: Path, field: tuple[str | int, ...], value: Any) -> None:
    data = yaml.safe_load(yaml.safe_dump(VALID))
    target = data
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    load(tmp_path, yaml.safe_dump(data, allow_unicode=True).encode("utf-8", "surrogatepass"))


def test_the_valid_base_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(VALID))
    assert config.load(path).budget.daily_bytes == 20 * 10**9


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 1000])
def test_nesting_at_the_bound(tmp_path: Path, n: int) -> None:
    load(tmp_path, b"a: " + b"[" * n + b"]" * n + b"\n")
