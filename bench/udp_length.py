"""UDP throughput tests: does their length decide what they read, and could they stop early as TCP
tests do (probes/steady.py)?

A UDP test sends at a set bitrate (throughput.udp_bitrate) and reads what arrived: the receiver's
rate and the loss ratio. For each case (a 74 ms lab path: below its rate with 1% loss, above its
rate with none) and each length (1, 2, 3, 5 s with no omitted second, and the default 5 s after
1 s omitted), `pathprobe probe throughput --protocol udp` is run REPEATS times; the reference is a
10 s test's mean. The table gives each length's mean, its spread between runs, how far it is from
the reference, and the bytes it sent against the reference's.

Run as root: .venv/bin/python bench/udp_length.py   (about 5 minutes; builds its own two-host lab
in 198.18.0.0/15 and removes it).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from throughput_cost import DST, PATHPROBE, TOPOLOGY, in_src, retried  # the same two-host lab and its test runner

from pathprobe_lab import net, shaping
from pathprobe_lab.state import State, in_ns, ns
from pathprobe_lab.topology import PathSpec

BITRATE = 100e6  # the default throughput.udp_bitrate
RTT = 0.074
# (what, the path's rate, its loss one way)
CASES = (("below the path's rate, 1% loss", 200e6, 0.01), ("above the path's rate (80 Mbit/s)", 80e6, 0.0))
# (length s, omitted s): the last is the default test (duration_seconds 5 after omit_seconds 1)
LENGTHS = ((1, 0), (2, 0), (3, 0), (5, 0), (5, 1))
REFERENCE = (10, 0)
REPEATS = 3


def shape(rate: float, loss: float) -> None:
    state = State.load()
    assert state is not None
    cls = state.spec("src", "dst").path_class
    shaping.set_path(state, "src", "dst", PathSpec(rate, RTT / 2, loss, cls))
    shaping.set_path(state, "dst", "src", PathSpec(None, RTT / 2, 0.0, cls))


def udp_test(seconds: int, omit: int) -> dict:
    """One `pathprobe probe throughput --protocol udp` from src."""
    cmd = [
        *PATHPROBE,
        "probe",
        "throughput",
        DST,
        "--protocol",
        "udp",
        "--bitrate",
        f"{BITRATE:.0f}bit/s",
        "-t",
        f"{seconds}s",
        "-O",
        f"{omit}s",
        "--json",
    ]
    return json.loads(retried(lambda: in_src(cmd)))


def runs(length: tuple[int, int]) -> tuple[list[float], list[float], float]:
    """REPEATS tests of `length`: receiver rates (bit/s), loss ratios, mean bytes sent."""
    results = [udp_test(*length) for _ in range(REPEATS)]
    return (
        [r["receiver_bytes_per_second"] * 8 for r in results],
        [r["udp_loss_ratio"] for r in results],
        statistics.mean(
            r["bytes_transferred"] * (r["duration_seconds"] + r["omit_seconds"]) / r["duration_seconds"]
            for r in results
        ),
    )  # on the wire: iperf3 leaves omitted seconds out


def rows_of(case: str) -> list[list[str]]:
    ref_rates, ref_losses, ref_bytes = runs(REFERENCE)
    ref_rate, ref_loss = statistics.mean(ref_rates), statistics.mean(ref_losses)
    out = [
        [
            case,
            f"{REFERENCE[0]} s",
            f"{ref_rate / 1e6:.1f}",
            f"{(max(ref_rates) - min(ref_rates)) / 1e6:.1f}",
            "",
            f"{ref_loss:.2%}",
            f"{max(ref_losses) - min(ref_losses):.2%}",
            "",
            "100%",
        ]
    ]
    for length in LENGTHS:
        rates, losses, sent = runs(length)
        rate, loss = statistics.mean(rates), statistics.mean(losses)
        name = f"{length[0]} s" + (f" after {length[1]} s" if length[1] else "")
        out.append(
            [
                "",
                name,
                f"{rate / 1e6:.1f}",
                f"{(max(rates) - min(rates)) / 1e6:.1f}",
                f"{rate / ref_rate - 1:+.1%}",
                f"{loss:.2%}",
                f"{max(losses) - min(losses):.2%}",
                f"{(loss - ref_loss) * 100:+.2f} pp",
                f"{sent / ref_bytes:.0%}",
            ]
        )
        print(" ".join(out[-1]), file=sys.stderr, flush=True)
    return out


def main() -> int:
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
        for case, rate, loss in CASES:
            shape(rate, loss)
            rows += rows_of(case)
    finally:
        serve.terminate()
        serve.wait(timeout=10)
        net.down()
    head = ["case", "length", "Mbit/s rcvd", "spread", "vs 10 s", "loss", "spread", "vs 10 s", "bytes"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    print(f"\n{REPEATS} tests per row, at {BITRATE / 1e6:g} Mbit/s over a {RTT * 1e3:g} ms lab path; spread: max - min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
