"""RTT quantiles: configured vs what the probe measured (raw samples) vs what /metrics and
so the dashboards show (the exporter's windowed quantiles, which the recording rules pass
through unchanged) vs what the old histogram (30 buckets + histogram_quantile) showed.

Run as root: .venv/bin/python bench/rtt_quantiles.py [--seconds 60]   (builds a lab; ~2 min)
Target: dashboard within 0.5% (or 0.05 ms, whichever is larger) of the raw
quantile over the same window, 0.1 to 300 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PATHPROBE = [sys.executable, "-m", "pathprobe"]
DELAYS_MS = (0.5, 8, 74, 150)  # round trip
OLD_BUCKETS = (
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.010, 0.0125, 0.015,
    0.020, 0.025, 0.030, 0.040, 0.050, 0.060, 0.080, 0.100, 0.150, 0.200,
    0.300, 0.500, 1.0, 2.5, 5.0,
)  # fmt: skip
TOPOLOGY = (
    "hosts:\n  - {name: src, region: r0}\n"
    + "".join(f"  - {{name: d{i}, region: r{i + 1}}}\n" for i in range(len(DELAYS_MS)))
    + "paths:\n"
    + "".join(f"  - {{between: [src, d{i}], one_way_delay: {ms / 2:g}ms}}\n" for i, ms in enumerate(DELAYS_MS))
)


def histogram_quantile(q: float, samples: list[float]) -> float:
    """What Prometheus's histogram_quantile made of the old buckets (linear inside a bucket)."""
    counts = [0] * (len(OLD_BUCKETS) + 1)
    for s in samples:
        counts[bisect.bisect_left(OLD_BUCKETS, s)] += 1
    rank, seen = q * len(samples), 0
    for i, c in enumerate(counts):
        if seen + c >= rank and c:
            lo = OLD_BUCKETS[i - 1] if i else 0.0
            hi = OLD_BUCKETS[i] if i < len(OLD_BUCKETS) else OLD_BUCKETS[-1]
            return lo + (hi - lo) * (rank - seen) / c
        seen += c
    return OLD_BUCKETS[-1]


async def measure(address: str, seconds: float) -> dict[str, float]:
    """Inside the source host: one RTT prober teed into raw samples and an exporter's RTT room."""
    from types import SimpleNamespace

    from pathprobe.config import Config
    from pathprobe.kinds import KINDS
    from pathprobe.metrics.echo import EchoRoom
    from pathprobe.metrics.outcomes import OutcomesRoom
    from pathprobe.metrics.rtt import RttRecorder, RttRoom
    from pathprobe.probe_settings import RttSettings
    from pathprobe.probes import RttProber, Target
    from pathprobe.probes.report import ReportSink, RttReport, Summary
    from pathprobe.probes.rtt import RttTee

    settings = RttSettings()
    raw = RttReport("tcp", settings.interval_seconds, settings.size_bytes)
    peer = {"name": "d", "address": address, "region": "r", "path_class": "intra_region"}
    cfg = Config.model_validate({"host": {"name": "s", "address": "127.0.0.1", "region": "r"}, "peers": [peer]})
    room = RttRoom(cfg, SimpleNamespace(of=lambda peer, now: "idle"))
    count = int(seconds / settings.interval_seconds)
    exporter_sink = RttRecorder(
        room, OutcomesRoom(cfg, KINDS.values()).ledger("rtt"), EchoRoom(cfg, room.load, room), "d", 1
    )
    sink = RttTee(ReportSink(raw), exporter_sink)
    await RttProber(Target(address, 9470), settings, sink).run(count=count)
    shown = room.windows["d", "tcp", "idle"].quantiles(time.time())
    s = Summary.of(raw.rtts)
    assert s is not None
    return {
        "n": len(raw.rtts),
        "raw_p50": s.p50,
        "raw_p99": s.p99,
        "shown_p50": shown[0.5],
        "shown_p99": shown[0.99],
        "old_p50": histogram_quantile(0.5, raw.rtts),
        "old_p99": histogram_quantile(0.99, raw.rtts),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(asyncio.run(measure(args.inner, args.seconds))))
        return
    if os.geteuid() != 0:
        sys.exit("run as root: the bench builds a lab of network namespaces")
    with tempfile.TemporaryDirectory() as tmp:
        topo = Path(tmp) / "topology.yaml"
        topo.write_text(TOPOLOGY)
        subprocess.run([*PATHPROBE, "lab", "up", "--topology", str(topo)], check=True, capture_output=True)
        servers = []
        try:
            for i in range(len(DELAYS_MS)):
                addr = f"198.18.{i + 2}.2"
                servers.append(
                    subprocess.Popen(
                        [
                            "ip",
                            "netns",
                            "exec",
                            f"pp-d{i}",
                            *PATHPROBE,
                            "serve",
                            "--listen",
                            addr,
                            "--allow",
                            "198.18.0.0/15",
                            "--iperf3-port",
                            "15201",
                        ],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                    )
                )
                assert servers[-1].stdout is not None and servers[-1].stdout.readline()  # ready
            rows = []
            for i, ms in enumerate(DELAYS_MS):
                out = subprocess.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        "pp-src",
                        sys.executable,
                        __file__,
                        "--inner",
                        f"198.18.{i + 2}.2",
                        "--seconds",
                        str(args.seconds),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                rows.append((ms, json.loads(out)))
        finally:
            for p in servers:
                p.terminate()
                p.wait(timeout=10)
            subprocess.run([*PATHPROBE, "lab", "down"], check=False, capture_output=True)

    def err(shown: float, raw: float) -> str:
        return f"{(shown - raw) * 1e3:+.3f} ms ({(shown - raw) / raw:+.2%})"

    print(f"{'RTT':>8} {'n':>5} {'q':>4} {'raw':>10} {'dashboard (now)':>30} {'meets':>6} {'old histogram':>30}")
    for ms, r in rows:
        for q in ("p50", "p99"):
            raw, shown, old = r[f"raw_{q}"], r[f"shown_{q}"], r[f"old_{q}"]
            ok = abs(shown - raw) <= max(0.005 * raw, 50e-6)
            print(
                f"{ms:>6g}ms {r['n']:>5} {q:>4} {raw * 1e3:>8.3f}ms {err(shown, raw):>30} {'yes' if ok else 'NO':>6} "
                f"{err(old, raw):>30}"
            )
    print("\nseries per peer: see bench/exporter_bench.py (exposition lines / 500 peers)")


if __name__ == "__main__":
    main()
