"""Integration tests: real namespaces, iperf3, exporters, Prometheus, Alertmanager.

They need the tools that scripts/setup.sh installs; those marked `lab` also need root
(network namespaces). There is one lab per network namespace: a session that selects lab
tests takes a lock first, so that two test sessions in one namespace run one after the other
instead of tearing down each other's lab (scripts/isolated.sh runs one in a namespace, and
with a lock, of its own).
"""

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from pathprobe_lab import net

LOCK = pytest.StashKey[int]()  # the session's lock on its namespace's one lab


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = [t for t in ("iperf3", "ip", "tc", "nft", "promtool", "amtool", "prometheus") if not shutil.which(t)]
    if missing:
        pytest.exit(f"integration tests need {', '.join(missing)}: run scripts/setup.sh", returncode=3)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(item.get_closest_marker("lab") for item in session.items):
        return
    if os.geteuid() != 0:
        pytest.exit("the lab tests need root (network namespaces): run scripts/test.sh as root", returncode=3)
    lock = os.open(Path(tempfile.gettempdir()) / "pathprobe-lab-tests.lock", os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # held until this process ends
    session.config.stash[LOCK] = lock
    net.down()  # a lab left by an interrupted run


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if LOCK in session.config.stash:
        net.down()
