"""A stranger's idle connection to the iperf3 port blocks every peer's test, unless the
firewall (`pathprobe firewall --apply`, what the systemd unit runs first) keeps it out."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from helpers import PATHPROBE, PEER_SERVER_STRANGER, in_host
from pathprobe_lab import net
from pathprobe_lab.state import in_ns, ns
from pathprobe_lab.topology import address

pytestmark = pytest.mark.lab

SERVER = address(2)  # the server of PEER_SERVER_STRANGER

# Connects to the server's iperf3 port and holds the connection, saying nothing.
HOLD = (
    "import socket, sys, time\n"
    "try:\n"
    f"    s = socket.create_connection(('{SERVER}', 5201), timeout=3)\n"
    "except OSError as exc:\n"
    "    print('refused', exc, flush=True); sys.exit(0)\n"
    "print('holding', flush=True); time.sleep(120)\n"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("firewall")
    net.up(PEER_SERVER_STRANGER)
    cfg = work / "server.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "host": {"name": "server", "address": SERVER, "region": "r"},
                "peers": [{"name": "peer", "address": address(1), "region": "r", "path_class": "intra_region"}],
            }
        )
    )
    serve = subprocess.Popen(
        in_ns(ns("server"), [*PATHPROBE, "serve", "--allow", address(1) + "/32"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert serve.stdout is not None and serve.stdout.readline()  # ready
    yield cfg
    serve.terminate()
    serve.wait(timeout=10)
    net.down()


def hold() -> subprocess.Popen[str]:
    stranger = subprocess.Popen(in_ns(ns("stranger"), [sys.executable, "-c", HOLD]), stdout=subprocess.PIPE, text=True)
    return stranger


def probe() -> subprocess.CompletedProcess[str]:
    return in_host("peer", [*PATHPROBE, "probe", "throughput", SERVER, "--duration", "1s", "--omit", "0s"], timeout=60)


def test_without_the_firewall_a_stranger_blocks_the_peer(server: Path) -> None:
    stranger = hold()
    try:
        assert stranger.stdout is not None and stranger.stdout.readline().startswith("holding")
        blocked = probe()
        assert blocked.returncode != 0, blocked.stdout
    finally:
        stranger.kill()
        stranger.wait()


def test_with_the_firewall_the_stranger_is_kept_out_and_the_peer_measures(server: Path) -> None:
    applied = in_host("server", [*PATHPROBE, "firewall", "--config", str(server), "--apply"])
    assert applied.returncode == 0, applied.stderr
    try:
        stranger = hold()
        assert stranger.stdout is not None and stranger.stdout.readline().startswith("refused")
        stranger.wait(timeout=10)
        measured = probe()
        assert measured.returncode == 0, measured.stdout + measured.stderr
        rules = in_host("server", ["nft", "list", "table", "inet", "pathprobe"]).stdout
        assert "drop" in rules and "packets 0 " not in rules.split("ip saddr != @peers4")[1].splitlines()[0]
    finally:
        removed = in_host("server", [*PATHPROBE, "firewall", "--config", str(server), "--remove"])
        assert removed.returncode == 0, removed.stderr
    assert in_host("server", ["nft", "list", "table", "inet", "pathprobe"]).returncode != 0
