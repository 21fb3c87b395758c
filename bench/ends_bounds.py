"""Where a test's own end binds it: the figures ends.py judges by, for a sender held to a small CPU
quota and for a healthy sender on a machine whose cores are busy with other work.

Two lab hosts, a path of RATE with 4 ms each way; the sender's iperf3 alone in a cgroup with the
quota of each case (LabHost.iperf3_cpu; none: no quota), BUSY processes spinning beside it at the
same priority (other load on the host). Each case runs RUNS iperf3 tests of 1 and 4 streams (3 s,
fixed length) and reads the sender's end as the exporter does (ends.EndWatch): in its busiest second,
the busiest thread's share of time on or waiting for a CPU (runnable), of time waiting on a run
queue (wait), and the process's CPU time; then the verdict. ends.py's bounds (RUNNABLE_BOUND 0.9,
WAIT_BOUND 0.5) must part the two kinds of row with a margin.

Run as root: .venv/bin/python bench/ends_bounds.py [--runs N]   (about 4 minutes; builds its own
two-host lab in 198.18.0.0/15 and removes it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import yaml

from pathprobe import ends
from pathprobe_lab import cpu, net
from pathprobe_lab.state import in_ns, ns
from pathprobe_lab.topology import Topology, address

# (the path's rate, the sender's CPU quota in CPUs or None, processes spinning beside it)
CASES = (("500M", 0.005, 0), ("500M", 0.005, 2), ("150M", None, 0), ("150M", None, 2), ("500M", None, 4))
SPIN_SECONDS = 60  # a spinner ends by itself, whatever happens to this script


def topology(rate: str, quota: float | None) -> Topology:
    held = f", iperf3_cpu: {quota}" if quota else ""
    return Topology.model_validate(
        yaml.safe_load(f"""
hosts:
  - {{name: src, region: r1{held}}}
  - {{name: dst, region: r2}}
paths:
  - {{between: [src, dst], rate: {rate}, one_way_delay: 4ms}}
""")
    )


def one_test(binary: str, streams: int) -> tuple[float, ends.EndFigures]:
    """An iperf3 test from src, its sender's end watched: (Mbit/s received, the end's figures)."""
    cmd = in_ns(ns("src"), [binary, "-c", address(2), "-t", "3", "-P", str(streams), "-J"])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    watch = ends.EndWatch(streams, "3.12")
    watch.start([proc.pid])  # ip netns exec, then the wrapper, exec iperf3: one pid throughout
    while proc.poll() is None:
        time.sleep(ends.SAMPLE_SECONDS)
        watch.sample()
    watch.stop()
    assert proc.stdout is not None
    received = json.loads(proc.stdout.read())["end"]["sum_received"]["bits_per_second"]
    return received / 1e6, watch.figures()


def measure(rate: str, quota: float | None, busy: int, runs: int) -> list[str]:
    topo = topology(rate, quota)
    net.up(topo)
    spinners = [
        subprocess.Popen(["timeout", str(SPIN_SECONDS), "sh", "-c", "while :; do :; done"]) for _ in range(busy)
    ]
    rows = []
    try:
        server = subprocess.Popen(in_ns(ns("dst"), ["iperf3", "-s"]), stdout=subprocess.DEVNULL)
        time.sleep(0.5)  # iperf3 -s listens within milliseconds; a refused first test would say so
        binary = str(cpu.wrapper("src")) if quota else "iperf3"
        for _ in range(runs):
            for streams in (1, 4):
                mbps, end = one_test(binary, streams)
                verdict = end.remedy() or ("bound" if end.cpu_bound() else "headroom")
                rows.append(
                    f"{rate:>5} {quota or '-':>6} {busy:>4} {streams:>7} {mbps:>7.0f} {end.runnable_ratio or 0:>8.2f} "
                    f"{end.wait_ratio or 0:>5.2f} {end.cpu_cores or 0:>6.3f}  {verdict}"
                )
        server.terminate()
        server.wait()
    finally:
        for spinner in spinners:
            spinner.terminate()  # timeout passes SIGTERM on to its spinner
            spinner.wait()
        net.down()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="tests of each stream count per case")
    args = parser.parse_args()
    rows = [row for case in CASES for row in measure(*case, args.runs)]
    print(f"\nthe sender's end in its busiest second; {args.runs} runs of each; verdict (the end's remedy where bound)")
    head = (
        ("rate", 5),
        ("quota", 6),
        ("busy", 4),
        ("streams", 7),
        ("Mbit/s", 7),
        ("runnable", 8),
        ("wait", 5),
        ("cpu", 6),
    )
    print(" ".join(f"{name:>{width}}" for name, width in head) + "  verdict")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
