"""Measured: the steady-state detector (probes/steady.py) fed with the bytes
the receiver acknowledged (the kernel's tcpi_bytes_acked of the test's sockets, read with
`ss -tin` every 0.1 s) instead of iperf3's sender-side intervals (what the prober reads today).

For each RTT (1, 8, 74, 150 ms), lab rate (200, 500 Mbit/s) and stream count (1, 4): one 10 s
iperf3 test, both measures sampled during it; for each measure, where the detector would have
stopped the test (replayed on the samples), its rate against that measure's own steady state
(the test's last 5 s), and the share of the 10 s test's bytes moved by then.
Target: within 2% using at most 25% of the bytes.

Run as root: .venv/bin/python bench/steady_acked.py   (about 4 minutes; its own two-host lab)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from throughput_cost import DST, RATES, RTTS, STREAMS, TOPOLOGY, shape, with_delivered

from pathprobe.probes.steady import Detector, Interval, mean_rate, parse_interval
from pathprobe_lab import net
from pathprobe_lab.state import in_ns, ns


def judged(intervals: list[Interval], rtt: float) -> list[str]:
    """[off, took, share] of the detector's stop on these intervals against their last 5 s."""
    end = intervals[-1].end
    steady = mean_rate(intervals, end - 5, end) or 0.0
    stop = Detector().replay(intervals, rtt)
    if stop is None or not steady:
        return ["never settled", "-", "-"]
    seconds, rate = stop
    share = (mean_rate(intervals, 0, seconds) or 0.0) * seconds / (steady * end)
    return [f"{rate / steady - 1:+.1%}", f"{seconds:.2f}", f"{share:.0%}"]


def row(rtt: float, rate: float, streams: int) -> list[str]:
    head = [f"{rtt * 1e3:g}", f"{rate / 1e6:g}", str(streams)]
    client = ["iperf3", "-c", DST, "-t", "10", "-i", "0.1", "-f", "k", "-P", str(streams)]
    for attempt in range(5):  # the server may still be closing the previous test (busy)
        try:
            out, delivered, _ = with_delivered(client)
            break
        except RuntimeError as exc:
            if "busy" not in str(exc) or attempt == 4:
                return [*head, f"failed: {str(exc)[-60:]}", "-", "-", "-", "-", "-"]
            time.sleep(1)
    sent = [i for line in out.splitlines() if (i := parse_interval(line, streams))]
    acked = [i for i in delivered if i.end <= 10.0]
    if not sent or not acked:
        return [*head, "failed: no intervals", "-", "-", "-", "-", "-"]
    return [*head, *judged(sent, rtt), *judged(acked, rtt)]


def main() -> int:
    net.down()
    net.up(TOPOLOGY)
    server = subprocess.Popen(
        in_ns(ns("dst"), ["iperf3", "-s", "-B", DST]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    rows = []
    try:
        time.sleep(1)  # iperf3 -s has no readiness signal; a first test that finds it not listening retries
        for rtt in RTTS:
            for rate in RATES:
                shape(rate, rtt)
                for streams in STREAMS:
                    rows.append(row(rtt, rate, streams))
                    print(" ".join(rows[-1]), file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
        net.down()
    print("| RTT ms | Mbit/s | P | sender: off | took s | bytes | acked: off | took s | bytes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")

    def met(off: str, share: str) -> bool:
        return off.endswith("%") and abs(float(off[:-1])) <= 2 and float(share[:-1]) <= 25

    print(
        f"target met: sender intervals {sum(met(r[3], r[5]) for r in rows)} of {len(rows)}, "
        f"acknowledged bytes {sum(met(r[6], r[8]) for r in rows)} of {len(rows)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
