"""The flow reader's cost (flowreader.py): CPU per read of the host's TCP flows with many sockets
open, as a share of a core at the default flows.interval_seconds, and whether its heap stays flat
over many reads. The sockets are real loopback connections between two loopback addresses that
the config names as two peers, so every socket is a flow to a peer and is parsed (the worst
case). A second row reads with flows.max_sockets below their number (the sample). A third names
two other addresses as the peers, with 100 sockets between them: a host whose sockets mostly go
elsewhere, which the kernel's filter (sockdiag.established_request) neither copies nor parses.

Run: .venv/bin/python bench/flows_cost.py [--sockets 10000] [--reads 100] [--runs 3]
(loopback only, no root; about a minute; raises this process's open-file limit to its hard one).
Target: at most 1% of a core at 10,000 sockets; the heap after the last read within 1 MiB of
the heap after the tenth (a read's own allocations are freed by then).
"""

from __future__ import annotations

import argparse
import random
import resource
import socket
import statistics
import time
import tracemalloc
from pathlib import Path

from pathprobe import flowreader
from pathprobe.config import Config, FlowsSettings

INTERVAL = FlowsSettings().interval_seconds
FEW = 100  # sockets to the peers of the last row, beside the many to others


def addresses() -> tuple[str, str]:
    """Two loopback addresses of this run's own (all of 127/8 is loopback)."""
    a, b = random.randrange(64, 250), random.randrange(1, 250)
    return f"127.{a}.{b}.1", f"127.{a}.{b}.2"


def connections(pairs: int, server_at: str, client_at: str) -> list[socket.socket]:
    """`pairs` established loopback connections (2 x pairs sockets), each with a byte each way."""
    held: list[socket.socket] = []
    with socket.create_server((server_at, 0), backlog=4096) as server:
        port = server.getsockname()[1]
        for _ in range(pairs):
            c = socket.socket()
            c.bind((client_at, 0))
            c.connect((server_at, port))
            s, _ = server.accept()
            c.sendall(b"x")
            s.sendall(b"y")
            held += [c, s]
    return held


def config(server_at: str, client_at: str, max_sockets: int) -> Config:
    return Config.model_validate(
        {
            "host": {"name": "bench", "address": "198.18.1.2", "region": "r1"},
            "peers": [
                {"name": "server", "address": server_at, "region": "r2", "path_class": "inter_region"},
                {"name": "client", "address": client_at, "region": "r3", "path_class": "inter_region"},
            ],
            "budget": {"state_file": str(Path("/tmp") / "flows-cost-budget.json")},
            "flows": {"max_sockets": max_sockets},
        }
    )


def measure(cfg: Config, reads: int) -> tuple[float, int, int, float, int]:
    """(median CPU seconds per read, sockets, matched, sampled ratio, heap growth in bytes over
    `reads` more reads after ten, traced apart: tracemalloc slows every allocation)."""
    reader = flowreader.FlowReader(cfg)
    cpu = [reader.read().cpu_seconds for _ in range(reads)]
    tracemalloc.start()
    for _ in range(10):
        last = reader.read()  # held as in the loop below: a reading's own RTT list is 10,000 floats
    heap_at_10 = tracemalloc.get_traced_memory()[0]
    for _ in range(reads):
        last = reader.read()
    heap_end = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return statistics.median(cpu[1:]), last.sockets, last.matched, last.ratio, heap_end - heap_at_10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sockets", type=int, default=10_000)
    ap.add_argument("--reads", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.sockets + 1000)), hard))
    server_at, client_at = addresses()
    elsewhere = addresses()  # two more peers, with few of the host's sockets
    started = time.monotonic()
    held = connections(args.sockets // 2, server_at, client_at) + connections(FEW // 2, *elsewhere)
    print(f"{len(held)} sockets open in {time.monotonic() - started:.1f} s; {args.reads} reads a run, {args.runs} runs")
    print(
        "\n| max_sockets | sockets | flows to peers | sampled | CPU per read | share of a core at 10 s | heap growth |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    try:
        cases = [
            config(server_at, client_at, FlowsSettings().max_sockets),
            config(server_at, client_at, max(1, args.sockets // 10)),
            config(*elsewhere, FlowsSettings().max_sockets),
        ]
        for cfg in cases:
            max_sockets = cfg.flows.max_sockets
            for _ in range(args.runs):
                per_read, sockets, matched, ratio, growth = measure(cfg, args.reads)
                print(
                    f"| {max_sockets} | {sockets} | {matched} | {ratio:.2f} | {per_read * 1e3:.1f} ms | "
                    f"{per_read / INTERVAL:.2%} | {growth / 1024:+.0f} KiB |"
                )
    finally:
        for s in held:
            s.close()


if __name__ == "__main__":
    main()
