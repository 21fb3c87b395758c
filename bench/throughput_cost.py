"""Throughput probe cost: a test that stops at its steady state against a 10 s test, in bytes.

For each RTT (1, 8, 74, 150 ms), lab rate (200 Mbit/s, 500 Mbit/s) and stream count (1, 4):
a plain 10 s iperf3 test (its steady state: the mean of its last 5 s; the bytes it moved)
and `pathprobe probe throughput` with its defaults as shipped (steady state on, at most the
default 5 s) and the path's RTT as its hint, as the exporter gives it its RTT probe's (the
rate it converged on, the bytes, the time, whether it converged). The steady state is what the
server acknowledged over the 10 s test's last 5 s, as the prober reads it (`ss -tin`), not
iperf3's sender-side intervals (writes into a 32 MiB buffer, bursty with several streams:
bench/steady_acked.py compares the two). Both ends have 32 MiB buffers, so the shaper
binds, not a window.

Run as root: .venv/bin/python bench/throughput_cost.py [--record DIR]   (about 6 minutes;
builds its own two-host lab in 198.18.0.0/15 and removes it). --record keeps each 10 s
test's interval lines (iperf3 -i 0.1 -f k) as a trace (exporter/tests/fixtures/traces
holds one set). --replay DIR runs no test: the detector's decision on each recorded trace
against that trace's own last 5 s (seconds, no lab; to try a detector change; these are
iperf3's intervals, what the prober falls back on where no socket shows delivered bytes).
Target: within 2% of the steady state using at most 25% of a 10 s test's bytes,
on every row up to 150 ms; rows that miss are marked.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml

from pathprobe import sockdiag
from pathprobe.probes import steady as steady_state
from pathprobe.probes.throughput import classify_error
from pathprobe_lab import net, shaping
from pathprobe_lab.state import State, in_ns, ns
from pathprobe_lab.topology import PathSpec, Topology, address

PATHPROBE = [sys.executable, "-m", "pathprobe"]
TOPOLOGY = Topology.model_validate(
    yaml.safe_load("""
hosts:
  - {name: src, region: r1, tcp_rmem_max: 33554432, tcp_wmem_max: 33554432}
  - {name: dst, region: r2, tcp_rmem_max: 33554432, tcp_wmem_max: 33554432}
""")
)
DST = address(2)
T = TypeVar("T")
RTTS, RATES, STREAMS = (0.001, 0.008, 0.074, 0.150), (200e6, 500e6), (1, 4)


def in_src(cmd: list[str]) -> str:
    proc = subprocess.run(in_ns(ns("src"), cmd), capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd}: {proc.stderr.strip() or proc.stdout[-300:]}")
    return proc.stdout


def shape(rate: float, rtt: float) -> None:
    state = State.load()
    assert state is not None
    cls = state.spec("src", "dst").path_class
    shaping.set_path(state, "src", "dst", PathSpec(rate, rtt / 2, 0.0, cls))
    shaping.set_path(state, "dst", "src", PathSpec(None, rtt / 2, 0.0, cls))


def sample_delivered(stop: threading.Event, out: list[tuple[float, int, int]]) -> None:
    """(seconds, bytes the server acknowledged, bytes sent) on every connection to it, every
    0.1 s, as the prober reads them (probes/steady.py; `ss` here: this process is outside src's namespace)."""
    cmd = in_ns(ns("src"), ["ss", "-tinH", "state", "established", "dst", DST, "dport", "= :5201"])
    while not stop.is_set():
        at = time.monotonic()
        sockets = sockdiag.parse_ss(subprocess.run(cmd, capture_output=True, text=True, check=False).stdout)
        out.append((at, steady_state.delivered_bytes(sockets, "send"), steady_state.wire_bytes(sockets, "send")))
        time.sleep(max(0.0, 0.1 - (time.monotonic() - at)))


def with_delivered(cmd: list[str]) -> tuple[str, list[steady_state.Interval], int]:
    """Run `cmd` in src (an iperf3 client) while sampling what it delivered: (its output, the
    delivered intervals, the bytes it put on the wire)."""
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_delivered, args=(stop, samples))
    sampler.start()
    try:
        out = in_src(cmd)
    finally:
        stop.set()
        sampler.join()
    return (
        out,
        steady_state.delivered_intervals([(t, n) for t, n, _ in samples]),
        max((w for *_, w in samples), default=0),
    )


def retried(run: Callable[[], T]) -> T:
    """`run`, again while the server is still closing the previous test (busy; iperf3 3.12 also
    resets a client that connects while it reopens its socket)."""
    for attempt in range(5):
        try:
            return run()
        except RuntimeError as exc:
            if classify_error(str(exc)) != "busy" or attempt == 4:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


def row(rate: float, rtt: float, streams: int, record: Path | None) -> list[str]:
    client = ["iperf3", "-c", DST, "-t", "10", "-i", "0.1", "-f", "k", "-P", str(streams)]
    trace, delivered, wire = retried(lambda: with_delivered(client))
    if record is not None:
        name = f"rtt{rtt * 1e3:g}ms-{rate / 1e6:g}M-P{streams}.txt"
        (record / name).write_text(f"streams {streams} rtt {rtt:g}\n{trace}")
        # What the prober's detector reads: the delivered bytes' intervals (start end bits/s).
        lines = "".join(f"{i.start:.3f} {i.end:.3f} {i.bits_per_second:.0f}\n" for i in delivered)
        (record / "delivered" / name).write_text(f"streams {streams} rtt {rtt:g}\n{lines}")
    intervals = [i for line in trace.splitlines() if (i := steady_state.parse_interval(line, streams))]
    # The steady state: what the server acknowledged over the test's last 5 s (the measure the
    # prober's detector reads).
    end = min(delivered[-1].end, 10.0)
    steady = steady_state.mean_rate(delivered, end - 5, end) or 0.0
    full_bytes = wire or sum(i.bits_per_second * i.seconds for i in intervals) / 8  # on the wire, as the prober counts
    probe = [*PATHPROBE, "probe", "throughput", DST, "-P", str(streams), "--rtt-hint", f"{rtt:g}", "--json"]
    got = json.loads(retried(lambda: in_src(probe)))
    measured = got["receiver_bytes_per_second"] * 8
    off = measured / steady - 1
    share = got["bytes_transferred"] / full_bytes
    checks = (
        (abs(off) > 0.02, "off by more than 2%"),
        (share > 0.25, "more than 25% of the bytes"),
        (not got["converged"], "never settled"),
    )
    missed = [why for bad, why in checks if bad]
    return [
        f"{rtt * 1e3:g}",
        f"{rate / 1e6:g}",
        str(streams),
        f"{steady / 1e6:.1f}",
        f"{measured / 1e6:.1f}",
        f"{off:+.1%}",
        f"{got['duration_seconds']:.2f}",
        f"{share:.0%}",
        ", ".join(missed) or "met",
    ]


def replayed(trace: Path) -> list[str]:
    """A recorded 10 s trace's row: where the detector would have stopped it."""
    first, *lines = trace.read_text().splitlines()
    _, streams, _, rtt = first.split()
    intervals = [i for line in lines if (i := steady_state.parse_interval(line, int(streams)))]
    end = intervals[-1].end
    steady = steady_state.mean_rate(intervals, end - 5, end) or 0.0
    stop = steady_state.Detector().replay(intervals, float(rtt))
    if stop is None:
        return [f"{float(rtt) * 1e3:g}", trace.stem, streams, f"{steady / 1e6:.1f}", *["-"] * 4, "never settled"]
    seconds, rate = stop
    off = rate / steady - 1
    share = (steady_state.mean_rate(intervals, 0, seconds) or 0.0) * seconds / (steady * 10)
    checks = ((abs(off) > 0.02, "off by more than 2%"), (share > 0.25, "more than 25% of the bytes"))
    missed = [why for bad, why in checks if bad]
    return [
        f"{float(rtt) * 1e3:g}",
        trace.stem,
        streams,
        f"{steady / 1e6:.1f}",
        f"{rate / 1e6:.1f}",
        f"{off:+.1%}",
        f"{seconds:.2f}",
        f"{share:.0%}",
        ", ".join(missed) or "met",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", type=Path, help="keep the 10 s tests' interval lines here")
    parser.add_argument("--replay", type=Path, help="replay the detector on the traces recorded here (no lab)")
    args = parser.parse_args()
    if args.replay:
        print_table([replayed(t) for t in sorted(args.replay.glob("*.txt"))], "trace")
        return 0
    if args.record:
        (args.record / "delivered").mkdir(parents=True, exist_ok=True)
    net.up(TOPOLOGY)
    serve = subprocess.Popen(
        in_ns(ns("dst"), [*PATHPROBE, "serve", "--listen", DST, "--allow", "198.18.0.0/15"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    rows = []
    try:
        assert serve.stdout is not None and serve.stdout.readline()  # ready
        for rtt in RTTS:
            for rate in RATES:
                shape(rate, rtt)
                for streams in STREAMS:
                    try:
                        rows.append(row(rate, rtt, streams, args.record))
                    except RuntimeError as exc:  # a failed test is a row of its own, not the end of the bench
                        rows.append(
                            [f"{rtt * 1e3:g}", f"{rate / 1e6:g}", str(streams), *["-"] * 5, f"failed: {str(exc)[-80:]}"]
                        )
                    print(" ".join(rows[-1]), file=sys.stderr, flush=True)
    finally:
        serve.terminate()
        serve.wait(timeout=10)
        net.down()
    print_table(rows, "Mbit/s")
    return 0


def print_table(rows: list[list[str]], second: str) -> None:
    head = ["RTT ms", second, "P", "10 s steady", "stopped at", "off", "took s", "bytes", "target"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    print(f"{sum(r[-1] == 'met' for r in rows)} of {len(rows)} rows met the target")


if __name__ == "__main__":
    raise SystemExit(main())
