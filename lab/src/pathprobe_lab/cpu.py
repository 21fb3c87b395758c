"""A lab host whose iperf3 gets a small share of a CPU (LabHost.iperf3_cpu): the host too small for
its tests that the exporter must name, not page for as a broken path.

Its iperf3 processes run in a cgroup of the cpu controller with that CFS quota, and only they: the
host's exporter (its probes, its responders) keeps the machine's CPU. The exporter starts every
iperf3 through a wrapper (the lab writes `iperf3.binary` into that host's config) that moves itself
into the cgroup and execs iperf3, so the test's own process is the one held. The cpu hierarchy is
mounted under the lab's state directory: `ip netns exec` mounts a sysfs of its own over /sys, where
the machine's cgroup mounts are, and a process in a lab host would see none of them.
"""

from __future__ import annotations

import os
from pathlib import Path

from pathprobe import procs

from .state import STATE_DIR, LabError, State, sh
from .topology import Topology

MOUNT = STATE_DIR / "cgroup-cpu"
# CFS periods from 1 ms to 1 s; a quota of 1 ms at least. A long period lets a small share of a
# CPU be set at all (1 ms in 200 ms: 0.005 of a CPU).
PERIOD_US = 200_000
MIN_QUOTA_US = 1000


def group(host: str) -> Path:
    """The host's cgroup: named for this lab (its state directory's device and inode, as two labs
    in namespaces of their own each have their own), under the one hierarchy the machine has."""
    made = STATE_DIR.stat()
    return MOUNT / f"pathprobe-lab-{made.st_dev:x}-{made.st_ino:x}-{host}"


def wrapper(host: str) -> Path:
    """The iperf3 the host's exporter runs: its own process put in the host's cgroup first."""
    return STATE_DIR / f"iperf3-{host}"


def apply(topo: Topology, state: State) -> None:
    """A cgroup and a wrapper for each host with an iperf3 CPU quota."""
    held = [h for h in topo.hosts if h.iperf3_cpu is not None]
    if not held:
        return
    MOUNT.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(MOUNT):
        mounted = sh(["mount", "-t", "cgroup", "-o", "cpu", "pathprobe-lab-cpu", str(MOUNT)], check=False)
        if mounted.returncode != 0:
            raise LabError(f"iperf3_cpu needs cgroup v1's cpu controller: {mounted.stderr.strip()}")
    state.cgroups = [str(group(h.name)) for h in held]
    state.save()
    for host in held:
        assert host.iperf3_cpu is not None
        path = group(host.name)
        path.mkdir(exist_ok=True)
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(max(MIN_QUOTA_US, round(host.iperf3_cpu * PERIOD_US))))
        script = wrapper(host.name)
        script.write_text(f'#!/bin/sh\necho $$ > {path}/cgroup.procs || exit 1\nexec iperf3 "$@"\n')
        script.chmod(0o755)


def remove(state: State | None) -> list[str]:
    """The lab's cgroups (their processes gone with the lab's namespaces) and the mount."""
    done = []
    for name in state.cgroups if state else []:
        path = Path(name)
        for pid in path.joinpath("cgroup.procs").read_text().split() if path.exists() else []:
            procs.terminate(int(pid))  # a process that outlived its namespace
        if path.exists():
            path.rmdir()
            done.append(f"removed cgroup {path.name}")
    if os.path.ismount(MOUNT):
        sh(["umount", str(MOUNT)], check=False)
        done.append(f"unmounted {MOUNT}")
    return done
