"""The firewall's ruleset: peers and `responders.allow` only, on the iperf3 port, checked by nft."""

import subprocess

from pathprobe import firewall
from pathprobe.config import Config

CFG = Config.model_validate(
    {
        "host": {"name": "b", "address": "198.18.2.2", "region": "r"},
        "peers": [
            {"name": "a", "address": "198.18.1.2", "region": "r", "path_class": "intra_region"},
            {"name": "c", "address": "2001:db8::5", "region": "r", "path_class": "intra_region"},
            {"name": "d", "address": "198.18.9.7", "region": "r", "path_class": "intra_region"},
        ],
        "responders": {"allow": ["198.18.9.0/24"]},
        "iperf3": {"port": 5301},
    }
)


def test_only_the_peers_reach_the_iperf3_port() -> None:
    rules = firewall.ruleset(CFG)
    assert "elements = { 198.18.1.2/32, 198.18.9.0/24, 198.18.9.7/32 }" in rules  # overlaps merged by nft
    assert "elements = { 2001:db8::5/128 }" in rules
    assert "th dport 5301 ip saddr != @peers4 counter drop" in rules
    assert "th dport 5301 ip6 saddr != @peers6 counter drop" in rules
    # Replaces its own table in one transaction and touches no other.
    assert rules.startswith("table inet pathprobe {}\ndelete table inet pathprobe\n")


def test_nft_accepts_it() -> None:
    check = subprocess.run(
        ["nft", "-c", "-f", "-"], input=firewall.ruleset(CFG), capture_output=True, text=True, timeout=30, check=False
    )
    assert check.returncode == 0, check.stderr
