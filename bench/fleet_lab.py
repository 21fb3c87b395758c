"""A real fleet in the lab: N exporters (default 40) in network namespaces over R
regions, hierarchical peer selection (a full mesh in each region, 2 links per region pair),
low probe rates (RTT 1/s, echo 1/s, MTU every 10 s; no throughput tests: they would measure
this 2-core machine, not the exporters). Prints, per exporter: CPU share and RSS over a
window, /metrics scrape time, and the series it exposes against what bench/fleet.py's model
predicts for its links (the model is measured on the rooms: fleet.series_model).

Run as root: .venv/bin/python bench/fleet_lab.py [--hosts 40] [--regions 5] [--seconds 60]
It builds its own lab (tearing down any running one: do not run it beside the tests).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from exporter_bench import cpu_seconds, rss_mb
from fleet import SeriesModel, series_model

from pathprobe.config import Config
from pathprobe_lab import net
from pathprobe_lab.configs import METRICS_PORT, exporter_config
from pathprobe_lab.state import in_ns, ns, spawn
from pathprobe_lab.topology import Topology, address

PROBES = {
    "throughput": {"enabled": False},
    "rtt": {"interval_seconds": 1.0},
    "loss": {"rate_pps": 1},
    "mtu": {"sizes": [1500]},
}
MESH = {"rtt": {"kind": "hierarchical", "scope": "region", "representatives": 2}}


def scrape(addr: str) -> tuple[float, int]:
    """(seconds, series) of one scrape."""
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://{addr}:{METRICS_PORT}/metrics", timeout=10) as r:
        text = r.read().decode()
    took = time.perf_counter() - started
    return took, sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def start_exporters(
    topo: Topology, work: Path, model: SeriesModel
) -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
    """An exporter in every host: (pids, series the model predicts, addresses), by host."""
    pids, expected, addrs = {}, {}, {}
    for i, h in enumerate(topo.hosts, start=1):
        cfg = exporter_config(topo, h.name, work, 60, PROBES) | {"mesh": MESH}
        cfg_file = work / f"{h.name}.yaml"
        cfg_file.write_text(yaml.safe_dump(cfg))
        parsed = Config.model_validate(cfg)
        expected[h.name] = model.per_host(len(parsed.rtt_peers))
        addrs[h.name] = address(i)
        proc = spawn(
            in_ns(ns(h.name), [sys.executable, "-m", "pathprobe", "run", "--config", str(cfg_file)]),
            work / f"{h.name}.log",
            f"exporter {h.name}",
        )
        pids[h.name] = proc.pid
    return pids, expected, addrs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--regions", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60, help="the CPU window, after a 30 s warm-up")
    args = parser.parse_args()
    topo = Topology.model_validate(
        {"hosts": [{"name": f"h{i:02d}", "region": f"r{i % args.regions}"} for i in range(args.hosts)]}
    )
    net.down()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        started = time.monotonic()
        net.up(topo)
        print(f"lab of {args.hosts} hosts up in {time.monotonic() - started:.0f} s")
        try:
            sample = exporter_config(topo, topo.hosts[0].name, work, 60, PROBES)
            model = series_model({k: sample[k] for k in ("probes", "schedule", "budget")})
            pids, expected, addrs = start_exporters(topo, work, model)
            deadline = time.monotonic() + 180
            waiting = set(addrs)
            while waiting and time.monotonic() < deadline:
                for name in sorted(waiting):
                    try:
                        scrape(addrs[name])
                        waiting.discard(name)
                    except OSError:
                        pass
                time.sleep(1)
            if waiting:
                print(f"not answering after 180 s: {sorted(waiting)}", file=sys.stderr)
                return 1
            time.sleep(30)  # warm-up: every probe has run, the process has settled
            before = {n: cpu_seconds(p) for n, p in pids.items()}
            time.sleep(args.seconds)
            cpu = {n: (cpu_seconds(p) - before[n]) / args.seconds for n, p in pids.items()}
            rss = {n: rss_mb(p) for n, p in pids.items()}
            scrapes = {n: [scrape(a) for _ in range(5)] for n, a in addrs.items()}
            with urllib.request.urlopen(f"http://{addrs['h00']}:{METRICS_PORT}/metrics", timeout=10) as r:
                (Path(tempfile.gettempdir()) / "fleet_lab-h00.prom").write_bytes(r.read())
        finally:
            net.down()
    series = {n: s[-1][1] for n, s in scrapes.items()}
    error = {n: (series[n] - expected[n]) / expected[n] for n in series}
    print(
        f"model (fleet.series_model with these probes): {model.base} series of the exporter's own + "
        f"{model.full} per peer\n"
    )
    print("| exporter | peers | CPU % of a core | RSS MiB | scrape ms (median of 5) | series | predicted | error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in sorted(series):
        peers = (expected[n] - model.base) // model.full
        took = statistics.median(t for t, _ in scrapes[n]) * 1000
        print(
            f"| {n} | {peers} | {cpu[n] * 100:.2f} | {rss[n]:.1f} | {took:.1f} | {series[n]} | {expected[n]} | "
            f"{error[n]:+.1%} |"
        )
    worst = max(error.values(), key=abs)
    total_cpu = sum(cpu.values())
    print(
        f"\n{args.hosts} exporters: CPU {total_cpu * 100:.0f}% of a core in all (median "
        f"{statistics.median(cpu.values()) * 100:.2f}%), RSS median {statistics.median(rss.values()):.1f} MiB, "
        f"series {sum(series.values()):,} (predicted {sum(expected.values()):,}), worst error {worst:+.1%}"
    )
    return 0 if abs(worst) <= 0.05 else 1


if __name__ == "__main__":
    raise SystemExit(main())
