"""What one iperf3 process and several reach through a lab path with no shaper, and what each end's
CPU pays per Gbit/s: the probe's own ceiling per core.

Two lab hosts joined by the lab's router, nothing shaping the path: `pathprobe serve
--iperf3-processes N` on one, `pathprobe probe throughput --processes P` from the other (a test of
STREAMS streams split over P processes, each on a server of its own; pathprobe splits only where
an end's iperf3 is older than 3.16, which runs every stream of a process on one thread). For the
host's iperf3 and, where the Debian 13 root filesystem of the deployment tests exists, Debian 13's
3.18 (run in that root by chroot): RUNS fixed-length tests of each (5 s after 1 s omitted), the
receiver's Gbit/s (mean and range), each end's CPU in its busiest second (cores, from the kernel's
schedstat: ends.py), and cores per Gbit/s each way. Both ends share this machine's cores, so
the sum of the two is what one host would need for both roles, and a run is bound by the machine
as soon as the two add up to its cores: the `bound` column says which end the test named.

Run as root: .venv/bin/python bench/iperf3_processes.py [--runs N]   (about 3 minutes; builds its
own two-host lab in 198.18.0.0/15 and removes it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from throughput_cost import DST, PATHPROBE, TOPOLOGY, in_src, retried  # the same two-host lab and its test runner

from pathprobe_lab import net
from pathprobe_lab.state import in_ns, ns

STREAMS = 4
PROCESSES = (1, 2)
TRIXIE = Path("/var/tmp/pathprobe-rootfs/trixie-amd64")  # tests/rootfs.py's Debian 13 (iperf3 3.18)


def iperf3_binaries(work: Path) -> dict[str, str]:
    """The iperf3s to measure: the host's, and Debian 13's through a wrapper that runs it in its root."""
    found = {"host": "iperf3"}
    if (TRIXIE / "usr" / "bin" / "iperf3").exists():
        wrapper = work / "iperf3-trixie"
        wrapper.write_text(f'#!/bin/sh\nexec chroot {TRIXIE} /usr/bin/iperf3 "$@"\n')
        wrapper.chmod(0o755)
        found["Debian 13"] = str(wrapper)
    return found


def one_test(binary: str, processes: int) -> dict:
    out = retried(
        lambda: in_src(
            [
                *PATHPROBE,
                "probe",
                "throughput",
                DST,
                "-P",
                str(STREAMS),
                "--processes",
                str(processes),
                "--fixed-length",
                "-t",
                "5s",
                "-O",
                "1s",
                "--iperf3",
                binary,
                "--json",
            ]
        )
    )
    return json.loads(out)


def measure(binary: str, runs: int) -> list[dict]:
    rows = []
    serve = subprocess.Popen(
        in_ns(
            ns("dst"),
            [
                *PATHPROBE,
                "serve",
                "--listen",
                DST,
                "--allow",
                "198.18.0.0/15",
                "--iperf3",
                binary,
                "--iperf3-processes",
                str(max(PROCESSES)),
            ],
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert serve.stdout is not None
        while "pathprobe serve:" not in (line := serve.stdout.readline()):
            if not line:
                raise RuntimeError("pathprobe serve did not start")
        for processes in PROCESSES:
            results = [one_test(binary, processes) for _ in range(runs)]
            rows.append({"processes": processes, "results": results})
    finally:
        serve.terminate()
        serve.wait(timeout=10)
    return rows


def summary(name: str, row: dict) -> str:
    results = row["results"]
    gbps = [r["receiver_bytes_per_second"] * 8e-9 for r in results]
    version = results[0]["sender_end"]["iperf3_version"]
    ran = {r["sender_end"]["processes"] for r in results}

    def cores(end: str) -> float:
        return statistics.mean(r[end]["cpu_cores"] for r in results if r.get(end))

    bound = ",".join(sorted({r["bound"] for r in results}))
    sender, receiver = cores("sender_end"), cores("receiver_end")
    mean = statistics.mean(gbps)
    return (
        f"{name + ' ' + version:<16} {row['processes']:>5} {'/'.join(map(str, sorted(ran))):>4} {mean:>7.2f} "
        f"{min(gbps):>6.2f}-{max(gbps):<6.2f} {sender:>7.2f} {receiver:>8.2f} {sender / mean:>9.3f} "
        f"{receiver / mean:>9.3f}  {bound}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="tests of each row")
    args = parser.parse_args()
    net.up(TOPOLOGY)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            measured = {name: measure(binary, args.runs) for name, binary in iperf3_binaries(Path(tmp)).items()}
    finally:
        net.down()
    print(
        f"\n{STREAMS} TCP streams, src -> dst through the lab's router, no shaper; {args.runs} runs a row; "
        f"CPU in each end's busiest second"
    )
    print(
        f"{'iperf3':<16} {'asked':>5} {'ran':>4} {'Gbit/s':>7} {'range':>13} {'snd cpu':>7} {'rcv cpu':>8} "
        f"{'snd/Gbit':>9} {'rcv/Gbit':>9}  bound"
    )
    for name, rows in measured.items():
        for row in rows:
            print(summary(name, row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
