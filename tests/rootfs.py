"""The Debian 12 root filesystem the Ansible deployment test boots its lab hosts from
(debootstrap: minutes on a fresh machine). Made once and kept between runs; scripts/test.sh
starts building it in the background (at the lowest CPU and I/O priority) while the checks
and unit tests run, and the test waits for it under the same lock.

Run: python tests/rootfs.py   (as root)"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import time
from pathlib import Path

ROOTFS = Path("/var/tmp/pathprobe-rootfs")
MIRROR = "http://deb.debian.org/debian"
# What the hosts need to boot systemd, take SSH, and what the role installs (the lab's hosts
# have no route to a mirror).
ROOTFS_PACKAGES = ["python3", "python3-venv", "python3-packaging", "python3-apt", "systemd", "systemd-sysv", "dbus",
                   "openssh-server", "iperf3", "ethtool", "nftables", "iproute2", "procps"]  # fmt: skip
APT_LISTS_MAX_AGE = 12 * 3600  # the role's apt cache_valid_time is a day


def base_rootfs() -> Path:
    """The base root filesystem, built if missing or made for other packages; its apt lists
    refreshed when half a day old. One builder at a time (a lock beside it)."""
    ROOTFS.mkdir(parents=True, exist_ok=True)
    with (ROOTFS / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        base = ROOTFS / "base"
        stamp = base / ".pathprobe-packages"
        if not stamp.exists() or stamp.read_text() != " ".join(ROOTFS_PACKAGES):
            shutil.rmtree(base, ignore_errors=True)
            base.mkdir(parents=True)
            cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}", "bookworm",
                   str(base), MIRROR]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            stamp.write_text(" ".join(ROOTFS_PACKAGES))
        lists = base / "var" / "lib" / "apt" / "lists"
        if time.time() - lists.stat().st_mtime > APT_LISTS_MAX_AGE or not list(lists.glob("*_Packages")):
            proc = subprocess.run(["chroot", str(base), "apt-get", "update", "-q"], capture_output=True, text=True,
                                  timeout=300, check=False)  # fmt: skip
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return base


if __name__ == "__main__":
    print(base_rootfs())
