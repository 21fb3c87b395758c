"""check-config's checks against the host the exporter will run on."""

import pytest

from pathprobe.commands import run
from pathprobe.config import Config


def config(**probes: object) -> Config:
    peers = [{"name": f"p{i}", "address": f"198.18.{i}.2", "region": "r", "path_class": "inter_region"}
             for i in range(2, 12)]  # fmt: skip
    return Config.model_validate({"host": {"name": "a", "address": "198.18.1.2", "region": "r"}, "peers": peers,
                                  "probes": probes})  # fmt: skip


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
