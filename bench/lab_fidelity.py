"""Lab fidelity: configured rate, delay and loss against what pathprobe measures,
next to plain iperf3 and ping on the same path.

Run as root: .venv/bin/python bench/lab_fidelity.py   (about 4 minutes; builds its own
two-host lab in 198.18.0.0/15 and removes it)
Targets (issue 3): throughput within 3% of the payload rate the shaper allows; RTT p50
within 0.5 ms + 2% of the configured RTT; loss within 0.2 percentage points at 1% over
at least 20,000 packets.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import yaml

from pathprobe_lab import net, shaping
from pathprobe_lab.state import State, in_ns, ns
from pathprobe_lab.topology import PathSpec, Topology, address

PATHPROBE = [sys.executable, "-m", "pathprobe"]
TOPOLOGY = Topology.model_validate(
    yaml.safe_load("""
hosts:
  - {name: src, region: r1}
  - {name: dst, region: r2}
""")
)
DST = address(2)


def in_src(cmd: list[str]) -> str:
    proc = subprocess.run(in_ns(ns("src"), cmd), capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd}: {proc.stderr.strip()}")
    return proc.stdout


def shape(rate: float | None, one_way: float, loss: float = 0.0) -> None:
    state = State.load()
    assert state is not None
    cls = state.spec("src", "dst").path_class
    shaping.set_path(state, "src", "dst", PathSpec(rate, one_way, loss, cls))
    shaping.set_path(state, "dst", "src", PathSpec(None, one_way, 0.0, cls))  # loss one way only


def payload(rate: float) -> float:
    return rate * 1448 / 1514  # TCP payload in a 1514-byte frame (MSS 1448 with timestamps)


def throughput_rows() -> list[list[str]]:
    rows = []
    for rate, one_way in ((200e6, 0), (500e6, 0), (1e9, 0), (2e9, 0), (500e6, 0.004), (500e6, 0.037)):
        shape(rate, one_way)
        pp = json.loads(in_src([*PATHPROBE, "probe", "throughput", DST, "-t", "4", "-O", "1", "-P", "4", "--json"]))
        ip = json.loads(in_src(["iperf3", "-c", DST, "-t", "4", "-O", "1", "-P", "4", "-J"]))
        got = pp["receiver_bytes_per_second"] * 8
        plain = ip["end"]["sum_received"]["bits_per_second"]
        want = payload(rate)
        rows.append([f"{rate / 1e6:g} Mbit/s, {2 * one_way * 1e3:g} ms RTT", f"{want / 1e6:.1f}",
                     f"{got / 1e6:.1f}", f"{(got - want) / want:+.2%}", f"{plain / 1e6:.1f}",
                     "ok" if abs(got - want) <= 0.03 * want else "MISS"])  # fmt: skip
    return rows


def rtt_rows() -> list[list[str]]:
    rows = []
    for rtt in (0.0005, 0.008, 0.020, 0.040, 0.074, 0.080):
        shape(None, rtt / 2)
        pp = json.loads(in_src([*PATHPROBE, "probe", "rtt", DST, "-c", "100", "-i", "0.05", "--json"]))
        echo = json.loads(in_src([*PATHPROBE, "probe", "loss", DST, "-c", "100", "--rate", "20", "--json"]))
        ping = in_src(["ping", "-q", "-c", "50", "-i", "0.05", DST])
        ping_avg = float(re.search(r"= [\d.]+/([\d.]+)/", ping).group(1)) / 1e3  # type: ignore[union-attr]
        p50, udp = pp["rtt_seconds"]["p50"], echo["rtt_seconds"]["p50"]
        allowed = 0.0005 + 0.02 * rtt
        ok = abs(p50 - rtt) <= allowed and abs(udp - rtt) <= allowed
        rows.append([f"{rtt * 1e3:g} ms", f"{p50 * 1e3:.3f}", f"{(p50 - rtt) * 1e3:+.3f}", f"{udp * 1e3:.3f}",
                     f"{(udp - rtt) * 1e3:+.3f}", f"{allowed * 1e3:.2f}", f"{ping_avg * 1e3:.3f}",
                     "ok" if ok else "MISS"])  # fmt: skip
    return rows


def loss_rows() -> list[list[str]]:
    rows = []
    for loss in (0.001, 0.01, 0.05):
        shape(None, 0.001, loss)
        pp = json.loads(in_src([*PATHPROBE, "probe", "loss", DST, "-c", "20000", "--rate", "1000",
                                "--timeout", "1", "--json"]))  # fmt: skip
        got = pp["loss_ratio"]
        ok = abs(got - loss) <= 0.002 if loss == 0.01 else True
        rows.append(
            [f"{loss:.1%}", str(pp["sent"]), f"{got:.3%}", f"{(got - loss) * 100:+.3f} pp", "ok" if ok else "MISS"]
        )
    return rows


def table(title: str, head: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    print(f"\n{title}")
    for r in [head, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def main() -> int:
    net.down()
    net.up(TOPOLOGY)
    serve = subprocess.Popen(
        in_ns(ns("dst"), [*PATHPROBE, "serve", "--allow", "198.18.0.0/15"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert serve.stdout is not None and serve.stdout.readline()  # ready
        table(
            "Throughput, TCP 4 streams, 4 s (Mbit/s)",
            ["path", "payload rate", "pathprobe", "error", "plain iperf3", "within 3%"],
            throughput_rows(),
        )
        table(
            "RTT p50, 100 samples: TCP request/response every 50 ms, UDP echo at 20/s (ms)",
            ["configured", "tcp rr", "error", "udp echo", "error", "allowed", "ping avg", "within"],
            rtt_rows(),
        )
        table(
            "Loss, UDP echo at 1000/s, drop on the way out only",
            ["configured", "packets", "pathprobe", "error", "within 0.2 pp at 1%"],
            loss_rows(),
        )
    finally:
        serve.terminate()
        serve.wait(timeout=10)
        net.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
