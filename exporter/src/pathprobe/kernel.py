"""What the kernel says of a process and of its host (procfs and cgroupfs, read-only): each
thread's time on a CPU and waiting on a run queue, each core's softirq and steal time, the UDP datagrams
dropped for a full receive buffer, the CPUs a process may run on and its cgroup's CPU quota. Each
reader returns None where the kernel does not say (a file missing, a process gone)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROC = Path("/proc")


def thread_times(pid: int) -> dict[int, tuple[int, int | None]] | None:
    """Each thread of `pid`: (ns on a CPU, ns waiting on a run queue), the latter None where the
    kernel has no schedstat (then CPU time from /proc/PID/task/TID/stat, in clock ticks). None when
    the process is gone."""
    task = Path(f"/proc/{pid}/task")
    try:
        tids = [int(t) for t in os.listdir(task)]
    except OSError:
        return None
    out: dict[int, tuple[int, int | None]] = {}
    for tid in tids:
        try:
            run, wait, _ = (task / str(tid) / "schedstat").read_text().split()
            out[tid] = (int(run), int(wait))
        except FileNotFoundError:
            stat = _stat_ticks(task / str(tid) / "stat")
            if stat is not None:
                out[tid] = (stat, None)
        except (OSError, ValueError):
            continue  # the thread ended between the listing and the read
    return out


def _stat_ticks(path: Path) -> int | None:
    """utime + stime of a /proc stat file, in ns."""
    try:
        fields = path.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // USER_HZ
    except (OSError, IndexError, ValueError):
        return None


def cpu_ticks() -> dict[str, tuple[int, int, int]]:
    """Each CPU's (softirq, steal, total) ticks since boot (/proc/stat)."""
    out = {}
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *values = line.split()
            ticks = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
            out[name] = (ticks[6], ticks[7], sum(ticks))
    return out


def udp_receive_errors() -> int | None:
    """Datagrams this network namespace dropped for a full UDP receive buffer since boot
    (RcvbufErrors of Udp and of Udp6)."""
    total, found = 0, False
    try:
        lines = Path("/proc/net/snmp").read_text().splitlines()
    except OSError:
        return None
    for names, values in itertools.pairwise(lines):
        if names.startswith("Udp:") and values.startswith("Udp:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            if "RcvbufErrors" in row:
                total, found = total + int(row["RcvbufErrors"]), True
    try:
        for line in Path("/proc/net/snmp6").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "Udp6RcvbufErrors":
                total += int(value.strip())
    except (OSError, ValueError):
        pass
    return total if found else None


def _mounts(proc: Path) -> list[tuple[str, str, str, str]]:
    """(root, mount point, filesystem type, super options) of each mount this process sees."""
    out = []
    try:
        lines = (proc / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) >= 5 and len(rest) >= 3:
            out.append((fields[3], fields[4], rest[0], rest[2]))
    return out


def cgroup_quota_cpus(pid: int, proc: Path = PROC) -> float | None:
    """The CPU quota (in CPUs) of `pid`'s cgroup and its parents, the smallest (cgroup v2's cpu.max,
    v1's cpu.cfs_quota_us over cpu.cfs_period_us); None where none applies or none can be read.
    `proc`: where procfs is (a test's own tree)."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    mounts = _mounts(proc)
    quotas: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            dirs = [(root, point) for root, point, fs, _ in mounts if fs == "cgroup2"]
            read = _v2_quota
        elif "cpu" in controllers.split(","):
            dirs = [(root, point) for root, point, fs, opts in mounts if fs == "cgroup" and "cpu" in opts.split(",")]
            read = _v1_quota
        else:
            continue
        for root, point in dirs:
            relative = path[len(root) :] if root != "/" and path.startswith(root) else path
            here = Path(point) / relative.lstrip("/")
            while True:
                quota = read(here)
                if quota is not None:
                    quotas.append(quota)
                if here == Path(point) or here.parent == here:
                    break
                here = here.parent
    return min(quotas) if quotas else None


def _v2_quota(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def affinity(pid: int) -> int | None:
    try:
        return len(os.sched_getaffinity(pid))
    except OSError:
        return None
