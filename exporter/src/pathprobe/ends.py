"""A throughput test's own ends: what each end's iperf3 and its host used and could use while the
test ran, and whether one of them, not the path, bound the result.

On a large instance one iperf3 thread (every stream of a test shares one before iperf3 3.16) or a
receiver's CPU measures the host, not the network: a c6gn.medium receiving four TCP streams at
11.7 Gbit/s ran its one vCPU at 94%, and a 16 Gbit/s UDP test to it "lost" 40-55% because the
receiver could not read its socket fast enough (iperf3's own CPU report and `netstat -su` in
"東京リージョンと大阪リージョンのEC2インスタンス間の転送速度を計測してみた", DevelopersIO,
2024-05-15). A test like that says nothing about the path, so it must not page as one.

Each end is judged by what its process could not get, not by a share of 100%:
- the share of time a thread of its iperf3 was on a CPU or waiting for one (the kernel's
  schedstat: run time and run-queue wait per thread), in the busiest second of the test. A thread
  that is never idle is bound by the CPU whatever held it: one core's worth of work, a cgroup's
  quota (a throttled thread waits on its run queue), or other processes on the host. A thread
  that waits for the network sleeps and is not counted;
- the busiest core's softirq share (/proc/stat): the kernel's packet processing, which runs
  beside the process (a flow's receive work lands on one core);
- the share of the host's CPU time its hypervisor took (steal, /proc/stat) over the test: a
  stolen vCPU stops the test's threads and the kernel's packet processing alike, and a guest's
  scheduler counts that time as neither running nor waiting, so a starved thread looks idle;
- UDP datagrams the receiving host dropped for a full socket buffer during the test
  (/proc/net/snmp RcvbufErrors): that "loss" is the receiver's.
Without schedstat (a kernel without CONFIG_SCHED_INFO) the process's CPU time is judged against
what it could use (its threads, the CPUs it may run on, its cgroup's quota). An end without its
figures is "unknown", never "not bound".
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from . import kernel
from .limits import LIMIT_KINDS

# A thread on or waiting for a CPU this share of its busiest second was bound by the CPU.
RUNNABLE_BOUND = 0.9
# A thread that waited on a run queue this share of its busiest second was held back by the CPU,
# though it slept between (a sender of one stream under a small cgroup quota fills its socket
# buffer in its share of the CPU, sleeps until the network drains it, and waits again): 0.75-1.2 of
# its busiest second under a quota of 0.005 of a CPU, where a healthy sender of 500 Mbit/s on the
# lab's two cores, four busy loops beside it, waited at most 0.02 (bench/ends_bounds.py).
WAIT_BOUND = 0.5
# Without run-queue figures: a process that used this share of what it could use.
CPU_BOUND = 0.9
# A process bound by its one thread per process (before iperf3 3.16) uses about a core per process.
ONE_THREAD_SHARE = 0.8
# A core that spent this share of a second in softirq was saturated by packet processing.
SOFTIRQ_BOUND = 0.9
# A host whose hypervisor took this share of its CPU time over the test measured itself: on this
# project's 2-vCPU lab VM, 14-23% steal held two demo tests to 52% and 77% of their expected rates
# (90% and more at 0-1% steal), the delay line and iperf3 losing their turns alike; a tenth is well
# above the 0-1% of a quiet host.
STEAL_BOUND = 0.1
# The receiver's dropped datagrams bound a UDP test's loss when they are this share of what it lost.
DROPS_SHARE = 0.1
# How often an end is sampled while its test runs; the CPUs and quota of its processes are read at
# the second sample and every QUOTA_READ_EVERY after (the lab's wrapper puts iperf3 in its cgroup
# after the process started; a unit's quota may change).
SAMPLE_SECONDS = 0.1
QUOTA_READ_EVERY = 10
# The busiest window: shares are taken over this long (or over the whole test, if shorter).
WINDOW_SECONDS = 1.0
MIN_WINDOW_SECONDS = 0.3
# iperf3 runs a thread per stream from this version on (esnet/iperf 3.16 release notes, 2023-11-30).
THREADS_PER_STREAM_SINCE = (3, 16)
# What one end's figures may be and still be taken from a peer (it reports them: ends.from_json).
MAX_CPUS = 4096
MAX_DROPS = 2**48
_VERSION = re.compile(r"^\d{1,3}\.\d{1,3}(\.\d{1,3})?[0-9a-z+~.-]{0,16}$")

# The limits a test's own ends put on it, in the vocabulary of limits.py's, and what lifts each.
REMEDIES = {
    "cpu_quota": "the iperf3 process is held to a CPU quota (cgroup): raise it",
    "one_thread": "one iperf3 thread carries every stream: iperf3 3.16 or later, or more iperf3 processes "
    "(iperf3.processes)",
    "cpus": "every CPU the iperf3 process may use was busy: a larger instance, fewer streams, or less other load",
    "softirq": "one core is saturated by the kernel's packet processing: more streams (spread over the NIC's "
    "queues), or a larger instance",
    "steal": "the hypervisor took the host's CPU (steal): a burstable instance out of CPU credits or a busy "
    "virtual host; an instance type that is not burstable, or T instances' unlimited mode",
    "receive_buffer": "the receiver dropped datagrams for a full socket buffer: a lower UDP bitrate, or larger "
    "buffers (net.core.rmem_max and throughput.window_bytes)",
}


def valid_version(version: str) -> bool:
    """Whether `version` reads as an iperf3 version ("3.12", "3.18.1")."""
    return _VERSION.match(version) is not None


def threads_per_stream(version: str | None) -> bool:
    """Whether this iperf3 version runs a thread per stream (False for an unknown version)."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    return found is not None and (int(found[1]), int(found[2])) >= THREADS_PER_STREAM_SINCE


@dataclass(frozen=True)
class EndFigures:
    """What one end of a test used and could use, each in its busiest second (None: not known)."""

    runnable_ratio: float | None  # its busiest thread: share of time on or waiting for a CPU
    wait_ratio: float | None  # its busiest thread: share of time waiting on a run queue
    cpu_cores: float | None  # the iperf3 processes' CPU time per second (cores)
    usable_cpus: float | None  # what they could use: stream threads, CPUs they may run on, cgroup quota
    softirq_ratio: float | None  # the host's busiest core: share of time in softirq
    udp_receive_drops: int | None  # datagrams the host dropped for a full UDP receive buffer
    iperf3_version: str | None = None
    processes: int = 1
    quota_cpus: float | None = None  # the cgroup's CPU quota (None: none)
    cpus: int | None = None  # CPUs the process may run on (its affinity)
    stream_threads: int | None = None
    steal_ratio: float | None = None  # the host's CPU time its hypervisor took, over the test

    @property
    def cpu_ratio(self) -> float | None:
        """CPU time over what the processes could use."""
        if self.cpu_cores is None or not self.usable_cpus:
            return None
        return self.cpu_cores / self.usable_cpus

    @property
    def known(self) -> bool:
        return self.runnable_ratio is not None or self.cpu_ratio is not None

    def cpu_bound(self) -> bool:
        """Never idle (runnable), or held back waiting for a CPU, or at what it could use."""
        ratio = self.cpu_ratio
        return (
            (self.runnable_ratio is not None and self.runnable_ratio >= RUNNABLE_BOUND)
            or (self.wait_ratio is not None and self.wait_ratio >= WAIT_BOUND)
            or (ratio is not None and ratio >= CPU_BOUND)
        )

    def remedy(self) -> str | None:
        """What bound this end (a key of REMEDIES), None when it had headroom or is unknown."""
        if self.steal_ratio is not None and self.steal_ratio >= STEAL_BOUND:
            return "steal"
        if self.softirq_ratio is not None and self.softirq_ratio >= SOFTIRQ_BOUND:
            return "softirq"
        if not self.cpu_bound():
            return None
        fewest = min((c for c in (self.cpus, self.stream_threads) if c), default=None)
        if self.quota_cpus is not None and (fewest is None or self.quota_cpus < fewest):
            return "cpu_quota"
        # One thread per process at a core's worth of work while the host had CPUs to spare; a thread
        # that mostly waited for a CPU was held back by the host's other load (or a quota it cannot see).
        busy = self.cpu_cores is not None and self.stream_threads is not None
        at_its_threads = busy and (self.cpu_cores or 0) >= ONE_THREAD_SHARE * (self.stream_threads or 1)
        if at_its_threads and self.cpus is not None and (self.stream_threads or 1) < self.cpus:
            return "one_thread"
        return "cpus"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def from_json(doc: Any) -> EndFigures:
    """A peer's figures (its responder reports them), checked field by field: a report that is
    not physically possible raises ValueError naming the field, and none of it is used."""
    if not isinstance(doc, dict):
        raise ValueError("not an object")

    def number(name: str, most: float, whole: bool = False) -> Any:
        value = doc.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{name}: not a number: {value!r}")
        if not 0 <= value <= most or (whole and value != int(value)):
            raise ValueError(f"{name}: {value!r} is out of range (0-{most:g})")
        return int(value) if whole else float(value)

    version = doc.get("iperf3_version")
    if version is not None and (not isinstance(version, str) or not valid_version(version)):
        raise ValueError(f"iperf3_version: not a version: {version!r}")
    processes = number("processes", 1024, whole=True)
    return EndFigures(
        # A window's accounting can read over 1 (a thread throttled across its edge): up to 1.5.
        runnable_ratio=number("runnable_ratio", 1.5),
        wait_ratio=number("wait_ratio", 1.5),
        cpu_cores=number("cpu_cores", MAX_CPUS),
        usable_cpus=number("usable_cpus", MAX_CPUS),
        softirq_ratio=number("softirq_ratio", 1.5),
        udp_receive_drops=number("udp_receive_drops", MAX_DROPS, whole=True),
        iperf3_version=version,
        processes=processes or 1,
        quota_cpus=number("quota_cpus", MAX_CPUS),
        cpus=number("cpus", MAX_CPUS, whole=True),
        stream_threads=number("stream_threads", 2**16, whole=True),
        steal_ratio=number("steal_ratio", 1),
    )


@dataclass(frozen=True)
class Bound:
    """What of a test's own ends bound its result. `limit`: receiver_drops, receiver_cpu or
    sender_cpu (the test measured a host, not the path), none (both ends had headroom), unknown
    (an end's figures are missing); `remedy`: a key of REMEDIES, or ""."""

    limit: str
    remedy: str = ""

    @property
    def host_bound(self) -> bool:
        return self.limit in HOST_LIMITS


# The test's own ends, in limits.py's vocabulary; with none (both had headroom) and unknown.
HOST_LIMITS = tuple(name for name, kind in LIMIT_KINDS.items() if kind.own_end)
LIMITS = (*HOST_LIMITS, "none", "unknown")


def judge(protocol: str, sender: EndFigures | None, receiver: EndFigures | None, lost: int | None) -> Bound:
    """The test's bound from its ends' figures: the receiver's drops first (a UDP test's loss),
    then the receiver's CPU, then the sender's."""
    drops = receiver.udp_receive_drops if receiver is not None else None
    if protocol == "udp" and drops and drops >= DROPS_SHARE * max(lost or 0, 1):
        return Bound("receiver_drops", "receive_buffer")
    for name, end in (("receiver", receiver), ("sender", sender)):
        remedy = end.remedy() if end is not None else None
        if remedy is not None:
            return Bound(f"{name}_cpu", remedy)
    if sender is None or receiver is None or not sender.known or not receiver.known:
        return Bound("unknown")
    return Bound("none")


def describe(end: EndFigures | None) -> str:
    """One end's figures in a line."""
    if end is None or not end.known:
        return "unknown (no figures: an older peer, or a test its responder did not watch)"
    parts = [f"iperf3 {end.iperf3_version or '?'}" + (f" x{end.processes}" if end.processes > 1 else "")]
    if end.runnable_ratio is not None:
        waiting = f", waiting for one {end.wait_ratio:.0%}" if end.wait_ratio is not None else ""
        parts.append(f"busiest thread on or waiting for a CPU {end.runnable_ratio:.0%} of its busiest second{waiting}")
    if end.cpu_cores is not None:
        usable = f" of {end.usable_cpus:.3g} usable" if end.usable_cpus else ""
        parts.append(f"CPU {end.cpu_cores:.2f} cores{usable}")
    if end.quota_cpus is not None:
        parts.append(f"cgroup quota {end.quota_cpus:.3g} CPUs")
    if end.softirq_ratio is not None:
        parts.append(f"busiest core in softirq {end.softirq_ratio:.0%}")
    if end.steal_ratio is not None:
        parts.append(f"host's CPU taken by its hypervisor {end.steal_ratio:.0%}")
    return ", ".join(parts)


def describe_bound(limit: str, remedy: str) -> str:
    """A test's bound (Bound.limit, Bound.remedy) in words."""
    if limit == "none":
        return "no: both ends had headroom, so the rate is the path's"
    if limit == "unknown":
        return "unknown: an end's figures are missing"
    return f"{limit}: the test measured a host, not the path; {REMEDIES.get(remedy, remedy)}"


# --- watching one end while a test runs


@dataclass
class _Sample:
    at: float
    threads: dict[tuple[int, int], tuple[int, int | None]]  # (pid, tid) -> (run ns, wait ns)
    cpus: dict[str, tuple[int, int, int]]  # each CPU's (softirq, steal, total) ticks


@dataclass
class EndWatch:
    """One end's iperf3 processes and host, sampled every SAMPLE_SECONDS while a test runs (by
    its prober, or by the supervisor of the server it runs on): `sample()` on each tick, then
    `figures()`."""

    streams: int
    version: str | None
    pids: list[int] = field(default_factory=list)
    samples: list[_Sample] = field(default_factory=list)
    drops_before: int | None = None
    drops_after: int | None = None
    quota: float | None = None
    cpus: int | None = None

    def start(self, pids: Iterable[int]) -> None:
        self.pids = list(pids)
        self.drops_before = kernel.udp_receive_errors()
        self.sample()

    def sample(self, now: float | None = None) -> None:
        threads: dict[tuple[int, int], tuple[int, int | None]] = {}
        for pid in self.pids:
            times = kernel.thread_times(pid)
            if times is None:
                continue
            threads.update({(pid, tid): t for tid, t in times.items()})
            if len(self.samples) % QUOTA_READ_EVERY == 1:  # not at the first: a wrapper may move it first
                # The last read that found the process (one that ended meanwhile reads as none).
                self.cpus = kernel.affinity(pid) or self.cpus
                self.quota = kernel.cgroup_quota_cpus(pid) or self.quota
        if threads:
            self.samples.append(_Sample(time.monotonic() if now is None else now, threads, kernel.cpu_ticks()))

    def stop(self) -> None:
        """The end of the test's samples (or of those so far: a report asked for while it runs)."""
        self.sample()
        self.drops_after = kernel.udp_receive_errors()

    async def sample_until_cancelled(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_SECONDS)
            self.sample()

    def figures(self) -> EndFigures:
        runnable = wait = cpu = softirq = None
        for a, b in _windows(self.samples):
            seconds = b.at - a.at
            both = [k for k in b.threads if k in a.threads]
            run = [(b.threads[k][0] - a.threads[k][0]) / 1e9 / seconds for k in both]
            waits = [_delta(a.threads[k][1], b.threads[k][1]) for k in both]
            if run:
                cpu = max(cpu or 0.0, sum(run))
            if run and all(w is not None for w in waits):
                queued = [(w or 0) / 1e9 / seconds for w in waits]
                runnable = max(runnable or 0.0, *(r + q for r, q in zip(run, queued, strict=True)))
                wait = max(wait or 0.0, *queued)
            cores = [
                ((b.cpus[c][0] - a.cpus[c][0]) / (b.cpus[c][2] - a.cpus[c][2]))
                for c in b.cpus
                if c in a.cpus and b.cpus[c][2] > a.cpus[c][2]
            ]
            if cores:
                softirq = max(softirq or 0.0, *cores)
        threaded = threads_per_stream(self.version)
        stream_threads = self.streams if threaded else len(self.pids) or 1
        usable = min((c for c in (stream_threads, self.cpus, self.quota) if c), default=None)
        drops = None
        if self.drops_before is not None and self.drops_after is not None:
            drops = max(0, self.drops_after - self.drops_before)
        return EndFigures(
            runnable_ratio=runnable,
            wait_ratio=wait,
            cpu_cores=cpu,
            usable_cpus=usable,
            softirq_ratio=softirq,
            udp_receive_drops=drops,
            iperf3_version=self.version,
            processes=max(1, len(self.pids)),
            quota_cpus=self.quota,
            cpus=self.cpus,
            stream_threads=stream_threads,
            # Over the whole test, whose mean rate is over all of it.
            steal_ratio=steal_share(self.samples[0].cpus, self.samples[-1].cpus) if len(self.samples) > 1 else None,
        )


def steal_share(first: dict[str, tuple[int, int, int]], last: dict[str, tuple[int, int, int]]) -> float | None:
    """The share of the host's CPU time its hypervisor took between two readings of kernel.cpu_ticks()."""
    both = [c for c in last if c in first]
    total = sum(last[c][2] - first[c][2] for c in both)
    return sum(last[c][1] - first[c][1] for c in both) / total if total > 0 else None


def _delta(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def _windows(samples: list[_Sample]) -> Iterable[tuple[_Sample, _Sample]]:
    """Pairs of samples WINDOW_SECONDS apart (the first sample after each one that far), or the
    first and the last for a test shorter than that but at least MIN_WINDOW_SECONDS long."""
    if len(samples) < 2 or samples[-1].at - samples[0].at < MIN_WINDOW_SECONDS:
        return
    if samples[-1].at - samples[0].at < WINDOW_SECONDS:
        yield samples[0], samples[-1]
        return
    j = 0
    for i, a in enumerate(samples):
        j = max(j, i + 1)
        while j < len(samples) and samples[j].at - a.at < WINDOW_SECONDS:
            j += 1
        if j == len(samples):
            return
        yield a, samples[j]
