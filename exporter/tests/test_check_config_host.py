"""check-config's checks against the host the exporter will run on (and `--free-ports`)."""

import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from pathprobe.commands import run
from pathprobe.config import Config, Iperf3Settings, Responders, WebSettings
from pathprobe.exporter import epoch_too_far_ahead
from pathprobe.responders import held_ports


def config(**probes: object) -> Config:
    peers = [
        {"name": f"p{i}", "address": f"198.18.{i}.2", "region": "r", "path_class": "inter_region"} for i in range(2, 12)
    ]
    return Config.model_validate(
        {"host": {"name": "a", "address": "198.18.1.2", "region": "r"}, "peers": peers, "probes": probes}
    )


def test_mtu_sizes_above_every_interface_and_flows_beyond_the_port_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "host_max_mtu", lambda: 1500)
    monkeypatch.setattr(run, "local_port_range", lambda: 100)
    problems = run.host_problems(config(mtu={"sizes": [1500, 9001]}, loss={"flows": 16}))
    assert problems == [
        "probes.loss.flows: 16 flows to each of 10 peers need more source ports than this host's "
        "ip_local_port_range has (100)",
        "probes.mtu.sizes.1: 9001 is larger than any interface MTU of this host (1500)",
    ]


def test_a_host_that_can_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "host_max_mtu", lambda: 9001)
    monkeypatch.setattr(run, "local_port_range", lambda: 28232)
    assert run.host_problems(config(mtu={"sizes": [1500, 9001]})) == []


def test_an_iperf3_binary_the_host_lacks_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "host_max_mtu", lambda: 9001)
    monkeypatch.setattr(run, "local_port_range", lambda: 28232)
    cfg = config().model_copy(update={"iperf3": Iperf3Settings(binary="/nonexistent/iperf3")})
    assert run.host_problems(cfg) == [
        "iperf3.binary: '/nonexistent/iperf3' is not an executable on this host's PATH (peers' tests against "
        "this host and its own would fail)"
    ]


def test_free_ports_names_the_field_of_each_port_another_program_holds(tmp_path: Path) -> None:
    # Loopback, on ports the kernel picks: one held over TCP (web), one over UDP (echo).
    web, echo = socket.socket(), socket.socket(type=socket.SOCK_DGRAM)
    with web, echo:
        web.bind(("127.0.0.1", 0))
        web.listen()
        echo.bind(("127.0.0.1", 0))
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        free_port = free.getsockname()[1]
        free.close()
        cfg = config().model_copy(
            update={
                "responders": Responders(listen="127.0.0.1", rr_port=free_port, echo_port=echo.getsockname()[1]),
                "iperf3": Iperf3Settings(port=free_port),
                "web": WebSettings(listen=f"127.0.0.1:{web.getsockname()[1]}"),
            }
        )
        in_use = "is not free on this host: Address already in use"
        assert held_ports(cfg) == [
            f"responders.echo_port: 127.0.0.1:{echo.getsockname()[1]}/udp {in_use}",
            f"web.listen: 127.0.0.1:{web.getsockname()[1]}/tcp {in_use}",
        ]
        # The command: exit 2, one line per port, the file named.
        path = tmp_path / "pathprobe.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_defaults=True)))
        proc = subprocess.run(
            [sys.executable, "-m", "pathprobe", "check-config", "--free-ports", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 2 and proc.stderr.count(f"{path}: ") == 2, proc.stderr
    assert held_ports(cfg) == []  # released


def with_epoch(at: float) -> Config:
    cfg = config()
    return cfg.model_copy(update={"mesh": cfg.mesh.model_copy(update={"epoch": datetime.fromtimestamp(at, UTC)})})


NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
HOUR, DAY = 3600.0, 86400.0


@pytest.mark.parametrize("ahead", [-10 * 365 * DAY, 0.0, 3 * HOUR, 23 * HOUR, DAY])
def test_an_epoch_up_to_a_day_ahead_is_a_rollouts_margin(ahead: float) -> None:
    assert epoch_too_far_ahead(with_epoch(NOW + ahead), NOW) is None
    assert epoch_too_far_ahead(config(), NOW) is None  # no epoch: at once


@pytest.mark.parametrize(("ahead", "far"), [(DAY + HOUR, "25.0 h"), (3653 * DAY, "3653 days")])
def test_an_epoch_more_than_a_day_ahead_is_named_with_how_far(ahead: float, far: str) -> None:
    problem = epoch_too_far_ahead(with_epoch(NOW + ahead), NOW)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW + ahead))
    assert problem is not None and problem.startswith(f"mesh.epoch: {at} is {far} ahead of this host's clock:")


def test_check_config_warns_of_an_epoch_ten_years_ahead_and_not_of_one_hours_ahead(tmp_path: Path) -> None:
    # Regression: an epoch ten years ahead passed check-config silently and a fresh exporter then
    # took no throughput test for ten years. A warning (exit 0): the unit's ExecStartPre runs it too.
    path = tmp_path / "pathprobe.yaml"
    for ahead, warned in ((10 * 365 * DAY, True), (3 * HOUR, False)):
        body = config().model_dump(mode="json", exclude_defaults=True)
        body["mesh"] = {"epoch": datetime.fromtimestamp(time.time() + ahead, UTC).isoformat()}
        path.write_text(yaml.safe_dump(body))
        proc = subprocess.run(
            [sys.executable, "-m", "pathprobe", "check-config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0 and f"{path}: ok" in proc.stdout, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        if warned:
            assert f"{path}: warning: mesh.epoch: " in proc.stderr, proc.stderr
            assert " days ahead of this host's clock" in proc.stderr, proc.stderr
        else:
            assert "mesh.epoch" not in proc.stderr, proc.stderr
