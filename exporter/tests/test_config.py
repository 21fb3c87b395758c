"""Config validation: every error names file:line and the field path."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cpu import cpu_seconds
from permissions import unreadable

from pathprobe import config, yamlfile
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


@pytest.fixture(scope="module")
def example_load() -> float:
    """CPU seconds to load the shipped example: what this machine's CPU time is worth today."""
    return cpu_seconds(lambda: config.load(EXAMPLE))


def refused_in_time(path: Path, example_load: float) -> list[str]:
    """The problems a file is refused with, having checked the refusal's CPU time: within a
    hundred loads of the shipped example plus twenty reads of the file as text. The files these
    guard against (the billion laughs: 17 s and 2.2 GB; 20,000 digits before an 'x' in a size:
    22 s in the unit's regex) cost thousands of times that; a machine's speed moves both sides."""
    found: list[str] = []

    def refuse() -> None:
        with pytest.raises(ConfigError) as info:
            config.load(path)
        found[:] = info.value.problems

    text_read = cpu_seconds(lambda: path.read_bytes().decode("utf-8", "replace").splitlines())
    assert cpu_seconds(refuse, reps=1) < 100 * example_load + 20 * text_read
    return found


def test_shipped_example_is_valid() -> None:
    cfg = config.load(EXAMPLE)
    assert cfg.host.name == "tokyo-a"
    assert cfg.throughput_for(cfg.peers[1]).streams == [1, 8]


def test_minimal_config_gets_defaults(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, MINIMAL))
    assert cfg.iperf3.port == 5201
    assert cfg.probes.rtt.interval_seconds == 1.0 and cfg.probes.loss.rate_pps == 5
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


# --- files that are not a configuration are a ConfigError (exit 2), never a traceback ---

LAUGHS = "".join([f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)])

# Merge keys through 1,200 anchors, the last one used first (PyYAML's constructor flattened
# them recursively, and refused the chain).
MERGE_CHAIN = "\n".join(
    ["defs:", "  - &a0 {x: 1}", *(f"  - &a{i} {{<<: *a{i - 1}}}" for i in range(1, 1200)), "z: *a1199", ""]
)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00", ":1: not UTF-8 text (byte 0x89)"),
        ("host:\n  name: caf\xe9\n".encode("latin-1"), ":2: not UTF-8 text (byte 0xe9)"),
        (MINIMAL.encode("utf-16"), "is UTF-16"),
        (b"host:\n  name: a\x00b\n", ":2: control character U+0000"),
        (b"host: {name: a\x1b[31m}\n", ":1: control character U+001B"),
        (b"[" * 5000 + b"]" * 5000, ":1: nested deeper than 64 levels"),
        ("".join(" " * i + "a:\n" for i in range(5000)).encode(), ":65: nested deeper than 64 levels"),
        (b"", "empty"),
        (b"# only a comment\n", "empty"),
        (
            ("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + LAUGHS).encode(),
            ":7: more than 1500000 values with aliases expanded",
        ),
        (b"host: *a\n", ":1: alias *a has no anchor before it"),
        (b"host: &a {name: *a}\n", ":1: alias *a inside its own anchor (a recursive structure)"),
        (b"a: {<<: [1, 2]}\n", ":1: YAML: a merge (<<) takes a mapping or a list of mappings"),
        (b"a: {[1]: 2}\n", ":1: a mapping key must be a plain value, not a list or a mapping"),
        (b"a: !!python/object:os.system ls\n", ":1: the tag tag:yaml.org,2002:python/object:os.system is not"),
        ((MINIMAL + "---\nb: 1\n").encode(), ":4: more than one YAML document"),
        ((MINIMAL + "zone: 2024-13-45\n").encode(), ":4: '2024-13-45' is not a valid timestamp"),
        ((MINIMAL + "limits_scale: " + "9" * 5000 + "\n").encode(), ":4: '99999"),
    ],
    ids=[
        "binary",
        "latin1",
        "utf16",
        "nul",
        "escape",
        "deep-flow",
        "deep-block",
        "empty",
        "comment-only",
        "billion-laughs",
        "alias",
        "recursive-alias",
        "merge-of-a-list",
        "list-as-key",
        "python-tag",
        "two-documents",
        "bad-date",
        "5000-digit-int",
    ],
)
def test_unusable_yaml_is_a_config_error_naming_the_line(
    tmp_path: Path, content: bytes, expected: str, example_load: float
) -> None:
    path = tmp_path / "pathprobe.yaml"
    path.write_bytes(content)
    found = refused_in_time(path, example_load)
    assert len(found) == 1
    assert found[0].startswith(str(path)) and expected in found[0]


NOT_A_SIZE = ":4: budget.daily_bytes: size must be a number or a string like '500M', not "


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("budget: {daily_bytes: null}", NOT_A_SIZE + "null"),
        ("budget: {daily_bytes: []}", NOT_A_SIZE + "a list"),
        ("budget: {daily_bytes: {}}", NOT_A_SIZE + "a dict"),
        ("probes: {throughput: {udp_bitrate: null}}", ":4: probes.throughput.udp_bitrate: rate must be a number"),
        ("budget: {daily_bytes: 1e999}", ":4: budget.daily_bytes: size must be a finite number"),
        ("budget: {daily_bytes: .inf}", ":4: budget.daily_bytes: size must be a finite number"),
        ("budget: {daily_bytes: '1e999'}", ":4: budget.daily_bytes: size must be a finite number"),
        ("budget: {daily_bytes: " + "9" * 400 + "}", ":4: budget.daily_bytes: size is too large"),
        ("probes: {throughput: {udp_bitrate: .inf}}", ":4: probes.throughput.udp_bitrate: rate must be a finite"),
        ("probes: {throughput: {udp_bitrate: .nan}}", ":4: probes.throughput.udp_bitrate: rate must be a finite"),
        ("schedule: {slot_seconds: .inf}", ":4: schedule.slot_seconds: Input should be a finite number"),
        ("schedule: {jitter_seconds: .nan}", ":4: schedule.jitter_seconds: Input should be a finite number"),
        ("web: {listen: '0.0.0.0:99999'}", ":4: web.listen: port of '0.0.0.0:99999' is above 65535"),
        ("budget: {daily_bytes: '" + "9" * 20000 + "x'}", ":4: budget.daily_bytes: size: cannot read"),
        ("responders: {rr_max_connections_per_source: 4}", "is below probes.rtt.flows 8"),
    ],
)
def test_bad_values_are_config_errors(tmp_path: Path, extra: str, expected: str, example_load: float) -> None:
    # Each of these once ended in a TypeError or OverflowError traceback, or was accepted.
    found = refused_in_time(write(tmp_path, MINIMAL + extra + "\n"), example_load)
    assert any(expected in p for p in found), found


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {x: 1, y: 2}\nm: {<<: *b, y: 3}\n",  # an explicit key wins
        "m: {y: 3, <<: {x: 1, y: 2}}\n",  # wherever the merge stands
        "a: &a {x: 1}\nb: &b {x: 2, z: 2}\nm: {<<: [*a, *b]}\n",  # the first of a merged list wins
        "m: {<<: {x: 1}, <<: {x: 2, w: 1}}\n",  # of two merge keys, the later wins
        "s: &s [1, {k: v}]\nt: [*s, *s]\nu: {'<<': 1, ~: null, 3: three, 2.5: f, true: t}\n",
        "d: 2024-01-02\nq: '2024-01-02'\nn: [~, null, '', \"\", ! 12, !!str 12, 0x1f, 1_000, .5]\n",
    ],
    ids=["explicit-wins", "merge-last", "merged-list", "two-merges", "keys", "scalars"],
)
def test_values_are_what_pyyaml_constructs(tmp_path: Path, text: str) -> None:
    # Built straight from the parser's events (yamlfile._Builder): the same values as PyYAML's
    # own SafeLoader, merge keys included.
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    got = yamlfile.load(path).data
    assert got == yaml.safe_load(text)
    assert list(got) == list(yaml.safe_load(text))


def test_a_chain_of_merges_loads_in_time(tmp_path: Path, example_load: float) -> None:
    path = tmp_path / "doc.yaml"
    path.write_text(MERGE_CHAIN)
    assert yamlfile.load(path).data["z"] == {"x": 1}
    # 1,200 anchors, each a merge of the one before: within a hundred loads of the shipped example
    # (PyYAML's constructor flattened such chains recursively: its cost grew with the chain's square).
    assert cpu_seconds(lambda: yamlfile.load(path), reps=1) < 100 * example_load


def test_anchors_and_aliases_as_ansible_writes_them(tmp_path: Path) -> None:
    # Ansible's to_nice_yaml writes an anchor for a value two places share.
    text = """\
host: {name: a, address: 198.18.1.2, region: r1}
peers:
  - name: b
    address: 198.18.2.2
    region: r2
    path_class: inter_region
    throughput: &id001
      streams: [1, 4]
  - name: c
    address: 198.18.3.2
    region: r2
    path_class: inter_region
    throughput: *id001
  - <<: {region: r3, path_class: vpc_peering}
    name: d
    address: 198.18.4.2
    throughput: *id001
"""
    cfg = config.load(write(tmp_path, text))
    assert [cfg.throughput_for(p).streams for p in cfg.peers] == [[1, 4]] * 3
    assert cfg.peers[2].region == "r3"
    # an error inside an aliased value names the alias's line
    found = problems(tmp_path, text.replace("streams: [1, 4]", "streams: [1, 400]"))
    assert any(":13: peers.1.throughput.streams.1:" in p for p in found), found


def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    # Regression: YAML's last key won silently (here: the host renamed).
    found = problems(tmp_path, MINIMAL + "host: {name: z, address: 198.18.1.9, region: r1}\n")
    assert found == [f"{tmp_path / 'pathprobe.yaml'}:4: key 'host' given twice (first on line 1)"]
    found = problems(tmp_path, MINIMAL.replace("{name: b,", "{name: b, name: c,"))
    assert found == [f"{tmp_path / 'pathprobe.yaml'}:3: key 'name' given twice (first on line 3)"]


def test_an_ipv4_mapped_address_is_the_same_address(tmp_path: Path) -> None:
    # Regression: compared as strings, ::ffff:198.18.2.2 passed for a peer's 198.18.2.2.
    found = problems(tmp_path, MINIMAL.replace("address: 198.18.1.2", "address: '::ffff:198.18.2.2'"))
    assert "host and peer addresses must be unique; repeated: 198.18.2.2" in found[0]


def test_a_directory_and_a_huge_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read: Is a directory"):
        config.load(tmp_path)
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(yamlfile.MAX_BYTES + 1)  # sparse: no 16 MiB written
    with pytest.raises(ConfigError, match="larger than 16777216 bytes"):
        config.load(huge)


def test_an_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, MINIMAL)
    unreadable(monkeypatch, path)
    with pytest.raises(ConfigError, match="cannot read: Permission denied"):
        config.load(path)


def test_files_the_config_names_are_checked_on_request(tmp_path: Path) -> None:
    # Regression: a missing password or certificate passed check-config and broke `run`.
    (tmp_path / "cert.pem").write_text("x")
    (tmp_path / "keys").mkdir()
    text = MINIMAL + (
        "web:\n"
        "  listen: 127.0.0.1:9469\n"
        f"  config_file: {tmp_path / 'keys'}\n"
        "iperf3:\n"
        "  auth:\n"
        "    username: mesh\n"
        f"    password_file: {tmp_path / 'cert.pem'}\n"
        f"    public_key_file: {tmp_path / 'pub.pem'}\n"
        f"    private_key_file: {tmp_path / 'cert.pem'}\n"
        f"    authorized_users_file: {tmp_path / 'cert.pem'}\n"
    )
    path = write(tmp_path, text)
    assert config.load(path).web.config_file is not None  # loadable as before without the check
    with pytest.raises(ConfigError) as info:
        config.load(path, check_files=True)
    assert info.value.problems == [
        f"{path}:6: web.config_file: {tmp_path / 'keys'} is a directory, not a file",
        f"{path}:11: iperf3.auth.public_key_file: cannot read {tmp_path / 'pub.pem'}: No such file or directory",
    ]


def test_the_former_tls_and_basic_auth_sections_name_their_replacement(tmp_path: Path) -> None:
    path = write(
        tmp_path, MINIMAL + "web:\n  tls: {cert_file: c, key_file: k}\n  basic_auth: {username: u, password_file: p}\n"
    )
    with pytest.raises(ConfigError) as info:
        config.load(path)
    tls, auth = info.value.problems
    assert tls.startswith(f"{path}:5: web.tls: moved to the web config file (web.config_file or --web.config.file")
    assert tls.endswith("tls_server_config: {cert_file: ..., key_file: ...}")
    assert auth.startswith(f"{path}:6: web.basic_auth: moved to") and auth.endswith(
        "basic_auth_users: {USER: BCRYPT-HASH}"
    )


def test_an_unresolvable_listen_host_is_reported_by_the_check(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "web: {listen: 'no-such-host.invalid:9469'}\n")
    with pytest.raises(ConfigError, match=r":4: web\.listen: cannot resolve 'no-such-host\.invalid'"):
        config.load(path, check_files=True)


def test_the_mesh_checks_are_linear_in_peers() -> None:
    # The duplicate checks were quadratic (names.count(n) for every name): 16,000
    # peers took 4 s to validate against 0.1 s for 2,000 (42x for 8x the peers); linear is ~8x.
    # Absolute timings belong to bench/ (bench/exporter_bench.py --reload); this only tells the shapes apart.
    def seconds(n: int) -> float:
        data = {
            "host": {"name": "h", "address": "10.255.255.254", "region": "r"},
            "peers": [
                {"name": f"p{i}", "address": f"10.0.{i >> 8}.{i & 255}", "region": "r", "path_class": "vpc_peering"}
                for i in range(n)
            ],
        }
        validated: list[config.Config] = []
        took = cpu_seconds(lambda: validated.append(config.Config.model_validate(data)), reps=1)
        assert len(validated[0].peers) == n
        return took

    seconds(500)  # warm up
    assert seconds(16000) < 20 * seconds(2000) + 0.05


def test_check_config_exits_2_without_a_traceback_on_unusable_files(tmp_path: Path) -> None:
    files = {
        "binary.yaml": b"\x00\x01\x02\xff" * 64,
        "laughs.yaml": ("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + LAUGHS).encode(),
        "deep.yaml": b"[" * 5000 + b"]" * 5000,
        "null-size.yaml": (MINIMAL + "budget: {daily_bytes: null}\n").encode(),
    }
    paths = [tmp_path]  # a directory
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        paths.append(tmp_path / name)
    for path in paths:
        proc = subprocess.run(
            [sys.executable, "-m", "pathprobe", "check-config", str(path)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert proc.returncode == 2, (path, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stderr.startswith(str(path)), proc.stderr


def test_a_mesh_policy_the_member_list_cannot_meet_is_named(tmp_path: Path) -> None:
    text = MINIMAL + "mesh:\n  throughput: {kind: hierarchical, representatives: 2}\n"
    got = problems(tmp_path, text)
    assert any("mesh.throughput.representatives: 2 is more than the hosts of region(s) r1, r2" in p for p in got), got
    got = problems(tmp_path, MINIMAL + "mesh:\n  rtt: {kind: sampled}\n")
    assert any("mesh.rtt.kind" in p and ":5" in p for p in got), got
