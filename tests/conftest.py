"""Integration tests: real namespaces, iperf3, exporters, Prometheus, Alertmanager.

They need root (network namespaces) and the tools that scripts/setup.sh installs.
"""

import os
import shutil

import pytest

from pathprobe_lab import net


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = [t for t in ("iperf3", "ip", "tc", "nft", "promtool", "amtool", "prometheus") if not shutil.which(t)]
    if os.geteuid() != 0 or missing:
        pytest.exit(
            f"integration tests need root and {', '.join(missing) or 'nothing else'}: run scripts/test.sh", returncode=3
        )
    net.down()  # a lab left by an interrupted run


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    net.down()
