"""Lab fidelity: configured rate, delay and loss against what pathprobe measures,
next to plain iperf3 and ping on the same path.

Run as root: .venv/bin/python bench/lab_fidelity.py [--only delay-line | --only demo]   (about 20
minutes; builds its own labs in 198.18.0.0/15 and removes them; `--only delay-line`: the two delay
lines side by side, 2 minutes; `--only demo`: the default demo with the compiled delay line and
ping beside it, 6 minutes)
Targets: throughput within 3% of the payload rate the shaper allows; RTT p50 within
0.5 ms + 2% of the configured RTT; loss within 0.2 percentage points at 1% over at least
20,000 packets. The delay line (compiled against the Python one, in the same run): while
one path carries the most the lab shapes, the delay it adds on an idle second path at p99
within 0.1 ms, and its CPU per Gbit/s at most a fifth of the Python one's; in the default demo,
every one-flow test on the ~74 ms paths within 3% of its prediction, and the idle RTT's p99 within
10% of its p50 (0.15 ms on the 0.5 ms paths), ping's over the same idle windows beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pathprobe import config, promql
from pathprobe.exporter import schedule_of
from pathprobe_lab import net, shaping
from pathprobe_lab.demo import idle_tail_bound
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
# Two paths through the one router: a->b carries a test at the most the lab shapes, c->d is idle.
TWO_PATHS = Topology.model_validate(
    {
        "hosts": [{"name": name, "region": f"r{i}"} for i, name in enumerate("abcd", start=1)],
        "paths": [
            {"between": ["r1", "r2"], "rate": "2G", "one_way_delay": "0.25ms"},
            {"between": ["r3", "r4"], "one_way_delay": "0.25ms"},
        ],
    }
)
# 1,000 samples every 10 ms on the idle path (a p99 of ten, not five, of them), during the test past its slow start.
IDLE_SAMPLES = 1000
LOADED_SECONDS = 13
DEMO_WINDOW = 300  # two and a half rotations of the default demo's 40 s slots
DEMO_PROM = "http://127.0.0.1:19090"
# ping beside the demo, one pair per kind of path (0.5, ~8 and ~70 ms), every 20 ms: the reference
# for the exporters' idle RTT tails over the same idle windows.
PING_PAIRS = (("tokyo-a", "tokyo-b"), ("tokyo-a", "osaka-a"), ("osaka-a", "singapore-a"))


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
        pp = json.loads(
            in_src(
                [*PATHPROBE, "probe", "throughput", DST, "-t", "4s", "-O", "1s", "-P", "4", "--fixed-length", "--json"]
            )
        )
        ip = json.loads(in_src(["iperf3", "-c", DST, "-t", "4", "-O", "1", "-P", "4", "-J"]))
        got = pp["receiver_bytes_per_second"] * 8
        plain = ip["end"]["sum_received"]["bits_per_second"]
        want = payload(rate)
        rows.append(
            [
                f"{rate / 1e6:g} Mbit/s, {2 * one_way * 1e3:g} ms RTT",
                f"{want / 1e6:.1f}",
                f"{got / 1e6:.1f}",
                f"{(got - want) / want:+.2%}",
                f"{plain / 1e6:.1f}",
                "ok" if abs(got - want) <= 0.03 * want else "MISS",
            ]
        )
    return rows


def rtt_rows() -> list[list[str]]:
    rows = []
    for rtt in (0.0005, 0.008, 0.020, 0.040, 0.074, 0.080):
        shape(None, rtt / 2)
        pp = json.loads(in_src([*PATHPROBE, "probe", "rtt", DST, "-c", "100", "-i", "50ms", "--json"]))
        echo = json.loads(in_src([*PATHPROBE, "probe", "loss", DST, "-c", "100", "--rate", "20/s", "--json"]))
        ping = in_src(["ping", "-q", "-c", "50", "-i", "0.05", DST])
        ping_avg = float(re.search(r"= [\d.]+/([\d.]+)/", ping).group(1)) / 1e3  # type: ignore[union-attr]
        p50, udp = pp["rtt_seconds"]["p50"], echo["rtt_seconds"]["p50"]
        allowed = 0.0005 + 0.02 * rtt
        ok = abs(p50 - rtt) <= allowed and abs(udp - rtt) <= allowed
        rows.append(
            [
                f"{rtt * 1e3:g} ms",
                f"{p50 * 1e3:.3f}",
                f"{(p50 - rtt) * 1e3:+.3f}",
                f"{udp * 1e3:.3f}",
                f"{(udp - rtt) * 1e3:+.3f}",
                f"{allowed * 1e3:.2f}",
                f"{ping_avg * 1e3:.3f}",
                "ok" if ok else "MISS",
            ]
        )
    return rows


def loss_rows() -> list[list[str]]:
    rows = []
    for loss in (0.001, 0.01, 0.05):
        shape(None, 0.001, loss)
        pp = json.loads(
            in_src([*PATHPROBE, "probe", "loss", DST, "-c", "20000", "--rate", "1000/s", "--timeout", "1s", "--json"])
        )
        got = pp["loss_ratio"]
        ok = abs(got - loss) <= 0.002 if loss == 0.01 else True
        rows.append(
            [f"{loss:.1%}", str(pp["sent"]), f"{got:.3%}", f"{(got - loss) * 100:+.3f} pp", "ok" if ok else "MISS"]
        )
    return rows


def run_in(host: str, cmd: list[str]) -> str:
    proc = subprocess.run(in_ns(ns(host), cmd), capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{host}: {cmd}: {proc.stderr.strip()}")
    return proc.stdout


def idle_path_rtts(count: int) -> dict[str, tuple[float, float]]:
    """RTT p50 and p99 (s) over the idle path c->d: pathprobe's TCP request/response and ping, side by side."""
    ping = subprocess.Popen(
        in_ns(ns("c"), ["ping", "-n", "-c", str(count), "-i", "0.01", address(4)]), stdout=subprocess.PIPE, text=True
    )
    rr = json.loads(run_in("c", [*PATHPROBE, "probe", "rtt", address(4), "-c", str(count), "-i", "10ms", "--json"]))
    out, _ = ping.communicate(timeout=60)
    pings = [float(m) / 1e3 for m in re.findall(r"time=([\d.]+) ms", out)]
    return {
        "tcp rr": (rr["rtt_seconds"]["p50"], rr["rtt_seconds"]["p99"]),
        "ping": (quantile(pings, 0.5), quantile(pings, 0.99)),
    }


def cpu_seconds(pid: int, which: str = "both") -> float:
    """User, system or both CPU seconds of a process (/proc/PID/stat utime, stime)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    user, system = int(fields[11]), int(fields[12])
    ticks = {"user": user, "system": system, "both": user + system}[which]
    return ticks / os.sysconf("SC_CLK_TCK")


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def delay_line_rows(kind: str) -> list[list[str]]:
    """One lab with `kind`'s delay line: the idle path quiet, then beside a 2 Gbit/s test."""
    os.environ["PATHPROBE_LAB_DELAY_LINE"] = kind
    net.down()
    state = net.up(TWO_PATHS)
    servers = [
        subprocess.Popen(
            in_ns(ns(h), [*PATHPROBE, "serve", "--allow", "198.18.0.0/15"]),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        for h in ("b", "d")
    ]
    try:
        for s in servers:
            assert s.stdout is not None and s.stdout.readline()  # ready
        line = next(p["pid"] for p in state.processes if p["what"] == "delay-line")
        quiet = idle_path_rtts(IDLE_SAMPLES)
        load = ["iperf3", "-c", address(2), "-t", str(LOADED_SECONDS), "-P", "4", "-J"]
        test = subprocess.Popen(in_ns(ns("a"), load), stdout=subprocess.PIPE, text=True)
        cpu_before, user_before, started = cpu_seconds(line), cpu_seconds(line, "user"), time.monotonic()
        time.sleep(1.5)  # past slow start: the shaper's queue is full
        loaded = idle_path_rtts(IDLE_SAMPLES)
        out, _ = test.communicate(timeout=LOADED_SECONDS + 30)
        took = time.monotonic() - started
        cpu_share, user_share = (
            (cpu_seconds(line) - cpu_before) / took,
            (cpu_seconds(line, "user") - user_before) / took,
        )
        if kind == "compiled":
            os.kill(line, signal.SIGUSR1)  # its counters, to the log
        gbits = json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9
    finally:
        for s in servers:
            s.terminate()
            s.wait(timeout=10)
        net.down()
        os.environ.pop("PATHPROBE_LAB_DELAY_LINE")
    rows = []
    for probe, (q50, q99) in quiet.items():
        l50, l99 = loaded[probe]
        # Added: what the load on the other path adds to this one's quantiles.
        rows.append(
            [
                kind,
                probe,
                *(f"{v * 1e3:.3f}" for v in (q50, q99, l50, l99)),
                f"{(l50 - q50) * 1e3:+.3f}",
                f"{(l99 - q99) * 1e3:+.3f}",
                f"{gbits:.2f}",
                f"{cpu_share:.1%}",
                f"{user_share:.1%}",
                f"{cpu_share / gbits:.1%}",
                f"{user_share / gbits:.2%}",
            ]
        )
    return rows


def table(title: str, head: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    print(f"\n{title}")
    for r in [head, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def demo_rows(kind: str, tails: list[list[str]] | None = None) -> list[list[str]]:
    """The default demo with `kind`'s delay line: every one-flow test on the ~74 ms paths (to and
    from Singapore) against its prediction while the other hosts run their schedule. With `tails`,
    ping runs beside it and the idle RTT tails are appended there (idle_tail_rows)."""
    env = {**os.environ, "PATHPROBE_LAB_DELAY_LINE": kind}
    workdir = Path(f"/var/tmp/pathprobe-bench-demo-{kind}")
    demo = subprocess.Popen(
        [*PATHPROBE, "demo", "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    pings: dict[tuple[str, str], subprocess.Popen[str]] = {}
    try:
        assert demo.stdout is not None
        for out in demo.stdout:  # bounded: the demo exits when it cannot start
            if "Ctrl-C stops" in out:
                break
        state = State.load()
        assert state is not None
        if tails is not None:
            index = {h.name: i for i, h in enumerate(state.topo().hosts, start=1)}
            pings = {
                (src, dst): subprocess.Popen(
                    in_ns(ns(src), ["ping", "-D", "-n", "-i", "0.02", "-w", str(DEMO_WINDOW), address(index[dst])]),
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for src, dst in PING_PAIRS
            }
        line = next(p["pid"] for p in state.processes if p["what"] == "delay-line")
        cpu_before, started = cpu_seconds(line), time.monotonic()
        time.sleep(DEMO_WINDOW)
        cpu_share = (cpu_seconds(line) - cpu_before) / (time.monotonic() - started)
        if tails is not None:
            tails += idle_tail_rows(workdir, {pair: p.communicate(timeout=30)[0] for pair, p in pings.items()})
        sel = 'path:pathprobe_throughput_expected_ratio:last{protocol="tcp", streams="1", direction="send"}'
        tests = {}
        for fn in ("min", "max"):
            for r in promql.query(DEMO_PROM, f"{fn}_over_time({sel}[{DEMO_WINDOW}s])", timeout=10):
                m = r["metric"]
                if "singapore-a" in (m["host"], m["peer"]):
                    tests.setdefault(f"{m['host']} -> {m['peer']}", {})[fn] = float(r["value"][1])
    finally:
        for p in pings.values():
            p.kill()
            p.wait()
        demo.send_signal(signal.SIGINT)
        demo.communicate(timeout=120)
    return [
        [kind, name, f"{t['min']:.3f}", f"{t['max']:.3f}", "ok" if t["min"] >= 0.97 else "MISS", f"{cpu_share:.1%}"]
        for name, t in sorted(tests.items())
    ]


def idle_tail_rows(workdir: Path, pings: dict[tuple[str, str], str]) -> list[list[str]]:
    """Per pinged pair: the exporter's idle RTT p50 and p99 (its last DEMO_WINDOW seconds, which
    the ping ran over) and ping's, over the times when the schedule has neither host in a test (as
    the exporter labels its samples idle), with the target's bound on p99 - p50."""
    rows = []
    for (src, dst), out in pings.items():
        cfg = config.load(workdir / f"{src}.yaml")
        schedule, active = schedule_of(cfg), cfg.half_slot_need(with_margin=False)
        idle = []
        for received, ms in re.findall(r"\[([\d.]+)\].*time=([\d.]+) ms", out):
            sent = float(received) - float(ms) / 1e3
            if not (schedule.busy(src, sent, active) or schedule.busy(dst, sent, active)):
                idle.append(float(ms) / 1e3)
        found = promql.query(
            DEMO_PROM, f'pathprobe_rtt_seconds{{host="{src}", peer="{dst}", state="idle"}}', timeout=10
        )
        measured = {(r["metric"]["protocol"], r["metric"]["quantile"]): float(r["value"][1]) for r in found}
        for probe, (p50, p99) in {
            **{proto: (measured[proto, "0.5"], measured[proto, "0.99"]) for proto in ("tcp", "udp")},
            "ping": (quantile(idle, 0.5), quantile(idle, 0.99)),
        }.items():
            bound = idle_tail_bound(p50)
            rows.append(
                [
                    f"{src} -> {dst}",
                    probe,
                    str(len(idle)) if probe == "ping" else "",
                    f"{p50 * 1e3:.3f}",
                    f"{p99 * 1e3:.3f}",
                    f"{(p99 - p50) * 1e3:+.3f}",
                    f"{bound * 1e3:.3f}",
                    "ok" if p99 - p50 <= bound else "MISS",
                ]
            )
    return rows


def demo_table(kinds: tuple[str, ...]) -> None:
    """The default demo with each kind of delay line: its one-flow tests; beside the compiled one's,
    ping, and the idle tails."""
    tails: list[list[str]] = []
    table(
        f"Delay line in the default demo: one-flow tests to and from Singapore (~74 ms) over {DEMO_WINDOW} s, "
        "measured / predicted",
        ["delay line", "path", "lowest", "highest", "within 3%", "delay line CPU (core)"],
        [row for kind in kinds for row in demo_rows(kind, tails if kind == "compiled" else None)],
    )
    table(
        f"Idle RTT in the default demo (compiled delay line) over its last {DEMO_WINDOW} s (ms): the exporter's "
        "idle series and ping beside it, in the schedule's idle windows",
        ["path", "probe", "idle pings", "p50", "p99", "p99 - p50", "bound", "within"],
        tails,
    )


def delay_line_table() -> None:
    rows = delay_line_rows("compiled") + delay_line_rows("python")
    table(
        "Delay line: idle 0.5 ms path c->d (ms), quiet and beside a 2 Gbit/s 4-stream test a->b; its CPU",
        [
            "delay line",
            "probe",
            "quiet p50",
            "quiet p99",
            "loaded p50",
            "loaded p99",
            "added p50",
            "added p99",
            "test Gbit/s",
            "CPU (core)",
            "of it user",
            "CPU per Gbit/s",
            "user per Gbit/s",
        ],
        rows,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["delay-line", "demo"], help="run one section")
    only = parser.parse_args().only
    if only == "delay-line":
        delay_line_table()
        return 0
    if only == "demo":
        demo_table(("compiled",))
        return 0
    delay_line_table()
    demo_table(("compiled", "python"))
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
