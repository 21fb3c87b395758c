"""A throughput test's own ends (ends.py, kernel.py): what the kernel says of a real process, the
busiest window, the verdict and its remedy, and a peer's report checked before it is used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pathprobe import ends, kernel
from pathprobe.ends import EndFigures, judge
from pathprobe.probes import peer_end

BUSY = [sys.executable, "-c", "import time\nend = time.monotonic() + 5\nwhile time.monotonic() < end: pass"]
# A binary that sleeps at once: an interpreter's start is CPU work, and on a busy machine its wait
# for a CPU read as a busy second.
IDLE = ["sleep", "5"]


def asleep(pid: int) -> bool:
    """Whether process `pid` is sleeping (its state in /proc/PID/stat, after the command's name)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"


def watched(cmd: list[str], seconds: float = 1.3, streams: int = 1, version: str = "3.12") -> EndFigures:
    proc = subprocess.Popen(cmd)
    try:
        if cmd is IDLE:  # watched once it sleeps: its exec is no part of what is asserted of a sleeper
            deadline = time.monotonic() + 10
            while not asleep(proc.pid):
                assert time.monotonic() < deadline, "the sleeper never slept"
                time.sleep(0.01)
        watch = ends.EndWatch(streams, version)
        watch.start([proc.pid])
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(ends.SAMPLE_SECONDS)
            watch.sample()
        watch.stop()
        return watch.figures()
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_never_waits_for_anything_is_bound_by_the_cpu() -> None:
    busy = watched(BUSY)
    assert busy.runnable_ratio is not None and busy.runnable_ratio >= ends.RUNNABLE_BOUND, busy
    assert busy.cpu_bound()
    assert busy.usable_cpus == 1 and busy.stream_threads == 1  # iperf3 3.12: one thread


def test_a_process_that_sleeps_has_headroom() -> None:
    idle = watched(IDLE)
    assert idle.runnable_ratio is not None and idle.runnable_ratio < 0.05, idle
    assert idle.cpu_cores is not None and idle.cpu_cores < 0.05
    assert not idle.cpu_bound() and idle.remedy() is None


def test_threads_are_a_process_each_before_iperf3_3_16_and_one_per_stream_since() -> None:
    assert ends.threads_per_stream("3.16") and ends.threads_per_stream("3.18")
    assert not ends.threads_per_stream("3.12") and not ends.threads_per_stream("3.9")
    assert not ends.threads_per_stream(None)
    new = watched(IDLE, seconds=0.4, streams=8, version="3.18")
    assert new.stream_threads == 8 and new.usable_cpus == min(8, os.cpu_count() or 8)


def test_the_kernel_readers_read_this_host() -> None:
    cores = kernel.cpu_ticks()
    assert len(cores) == os.cpu_count()
    assert all(total >= softirq + steal and softirq >= 0 and steal >= 0 for softirq, steal, total in cores.values())
    assert kernel.udp_receive_errors() is not None
    assert kernel.affinity(os.getpid()) == len(os.sched_getaffinity(0))
    times = kernel.thread_times(os.getpid())
    assert times and all(run >= 0 for run, _ in times.values())
    assert kernel.thread_times(2**22 + 1) is None  # no such process


def test_a_cgroup_quota_is_read_for_the_process_and_its_parents(tmp_path: Path) -> None:
    # A cgroup v1 cpu hierarchy and a v2 one as the kernel lays them out, and a procfs that names them.
    v1, v2, proc = tmp_path / "cpu", tmp_path / "unified", tmp_path / "proc"
    (v1 / "lab" / "host").mkdir(parents=True)
    for directory, quota in ((v1, -1), (v1 / "lab", 50000), (v1 / "lab" / "host", 150000)):
        (directory / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (directory / "cpu.cfs_period_us").write_text("100000\n")
    (v2 / "system.slice" / "pathprobe.service").mkdir(parents=True)
    (v2 / "system.slice" / "cpu.max").write_text("max 100000\n")
    (v2 / "system.slice" / "pathprobe.service" / "cpu.max").write_text("25000 100000\n")
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(
        f"30 25 0:26 / {v1} rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
        f"31 25 0:27 / {v2} rw,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    cgroups = {
        10: "4:cpu,cpuacct:/lab/host\n1:name=systemd:/\n",
        11: "0::/system.slice/pathprobe.service\n",
        12: "0::/\n4:cpu,cpuacct:/\n",
    }
    for pid, cgroup in cgroups.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cgroup").write_text(cgroup)
    assert kernel.cgroup_quota_cpus(10, proc) == 0.5  # the parent's is the smaller
    assert kernel.cgroup_quota_cpus(11, proc) == 0.25
    assert kernel.cgroup_quota_cpus(12, proc) is None  # no quota anywhere
    assert kernel.cgroup_quota_cpus(13, proc) is None  # no such process


def end(**fields: float | int | None) -> EndFigures:
    base: dict = dict(
        runnable_ratio=0.3,
        wait_ratio=0.01,
        cpu_cores=0.3,
        usable_cpus=1.0,
        softirq_ratio=0.1,
        udp_receive_drops=0,
        iperf3_version="3.12",
        cpus=8,
        stream_threads=1,
    )
    return EndFigures(**(base | fields))


@pytest.mark.parametrize(
    ("sender", "receiver", "protocol", "lost", "verdict"),
    [
        (end(), end(), "tcp", None, ("none", "")),
        (end(), end(runnable_ratio=0.95, cpu_cores=0.94), "tcp", None, ("receiver_cpu", "one_thread")),
        # Never idle but mostly waiting: the host's other load, not the one thread.
        (end(), end(runnable_ratio=0.95, wait_ratio=0.6, cpu_cores=0.35), "tcp", None, ("receiver_cpu", "cpus")),
        (end(runnable_ratio=0.97, cpu_cores=0.96), end(), "tcp", None, ("sender_cpu", "one_thread")),
        # A quota below its threads and CPUs: the quota binds.
        (end(runnable_ratio=1.0, cpu_cores=0.05, usable_cpus=0.05, quota_cpus=0.05), end(), "tcp", None,
         ("sender_cpu", "cpu_quota")),
        # A one-vCPU host with iperf3 3.16+ at its core (the c6gn.medium receiver at 94%).
        (end(), end(runnable_ratio=0.99, cpu_cores=0.94, cpus=1, stream_threads=4, iperf3_version="3.16"), "tcp",
         None, ("receiver_cpu", "cpus")),
        (end(), end(softirq_ratio=0.95), "tcp", None, ("receiver_cpu", "softirq")),
        # A host whose hypervisor took a tenth of its CPU: its threads look idle, the host bound the test.
        (end(steal_ratio=0.15), end(), "tcp", None, ("sender_cpu", "steal")),
        (end(steal_ratio=0.12), end(steal_ratio=0.12), "tcp", None, ("receiver_cpu", "steal")),
        (end(steal_ratio=0.02), end(steal_ratio=0.01), "tcp", None, ("none", "")),
        # A thread that slept between but waited for a CPU most of its busiest second (one stream under a quota).
        (end(runnable_ratio=0.88, wait_ratio=0.87, cpu_cores=0.01), end(), "tcp", None, ("sender_cpu", "cpus")),
        (end(runnable_ratio=0.3, wait_ratio=0.2), end(), "tcp", None, ("none", "")),
        # Without schedstat: CPU time against what the process could use.
        (end(runnable_ratio=None, cpu_cores=0.93), end(), "tcp", None, ("sender_cpu", "one_thread")),
        (end(runnable_ratio=None, cpu_cores=0.5), end(), "tcp", None, ("none", "")),
        # A UDP test's loss that the receiver dropped itself; drops that are a sliver of the loss do not.
        (end(), end(udp_receive_drops=11604), "udp", 11604, ("receiver_drops", "receive_buffer")),
        (end(), end(udp_receive_drops=5), "udp", 10_000, ("none", "")),
        # An end without figures is unknown, never "not bound"; a bound the other end shows still counts.
        (end(), None, "tcp", None, ("unknown", "")),
        (end(runnable_ratio=None, cpu_cores=None), end(), "tcp", None, ("unknown", "")),
        (end(runnable_ratio=0.99, cpu_cores=0.98), None, "tcp", None, ("sender_cpu", "one_thread")),
    ],
)  # fmt: skip
def test_the_verdict_names_the_end_that_bound_the_test_and_what_lifts_it(
    sender: EndFigures | None, receiver: EndFigures | None, protocol: str, lost: int | None, verdict: tuple[str, str]
) -> None:
    limit, remedy = verdict
    bound = judge(protocol, sender, receiver, lost)
    assert (bound.limit, bound.remedy) == (limit, remedy)
    assert bound.host_bound == (limit in ends.HOST_LIMITS)
    assert limit in ends.LIMITS and (not remedy or remedy in ends.REMEDIES)


def test_a_busiest_second_is_taken_not_the_average_of_a_test_that_ramps_up() -> None:
    watch = ends.EndWatch(1, "3.12", pids=[1])
    # One thread idle for two seconds, then never waiting for three.
    for i in range(51):
        t = i * 0.1
        busy = max(0.0, t - 2.0)
        watch.samples.append(ends._Sample(t, {(1, 1): (int(busy * 0.7e9), int(busy * 0.3e9))}, {}))
    figures = watch.figures()
    assert figures.runnable_ratio == pytest.approx(1.0, abs=0.01)
    assert figures.cpu_cores == pytest.approx(0.7, abs=0.01)


def test_steal_is_the_hosts_share_over_the_whole_test() -> None:
    watch = ends.EndWatch(1, "3.12", pids=[1])
    # Two CPUs over 4 s at 100 ticks a second: cpu0 stolen 30 ticks a second in the last two, cpu1 never.
    for i in range(41):
        t = i * 0.1
        stolen = int(30 * max(0.0, t - 2.0))
        cpus = {"cpu0": (0, stolen, int(100 * t)), "cpu1": (0, 0, int(100 * t))}
        watch.samples.append(ends._Sample(t, {(1, 1): (0, 0)}, cpus))
    steal = watch.figures().steal_ratio
    assert steal == pytest.approx(60 / 800, abs=0.005)
    assert end(steal_ratio=steal).remedy() is None
    assert end(steal_ratio=ends.STEAL_BOUND).remedy() == "steal"


def test_a_test_too_short_to_judge_has_no_figures() -> None:
    watch = ends.EndWatch(1, "3.12", pids=[1])
    watch.samples = [ends._Sample(t, {(1, 1): (0, 0)}, {}) for t in (0.0, 0.1)]
    assert not watch.figures().known


def test_a_peers_report_is_checked_field_by_field() -> None:
    good = {
        "iperf3": {"version": "3.18", "ports": [5201, 5202]},
        "ended_seconds_ago": 0.3,
        "end": end(runnable_ratio=0.99).to_json(),
    }
    parsed = peer_end.parse(json.dumps(good).encode(), test_seconds=3)
    assert parsed.end == end(runnable_ratio=0.99) and parsed.ports == (5201, 5202) and parsed.version == "3.18"
    assert parsed.rejected is None
    bad = [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps(good | {"iperf3": {"version": "3.12; rm -rf", "ports": []}}).encode(), "iperf3.version"),
        (json.dumps(good | {"iperf3": {"version": "3.12", "ports": [0, 70000]}}).encode(), "iperf3.ports"),
        (json.dumps(good | {"ended_seconds_ago": -1}).encode(), "ended_seconds_ago"),
        (json.dumps(good | {"ended_seconds_ago": 30}).encode(), "before this one began"),
        (json.dumps(good | {"end": {**good["end"], "runnable_ratio": 1e9}}).encode(), "end: runnable_ratio"),
        (json.dumps(good | {"end": {**good["end"], "cpu_cores": float("nan")}}).encode(), "end: cpu_cores"),
        (json.dumps(good | {"end": {**good["end"], "udp_receive_drops": 2**70}}).encode(), "end: udp_receive_drops"),
        (json.dumps(good | {"end": {**good["end"], "udp_receive_drops": 1.5}}).encode(), "end: udp_receive_drops"),
        (json.dumps(good | {"end": {**good["end"], "cpus": True}}).encode(), "end: cpus"),
        (json.dumps(good | {"end": {**good["end"], "steal_ratio": 1.2}}).encode(), "end: steal_ratio"),
        (json.dumps(good | {"end": "everything"}).encode(), "end: not an object"),
    ]
    for body, reason in bad:
        parsed = peer_end.parse(body, test_seconds=3)
        assert parsed.end is None and parsed.rejected is not None and reason in parsed.rejected, (body, parsed)
    nothing = peer_end.parse(json.dumps({"iperf3": {"version": None, "ports": []}, "end": None}).encode(), 3)
    assert nothing.end is None and nothing.rejected is None and nothing.reported
