"""The root filesystems the Ansible tests run hosts from (debootstrap: minutes on a fresh
machine): Debian 12 and Debian 13 (Python 3.13) ones that the deployment test boots its lab
hosts from, and an arm64 Debian 12 (a Graviton's architecture, run by qemu-user through
binfmt_misc) that the wheel test runs as a chroot. Made once and kept between runs;
scripts/test.sh's full run builds them first (at the lowest CPU and I/O priority, beside the
checks and the chaos lab), and a test waits for its own under the same lock.

Run: python tests/rootfs.py   (as root)"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ROOTFS = Path("/var/tmp/pathprobe-rootfs")
MIRROR = "http://deb.debian.org/debian"
# A booted host: what it needs to boot systemd and take SSH, and what the role installs (the
# lab's hosts have no route to a mirror).
BOOTED_PACKAGES = [
    "python3",
    "python3-venv",
    "python3-packaging",
    "python3-apt",
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "iperf3",
    "ethtool",
    "nftables",
    "iproute2",
    "procps",
]
# A chroot: a Python for the exporter's virtualenv, and iperf3, which the exporter's config check needs.
CHROOT_PACKAGES = ["python3", "python3-venv", "iperf3"]
# name: (suite, architecture, packages)
ROOTS = {
    "base": ("bookworm", "amd64", BOOTED_PACKAGES),
    "trixie-amd64": ("trixie", "amd64", BOOTED_PACKAGES),
    "bookworm-arm64": ("bookworm", "arm64", CHROOT_PACKAGES),
}
APT_LISTS_MAX_AGE = 12 * 3600  # the role's apt cache_valid_time is a day


def rootfs(name: str) -> Path:
    """ROOTS[name], built if missing; a booted host's apt lists refreshed when half a day old."""
    suite, arch, packages = ROOTS[name]
    with _locked():
        if arch == "arm64":
            enable_qemu_aarch64()
        root = _built(name, suite, arch, packages)
        lists = root / "var" / "lib" / "apt" / "lists"
        stale = time.time() - lists.stat().st_mtime > APT_LISTS_MAX_AGE or not list(lists.glob("*_Packages"))
        if packages == BOOTED_PACKAGES and stale:
            proc = subprocess.run(
                ["chroot", str(root), "apt-get", "update", "-q"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return root


def enable_qemu_aarch64() -> None:
    """arm64 programs run by qemu-user-static (its binfmt_misc entry, with the flag that keeps
    the interpreter open: a chroot needs no copy of it)."""
    binfmt = Path("/proc/sys/fs/binfmt_misc")
    if not (binfmt / "status").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt)], check=True)
    entry = binfmt / "qemu-aarch64"
    if not entry.exists() or not entry.read_text().startswith("enabled"):
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], check=True)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One builder at a time (a lock beside the root filesystems)."""
    ROOTFS.mkdir(parents=True, exist_ok=True)
    with (ROOTFS / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _built(name: str, suite: str, arch: str, packages: list[str]) -> Path:
    """ROOTFS/name, built again if missing or made for other packages."""
    root = ROOTFS / name
    stamp = root / ".pathprobe-packages"
    if not stamp.exists() or stamp.read_text() != " ".join(packages):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        cmd = [
            "debootstrap",
            f"--arch={arch}",
            "--variant=minbase",
            f"--include={','.join(packages)}",
            suite,
            str(root),
            MIRROR,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        stamp.write_text(" ".join(packages))
    return root


if __name__ == "__main__":
    for name in ROOTS:
        print(rootfs(name))
