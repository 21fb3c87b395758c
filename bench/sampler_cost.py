"""The steady-state sampler's CPU, both ways, in one run: the prober's sampler (probes/throughput.py)
reads a real iperf3 test's delivered bytes every 0.1 s on loopback, once through sock_diag netlink
in-process (sockdiag.py, the default) and once through `ss -tin` started at each sample (the
fallback where netlink is refused: netlink is refused here on purpose). The CPU is this process's
and its reaped children's (the `ss` processes) over the test, iperf3's own excluded.

Run: .venv/bin/python bench/sampler_cost.py [--seconds 5] [--runs 3]   (about 30 s; loopback only,
no root; needs iperf3). Target: the sampler's CPU per test second well below
the `ss` way's.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import socket
import statistics
import subprocess
import time

from pathprobe import sockdiag
from pathprobe.probes import Target, ThroughputTest
from pathprobe.probes.iperf3_run import Part, SteadyState
from pathprobe.probes.steady import Detector


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def one_test(seconds: float) -> tuple[int, float]:
    """(samples, CPU seconds) of the sampler over one loopback iperf3 test of `seconds`."""
    iperf3 = shutil.which("iperf3")
    assert iperf3, "needs iperf3"
    port = free_port()
    server = subprocess.Popen([iperf3, "-s", "-1", "-B", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):  # the server's readiness: its port accepts
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        # A stand-in process (never signalled to stop: the detector may converge, the test runs on).
        idle = await asyncio.create_subprocess_exec("sleep", str(seconds + 5))
        client = subprocess.Popen(
            [iperf3, "-c", "127.0.0.1", "-p", str(port), "-t", f"{seconds:g}", "-b", "200M"], stdout=subprocess.DEVNULL
        )
        watch = SteadyState([Part(Target("127.0.0.1", port), ThroughputTest(steady_state=Detector()))], [idle])
        before = cpu_seconds()
        sampling = asyncio.ensure_future(watch.sample())
        await asyncio.sleep(seconds)
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
        used = cpu_seconds() - before  # before iperf3 is reaped: its CPU is not counted
        idle.kill()
        await idle.wait()
        client.wait(timeout=30)
        return len(watch.samples), used
    finally:
        server.kill()
        server.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="each test's length")
    parser.add_argument("--runs", type=int, default=3, help="tests per reader")
    args = parser.parse_args()
    reading = sockdiag.tcp_sockets

    def refused(address: str, port: int) -> list[sockdiag.SocketBytes]:
        raise PermissionError(1, "refused for the bench")

    rows = []
    for reader in ("sock_diag", "ss"):
        sockdiag.tcp_sockets = reading if reader == "sock_diag" else refused  # type: ignore[assignment]
        results = [asyncio.run(one_test(args.seconds)) for _ in range(args.runs)]
        per_sample = [cpu / n for n, cpu in results]
        rows.append(
            (
                reader,
                sum(n for n, _ in results),
                statistics.median(per_sample),
                statistics.median(cpu / args.seconds for _, cpu in results),
            )
        )
    sockdiag.tcp_sockets = reading  # type: ignore[assignment]
    print(f"\nsampler CPU, {args.runs} loopback tests of {args.seconds:g} s per reader ({time.strftime('%Y-%m-%d')})\n")
    print("| reader | samples | CPU per sample (median) | CPU per test second (median) |")
    print("| --- | ---: | ---: | ---: |")
    for reader, samples, per_sample, per_second in rows:
        print(f"| {reader} | {samples} | {per_sample * 1e3:.2f} ms | {per_second:.1%} of a core |")
    ratio = rows[1][3] / rows[0][3]
    print(f"\nsock_diag costs 1/{ratio:.0f} of `ss`'s CPU per test second")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
