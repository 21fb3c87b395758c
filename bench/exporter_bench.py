"""Exporter benchmark: scrape latency with 500 peers' worth of results, and the
exporter's CPU and memory idle and while probing 50 peers with the continuous probes' defaults,
answered on loopback and answered 1-150 ms late (a relay in a process of its own), as on a mesh's paths.

Run: .venv/bin/python bench/exporter_bench.py   (loopback only; about 3.5 minutes)
     .venv/bin/python bench/exporter_bench.py --cost   (the CPU and memory rows only; about 3.5 minutes)
     .venv/bin/python bench/exporter_bench.py --profile   (those; the load answered late under cProfile)
     .venv/bin/python bench/exporter_bench.py --late N   (the load answered late, N runs; about 1 minute each)
     .venv/bin/python bench/exporter_bench.py --idle   (the idle-connection rows only; about 2 minutes)
     .venv/bin/python bench/exporter_bench.py --reload   (the large-reload rows only; about 1 minute)
     .venv/bin/python bench/exporter_bench.py --host [MINUTES] [--fill SECONDS] [--trace] [--profile]
         (what a fleet host pays: the shipped defaults at 50 peers, measured once the quantile window has
         filled, --fill SECONDS to start sooner for a quick run, over MINUTES (default 5), scraped every 15 s;
         --trace: tracemalloc's top at the fill and at the end, --profile: cProfile's; either skews the
         figures, so take them from a run without)
Targets: scrape p99 < 20 ms, idle RSS < 60 MB, < 3% of one core for 50 peers' continuous probes
(scraped every 15 s, as the docker-compose stack's Prometheus scrapes); a fleet host (--host): at most
1.5% of a core and 60 MB RSS after the window fills, an RSS slope zero within its uncertainty, a scrape
served in < 10 ms;
with 1,000 idle connections from 10 addresses held open, scrape p99 as without them;
a 10,000-member hierarchical mesh: check-config < 1 s, a reload's time on the event loop < 0.1 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import multiprocessing
import os
import pstats
import random
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from pathprobe.config import Config
from pathprobe.exporter import Exporter
from pathprobe.keys import TestKey
from pathprobe.metrics import registry
from pathprobe.probes import ThroughputResult
from pathprobe.probes.echo import OneWay
from pathprobe.probes.pacer import PACE_SECONDS, Pacer, sleep_until
from pathprobe.web import serve

PATHPROBE = [sys.executable, "-m", "pathprobe"]
TICKS = os.sysconf("SC_CLK_TCK")


# Where responders() answers every peer, and where delayed_answers() relays to it.
RESPONDER_PORT, DELAYED_PORT = 19470, 19471


def peer_address(i: int) -> str:
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


def mesh(n: int, port: int = RESPONDER_PORT, **probes: object) -> dict:
    peers = [
        {
            "name": f"peer-{i:03d}",
            "address": peer_address(i),
            "region": f"region-{i % 12}",
            "path_class": "inter_region",
            "rr_port": port,
            "echo_port": port,
        }
        for i in range(n)
    ]
    return {
        "host": {"name": "bench", "address": "127.0.0.1", "region": "region-0"},
        "peers": peers,
        "probes": probes,
        "schedule": {"slot_seconds": 600},
        "responders": {"listen": "127.0.0.1", "rr_port": 29470, "echo_port": 29470},
        "iperf3": {"port": 25201},
        "web": {"listen": "127.0.0.1:19469"},
        "budget": {"state_file": "/tmp/pathprobe-bench-budget.json"},
    }


def scrape_latency(peers: int = 500, scrapes: int = 300) -> dict[str, float]:
    """Fill the registry as 500 peers' probes would, then time scrapes over HTTP."""
    cfg = Config.model_validate(mesh(peers, throughput={"protocols": ["tcp", "udp"], "streams": [1, 8]}))
    exporter = Exporter(cfg)
    rooms = exporter.rooms
    rnd = random.Random(1)
    for peer in cfg.peers:
        for proto in ("tcp", "udp"):
            for _ in range(200):
                rooms.rtt.observe(peer.name, proto, rnd.uniform(0.001, 0.2))
        for key in cfg.throughput_for(peer).tests():
            protocol, streams, direction = key
            r = ThroughputResult(
                protocol,
                int(streams),
                direction,
                5,
                1,
                None,
                None,
                6e8,
                6e8,
                3 * 10**9,
                retransmits=3,
                timestamp=time.time(),
            )
            rooms.throughput.record(TestKey.of(peer.name, key), r)
    server = serve(cfg.web, registry(exporter.rooms))
    url = "http://127.0.0.1:19469/metrics"
    times, body = [], b""
    try:
        for _ in range(scrapes):
            # Probes keep writing while Prometheus scrapes.
            rooms.rtt.observe(cfg.peers[0].name, "tcp", 0.01)
            start = time.perf_counter()
            # As Prometheus asks: gzip accepted.
            request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
            with urllib.request.urlopen(request, timeout=10) as r:
                raw = r.read()
            times.append(time.perf_counter() - start)  # the scraper's own decompression not included
            body = gzip.decompress(raw)
            time.sleep(0.01)
    finally:
        server.shutdown()
    times.sort()
    return {
        "p50": times[len(times) // 2],
        "p99": times[int(len(times) * 0.99)],
        "max": times[-1],
        "bytes": len(body),
        "lines": body.count(b"\n"),
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def exporter_cost(
    peers: int, probes: dict, seconds: float = 30, profile: Path | None = None, port: int = RESPONDER_PORT
) -> tuple[float, float]:
    """(share of one core, RSS MB) of a real `pathprobe run`, scraped every SCRAPE_INTERVAL and
    measured over `seconds`, its probes sent to `port`; with `profile`, run under cProfile, which
    writes its statistics there as the exporter stops."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg_file = Path(tmp) / "bench.yaml"
        cfg_file.write_text(yaml.safe_dump(mesh(peers, port, **probes)))
        python = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "pathprobe"] if profile else PATHPROBE
        proc = subprocess.Popen(
            [*python, "run", "--config", str(cfg_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_ready("http://127.0.0.1:19469/metrics")
            with scraped("http://127.0.0.1:19469/metrics", SCRAPE_INTERVAL):
                # settle: connections made, first results in, the scrape interval learnt (two scrapes)
                time.sleep(SCRAPE_INTERVAL + 5)
                c0, t0 = cpu_seconds(proc.pid), time.monotonic()
                time.sleep(seconds)
                share = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)
            rss = rss_mb(proc.pid)
            text = urllib.request.urlopen("http://127.0.0.1:19469/metrics", timeout=5).read().decode()
            ok = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("pathprobe_probe_runs_total") and 'result="ok"' in line
            )
            failed = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("pathprobe_probe_runs_total") and 'result="ok"' not in line
            )
            print(f"  ({peers} peers, {probes}: {ok:.0f} ok probe runs, {failed:.0f} failed)", file=sys.stderr)
            return share, rss
        finally:
            proc.terminate()
            proc.wait(timeout=10)


# The exporter is scraped as the docker-compose stack's Prometheus scrapes it (compose/prometheus.yml).
SCRAPE_INTERVAL = 15.0


@contextlib.contextmanager
def scraped(url: str, every: float) -> Iterator[None]:
    """A scraper in a thread of its own, as Prometheus: gzip, every `every` seconds from now."""
    stop = threading.Event()

    def scrape() -> None:
        while True:
            request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
            urllib.request.urlopen(request, timeout=5).read()
            if stop.wait(every):
                return

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


IDLE_SOURCES = [f"127.0.0.{i}" for i in range(11, 21)]


def idle_flood(port: int, per_source: int, begun: bytes, stop: multiprocessing.synchronize.Event) -> None:
    """In a process of its own (no GIL shared with the scraper): `per_source` connections from
    each of IDLE_SOURCES that send `begun` (nothing: silent; the start of a request: slow) and
    no more, all opened again every 4 s (inside the server's 5 s request deadline) until `stop`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))  # 1,000 sockets
    while not stop.is_set():
        held = []
        for source in IDLE_SOURCES:
            for _ in range(per_source):
                s = socket.socket()
                s.settimeout(1)
                try:
                    s.bind((source, 0))
                    s.connect(("127.0.0.1", port))
                    s.sendall(begun)
                    held.append(s)
                except OSError:
                    s.close()
        stop.wait(4)
        for s in held:
            s.close()


def scrape_times(url: str, scrapes: int) -> list[float]:
    times = []
    for _ in range(scrapes):
        start = time.perf_counter()
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=10) as r:
            r.read()
        times.append(time.perf_counter() - start)
        time.sleep(0.02)
    return sorted(times)


def idle_sink(port: int, ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event) -> None:
    """A listener that accepts every connection and holds it, doing nothing else: the idle
    flood aimed at it costs the machine what it costs, with no exporter in the way."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    with socket.create_server(("127.0.0.1", port), backlog=4096) as server:
        server.settimeout(0.2)
        ready.set()
        held: list[socket.socket] = []
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(server.accept()[0])
            if len(held) > 2000:  # the oldest are connections the flood has re-opened: dropping closes them
                del held[:1000]
        for c in held:
            c.close()


def under_flood(  # noqa: PLR0913 - the flood: where, how many, of which kind
    url: str, scrapes: int, flood_port: int, idle: int, pid: int, *, begun: bytes = b""
) -> tuple[list[float], int]:
    """Scrape times while `idle` connections from IDLE_SOURCES are held open at `flood_port`
    (the exporter's own, or a sink's), and the exporter's (`pid`) open descriptors meanwhile."""
    stop = multiprocessing.Event()
    flood = multiprocessing.Process(target=idle_flood, args=(flood_port, idle // len(IDLE_SOURCES), begun, stop))
    flood.start()
    try:
        time.sleep(2)  # all opened
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return scrape_times(url, scrapes), fds
    finally:
        stop.set()
        flood.join(30)


def idle_connections(peers: int = 50, scrapes: int = 1000, idle: int = 1000) -> dict[str, float]:
    """Scrape p50/p99 of a real `pathprobe run` without and then with `idle` connections from
    10 addresses held open and re-opened, at the exporter and, for comparison, at a sink in
    another process (what the flood costs the machine alone); what the exporter counted."""
    off = {
        "throughput": {"enabled": False},
        "rtt": {"enabled": False},
        "loss": {"enabled": False},
        "mtu": {"enabled": False},
    }
    url, sink_port = "http://127.0.0.1:19469/metrics", 19479
    with tempfile.TemporaryDirectory() as tmp:
        cfg_file = Path(tmp) / "bench.yaml"
        cfg_file.write_text(yaml.safe_dump(mesh(peers, **off)))
        proc = subprocess.Popen(
            [*PATHPROBE, "run", "--config", str(cfg_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        ready, stop = multiprocessing.Event(), multiprocessing.Event()
        sink = multiprocessing.Process(target=idle_sink, args=(sink_port, ready, stop))
        sink.start()
        try:
            wait_ready(url)
            ready.wait(10)
            quiet = scrape_times(url, scrapes)
            beside, _ = under_flood(url, scrapes, sink_port, idle, proc.pid)
            loaded, fds = under_flood(url, scrapes, 19469, idle, proc.pid)
            slow, slow_fds = under_flood(url, scrapes, 19469, idle, proc.pid, begun=b"GET /metrics HTTP/1.1\r\n")
            text = urllib.request.urlopen(url, timeout=5).read().decode()
        finally:
            stop.set()
            sink.join(30)
            proc.terminate()
            proc.wait(timeout=10)
    refused = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("pathprobe_web_refused_total{") and not line.endswith(" 0")
    }
    return {
        "p50": quiet[len(quiet) // 2],
        "p99": quiet[int(len(quiet) * 0.99)],
        "sink_p50": beside[len(beside) // 2],
        "sink_p99": beside[int(len(beside) * 0.99)],
        "idle_p50": loaded[len(loaded) // 2],
        "idle_p99": loaded[int(len(loaded) * 0.99)],
        "idle_max": loaded[-1],
        "fds": fds,
        "slow_p50": slow[len(slow) // 2],
        "slow_p99": slow[int(len(slow) * 0.99)],
        "slow_max": slow[-1],
        "slow_fds": slow_fds,
        **{f"refused_{k}": v for k, v in refused.items()},
    }


def wait_ready(url: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            urllib.request.urlopen(url, timeout=1).read()
            return
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer in {seconds:g} s")


def idle_rows() -> list[tuple[str, str, str]]:
    i = idle_connections()
    counted = ", ".join(f"{k.removeprefix('refused_')}={v:,.0f}" for k, v in i.items() if k.startswith("refused_"))
    return [
        ("scrape p50 / p99, 50 peers, unloaded (ms)", f"{i['p50'] * 1e3:.2f} / {i['p99'] * 1e3:.2f}", ""),
        (
            "same, 1,000 idle conns at a sink beside it (ms)",
            f"{i['sink_p50'] * 1e3:.2f} / {i['sink_p99'] * 1e3:.2f}",
            "",
        ),
        (
            "same, 1,000 idle conns from 10 addresses (ms)",
            f"{i['idle_p50'] * 1e3:.2f} / {i['idle_p99'] * 1e3:.2f}",
            "~ above",
        ),
        ("  slowest scrape under them (ms)", f"{i['idle_max'] * 1e3:.2f}", "< 1000"),
        ("  exporter's open fds under them", f"{i['fds']:.0f}", ""),
        (
            "same, the 1,000 sending a request's first line (ms)",
            f"{i['slow_p50'] * 1e3:.2f} / {i['slow_p99'] * 1e3:.2f}",
            "",
        ),
        ("  slowest scrape under them (ms)", f"{i['slow_max'] * 1e3:.2f}", "< 1000"),
        ("  exporter's open fds under them", f"{i['slow_fds']:.0f}", ""),
        ("  counted (pathprobe_web_refused_total)", counted or "-", ""),
    ]


def hierarchical(members: int) -> dict:
    """A hierarchical mesh of `members` in 20 regions, probes off (nothing but the reload costs)."""
    cfg = mesh(
        members - 1,
        throughput={"enabled": False},
        rtt={"enabled": False},
        loss={"enabled": False},
        mtu={"enabled": False},
    )
    for i, peer in enumerate(cfg["peers"]):
        peer["region"], peer["address"] = f"region-{i % 20}", f"127.{1 + i // 62500}.{i // 250 % 250}.{1 + i % 250}"
    return cfg | {"mesh": {"rtt": {"kind": "hierarchical"}}}


def reload_rows(sizes: tuple[int, ...] = (1_000, 10_000)) -> list[tuple[str, str, str]]:
    """check-config's wall time, and a reload's time off and on the event loop (its log line) with
    the exporter's RSS, for hierarchical meshes of each size."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        small, large = Path(tmp) / "small.yaml", Path(tmp) / "large.yaml"
        small.write_text(yaml.safe_dump(hierarchical(2)))
        for n in sizes:
            large.write_text(yaml.safe_dump(hierarchical(n)))
            checks = []
            for _ in range(3):
                t0 = time.monotonic()
                subprocess.run([*PATHPROBE, "check-config", str(large)], check=True, capture_output=True)
                checks.append(time.monotonic() - t0)
            rows.append(
                (f"check-config, {n:,} members (s, best of 3)", f"{min(checks):.2f}", "< 1" if n == 10_000 else "")
            )
            cfg = Path(tmp) / "pathprobe.yaml"
            cfg.write_bytes(small.read_bytes())
            proc = subprocess.Popen(
                [*PATHPROBE, "run", "--config", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
            try:
                wait_ready("http://127.0.0.1:19469/metrics")
                before = rss_mb(proc.pid)
                cfg.write_bytes(large.read_bytes())
                proc.send_signal(signal.SIGHUP)
                assert proc.stderr is not None
                line = next(x for x in proc.stderr if "config reload:" in x or "refused" in x)
                after = rss_mb(proc.pid)
            finally:
                proc.terminate()
                proc.wait(timeout=10)
            found = re.search(r"prepared in ([\d.]+) s .* applied in ([\d.]+) s", line)
            if found is None:
                raise SystemExit(f"the reload of {n:,} members failed: {line.strip()}")
            off, on = float(found[1]), float(found[2])
            rows.append(
                (
                    "  reload to it: off / on the event loop (s)",
                    f"{off:.2f} / {on:.3f}",
                    "- / < 0.1" if n == 10_000 else "",
                )
            )
            rows.append(("  exporter RSS before / after (MB)", f"{before:.0f} / {after:.0f}", ""))
    return rows


@contextlib.contextmanager
def responders() -> Iterator[None]:
    """One `pathprobe serve` answering every peer of mesh(): it listens on every address, so that
    it answers all of 127.0.x.y (loopback only)."""
    proc = subprocess.Popen(
        [
            *PATHPROBE,
            "serve",
            "--listen",
            "0.0.0.0",
            "--allow",
            "127.0.0.0/8",
            "--rr-port",
            str(RESPONDER_PORT),
            "--echo-port",
            str(RESPONDER_PORT),
            "--iperf3-port",
            "15201",
            # every prober connects from 127.0.0.1 here, 8 flows each
            "--rr-max-connections-per-source",
            "1000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline()  # ready
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# How late delayed_answers() makes the answers of each peer: on loopback an answer is back within
# about 0.1 ms, before the exporter's event loop sleeps again, so it costs no wake-up of its own; a
# mesh's paths are 1-150 ms long, each its own, so that the answers to sends made together come back
# apart (one delay for all would bring them back together again).
ANSWER_DELAYS_SECONDS = (0.001, 0.150)


def answer_delay(peer: int, peers: int) -> float:
    """Peer `peer`'s answers' delay, the peers spread evenly over ANSWER_DELAYS_SECONDS."""
    low, high = ANSWER_DELAYS_SECONDS
    return low + (high - low) * peer / max(1, peers - 1)


@contextlib.contextmanager
def delayed_answers(peers: int) -> Iterator[None]:
    """A relay in a process of its own (its CPU is not the exporter's): every peer address of
    mesh(peers) on DELAYED_PORT, UDP and TCP, relayed to responders() with each datagram and
    chunk toward it held its peer's answer_delay(); answers come back at once."""
    ready, stop = multiprocessing.Event(), multiprocessing.Event()
    delays = {peer_address(i): answer_delay(i, peers) for i in range(peers)}
    relay = multiprocessing.Process(target=relay_process, args=(delays, ready, stop))
    relay.start()
    try:
        assert ready.wait(10), "the relay did not start"
        yield
    finally:
        stop.set()
        relay.join(timeout=10)


def relay_process(
    delays: dict[str, float], ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event
) -> None:
    asyncio.run(relay(delays, ready, stop))


async def relay(
    delays: dict[str, float], ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event
) -> None:
    loop = asyncio.get_running_loop()

    class Datagrams(asyncio.DatagramProtocol):
        """One peer address's UDP: a socket toward the responder per client (the echo's flows)."""

        def __init__(self, address: str) -> None:
            self.address = address
            self.upstream: dict[tuple[str, int], socket.socket] = {}

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]

        def datagram_received(self, data: bytes, client: tuple[str, int]) -> None:
            up = self.upstream.get(client)
            if up is None:
                up = self.upstream[client] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                up.setblocking(False)
                up.connect((self.address, RESPONDER_PORT))
                loop.add_reader(up, self.answer, up, client)
            loop.call_later(delays[self.address], self.forward, up, data)

        @staticmethod
        def forward(up: socket.socket, data: bytes) -> None:
            with contextlib.suppress(OSError):
                up.send(data)

        def answer(self, up: socket.socket, client: tuple[str, int]) -> None:
            with contextlib.suppress(OSError):  # BlockingIOError: read it all; a refusal: nothing to relay
                while True:
                    self.transport.sendto(up.recv(65536), client)  # type: ignore[attr-defined]

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One TCP connection (an RTT probe's flow), relayed to the responder on the address it came to."""
        address = writer.get_extra_info("sockname")[0]
        up_reader, up_writer = await asyncio.open_connection(address, RESPONDER_PORT)

        async def toward() -> None:
            with contextlib.suppress(OSError):  # reset as the exporter stops: the relay ends with it
                while data := await reader.read(65536):
                    loop.call_later(delays[address], up_writer.write, data)

        async def back() -> None:
            with contextlib.suppress(OSError):
                while data := await up_reader.read(65536):
                    writer.write(data)

        await asyncio.wait(
            [asyncio.create_task(toward()), asyncio.create_task(back())], return_when=asyncio.FIRST_COMPLETED
        )
        up_writer.close()
        writer.close()

    server = await asyncio.start_server(stream, "0.0.0.0", DELAYED_PORT, backlog=1024)
    for address in delays:
        await loop.create_datagram_endpoint(lambda a=address: Datagrams(a), local_addr=(address, DELAYED_PORT))
    ready.set()
    while not stop.is_set():
        await asyncio.sleep(0.2)
    server.close()


# The continuous probes at their defaults (config.py), nothing else.
OFF = {
    "throughput": {"enabled": False},
    "rtt": {"enabled": False},
    "loss": {"enabled": False},
    "mtu": {"enabled": False},
}
BUSY = {**OFF, "rtt": {}, "loss": {}}


def cost_rows(profile: Path | None = None) -> list[tuple[str, str, str]]:
    """The exporter's CPU and memory at 50 peers: idle, the RTT probes alone, the full default
    continuous load; with `profile`, the load answered late (a mesh's paths, each its own length)
    under cProfile (its statistics written there)."""
    idle_cpu, idle_rss = exporter_cost(50, OFF, seconds=15)
    rtt_cpu, rtt_rss = exporter_cost(50, {**BUSY, "loss": {"enabled": False}})
    all_cpu, all_rss = exporter_cost(50, BUSY)
    with delayed_answers(50):
        delayed_cpu, _ = exporter_cost(50, BUSY, port=DELAYED_PORT, profile=profile)
    probes = Config.model_validate(mesh(1)).probes
    low, high = ANSWER_DELAYS_SECONDS
    rtt_per_second, echo_per_second = 50 / probes.rtt.interval_seconds, 50 * probes.loss.rate_pps
    return [
        ("idle RSS, 50 peers (MB)", f"{idle_rss:.1f}", "< 60"),
        ("idle CPU, 50 peers (% of a core)", f"{idle_cpu * 100:.2f}", ""),
        (f"CPU, 50 peers x {rtt_per_second / 50:g} RTT/s (%)", f"{rtt_cpu * 100:.2f}", ""),
        (
            f"CPU, 50 peers x ({rtt_per_second / 50:g} RTT/s + {echo_per_second / 50:g} echo/s) (%)",
            f"{all_cpu * 100:.2f}",
            "< 3",
        ),
        (f"  the same, answered {low * 1e3:g}-{high * 1e3:g} ms late (%)", f"{delayed_cpu * 100:.2f}", "< 3"),
        (
            "  CPU per RTT exchange / per echo (us)",
            f"{(rtt_cpu - idle_cpu) / rtt_per_second * 1e6:.0f} / {(all_cpu - rtt_cpu) / echo_per_second * 1e6:.0f}",
            "",
        ),
        ("RSS, 50 peers probing (MB)", f"{max(rtt_rss, all_rss):.1f}", ""),
    ]


def late_rows(runs: int) -> list[tuple[str, str, str]]:
    """The full default load at 50 peers answered 1-150 ms late, `runs` times: a run-to-run spread
    of a few tenths of a point is this machine's, and a target is met when the worst run meets it."""
    with responders(), delayed_answers(50):
        shares = [exporter_cost(50, BUSY, port=DELAYED_PORT)[0] * 100 for _ in range(runs)]
    return [
        (f"CPU, 50 peers answered late, {runs} runs (%)", " ".join(f"{s:.2f}" for s in shares), ""),
        ("  mean / worst (%)", f"{statistics.mean(shares):.2f} / {max(shares):.2f}", "< 3"),
    ]


def render_ms(peers: int = 50, renders: int = 20) -> float:
    """CPU ms of one render of /metrics with `peers` peers' windows full (300 s of RTT samples of
    both protocols and one-way delays both ways, at 5 a second), as the snapshot thread renders."""
    cfg = Config.model_validate(mesh(peers, **BUSY))
    now = [time.time() - 300]
    rooms, rnd = Exporter(cfg, clock=lambda: now[0]).rooms, random.Random(1)
    for _ in range(1500):
        now[0] += 0.2
        for peer in cfg.peers:
            for protocol in ("tcp", "udp"):
                rooms.rtt.observe(peer.name, protocol, rnd.uniform(0.07, 0.08))
            delays = OneWay(rnd.uniform(0.03, 0.04), rnd.uniform(0.03, 0.04), 1e-6, 0.0)
            rooms.owd.observe(peer.name, delays, now[0], "idle")
    reg = registry(rooms)
    began = time.process_time()
    for _ in range(renders):
        generate_latest(reg)
    return (time.process_time() - began) / renders * 1e3


def wakeup_cost(mode: str, peers: int = 50, rate: float = 5.0, seconds: float = 10.0) -> float:
    """Share of a core that the event loop's wake-ups alone cost: `peers` senders, `rate` sends a
    second each, at phases spread over the interval (as after reloads and back-offs; started
    together, sends fall due together by chance), with no send. "task": a task per sender that
    sleeps until each send; "grid": the same on probes.pacer.sleep_until's grid; "pacer": one timer
    for all of them (probes.pacer.Pacer), as the echo probes send."""

    async def sender(phase: float, stop: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + phase
        if mode == "pacer":
            await asyncio.sleep(phase)
            await Pacer.of(loop).repeat(1 / rate, lambda: None, count=int((stop - loop.time()) * rate))
            return
        while loop.time() < stop:
            if mode == "grid":
                await sleep_until(due, 1 / rate)
            else:
                await asyncio.sleep(max(0.0, due - loop.time()))
            due += 1 / rate

    async def all_senders() -> float:
        stop = asyncio.get_running_loop().time() + seconds
        start = time.process_time()
        await asyncio.gather(*(sender(i / peers / rate, stop) for i in range(peers)))
        return (time.process_time() - start) / seconds

    return asyncio.run(all_senders())


def wakeup_rows() -> list[tuple[str, str, str]]:
    costs = " / ".join(f"{wakeup_cost(mode) * 100:.2f}" for mode in ("task", "grid", "pacer"))
    return [
        (f"  wake-ups alone, 250/s: task / {PACE_SECONDS * 1e3:g} ms grid / one timer (%)", costs, ""),
        ("  a render, 50 peers' windows full (ms CPU)", f"{render_ms():.1f}", ""),
    ]


# What ships: every probe kind at its defaults but throughput (off unless a host is given turns).
SHIPPED = {"throughput": {"enabled": False}}

# Run in the exporter's place under tracemalloc: its top allocations by line, written to argv[1]
# with a suffix of the seconds since start at each of the times in argv[2] (comma-separated); the
# imports' code and tracemalloc's own left out.
TRACED = """
import runpy, sys, threading, time, tracemalloc
out, times, started = sys.argv[1], [float(t) for t in sys.argv[2].split(",")], time.monotonic()
tracemalloc.start(1)
def dump():
    for t in times:
        time.sleep(max(0.0, started + t - time.monotonic()))
        ours = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib.*")]
        stats = tracemalloc.take_snapshot().filter_traces(ours).statistics("lineno")
        lines = [f"{s.size / 1e6:8.2f} MB {s.count:8d} blocks  {s.traceback[0]}" for s in stats[:25]]
        total = sum(s.size for s in stats) / 1e6
        open(f"{out}.{t:.0f}s", "w").write(f"traced {total:.1f} MB\\n" + "\\n".join(lines) + "\\n")
threading.Thread(target=dump, daemon=True).start()
sys.argv = ["pathprobe", *sys.argv[3:]]
runpy.run_module("pathprobe", run_name="__main__")
"""


def timed_scrapes(
    url: str, every: float, stop: threading.Event, pid: int, out: list[tuple[float, float, float]]
) -> None:
    """As Prometheus: gzip, every `every` seconds until `stop`; each scrape's (monotonic time, wall
    seconds it took, the exporter's RSS MB right after) appended to `out`."""
    while True:
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=5) as r:
            r.read()
        took = time.perf_counter() - start
        out.append((time.monotonic(), took, rss_mb(pid)))
        if stop.wait(every):
            return


def slope_per_hour(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (seconds, MB) in MB/h and its standard error (the samples taken as
    independent, which RSS sampled every 15 s is not quite: read it as a lower bound of the error)."""
    n = len(samples)
    xs, ys = [t / 3600 for t, _ in samples], [y for _, y in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, (residual / (n - 2) / sxx) ** 0.5 if n > 2 else float("nan")


def host_cost(minutes: float, fill: float | None, trace: Path | None = None, profile: Path | None = None) -> dict:
    """What a fleet host pays: a real `pathprobe run` at the shipped defaults (SHIPPED) with 50 peers
    answered by responders(), scraped every SCRAPE_INTERVAL from its start, measured from when the
    quantile window has filled (or after `fill` seconds) over `minutes`: CPU share of a core, RSS,
    the scrapes' times, the RSS slope; with `trace`, tracemalloc's tops written beside it; with
    `profile`, cProfile's statistics written there."""
    cfg = mesh(50, **SHIPPED)
    window = Config.model_validate(cfg).probes.rtt.quantile_window_seconds
    settle = window + SCRAPE_INTERVAL if fill is None else fill
    url = "http://127.0.0.1:19469/metrics"
    with tempfile.TemporaryDirectory() as tmp:
        cfg_file = Path(tmp) / "bench.yaml"
        cfg_file.write_text(yaml.safe_dump(cfg))
        run = ["run", "--config", str(cfg_file)]
        if trace is not None:
            command = [sys.executable, "-c", TRACED, str(trace), f"{settle:.0f},{settle + minutes * 60:.0f}", *run]
        elif profile is not None:
            command = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "pathprobe", *run]
        else:
            command = [*PATHPROBE, *run]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stop, scrapes = threading.Event(), []
        scraper = threading.Thread(target=timed_scrapes, args=(url, SCRAPE_INTERVAL, stop, proc.pid, scrapes))
        try:
            wait_ready(url, 120)  # under tracemalloc, on a busy machine, a start takes a minute
            began = time.monotonic()
            scraper.start()
            time.sleep(max(0.0, began + settle - time.monotonic()))
            c0, t0, rss0 = cpu_seconds(proc.pid), time.monotonic(), rss_mb(proc.pid)
            time.sleep(minutes * 60 + 1)  # the last scrape of the span in it
            share = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)
            rss1 = rss_mb(proc.pid)
            body = urllib.request.urlopen(url, timeout=5).read()
        finally:
            stop.set()
            if scraper.is_alive():
                scraper.join(timeout=10)
            proc.terminate()
            proc.wait(timeout=30)
    span = [(t - t0, took, rss) for t, took, rss in scrapes if t >= t0]
    times = sorted(took for _, took, _ in span)
    slope, error = slope_per_hour([(t, rss) for t, _, rss in span])
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {
        "settle": settle,
        "window": window,
        "minutes": minutes,
        "cpu": share,
        "rss": (rss0, rss1, max(rss for _, _, rss in span)),
        "p50": times[len(times) // 2],
        "p99": times[min(len(times) - 1, int(len(times) * 0.99))],
        "scrapes": len(times),
        "slope": (slope, error),
        "series": series,
        "bytes": len(body),
    }


def host_rows(
    minutes: float, fill: float | None, trace: Path | None, profile: Path | None
) -> list[tuple[str, str, str]]:
    h = host_cost(minutes, fill, trace, profile)
    filled = "window filled" if h["settle"] >= h["window"] else f"window NOT filled ({h['window']:g} s)"
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    rss0, rss1, peak = h["rss"]
    slope, error = h["slope"]
    return [
        (f"fleet host: from {h['settle']:.0f} s ({filled}), {h['minutes']:g} min", "", ""),
        ("  CPU, scraped every 15 s (% of a core)", f"{h['cpu'] * 100:.2f}", "<= 1.5"),
        ("  RSS at start / end / peak (MB)", f"{rss0:.1f} / {rss1:.1f} / {peak:.1f}", "<= 60"),
        ("  RSS slope (MB/h, +- 1 standard error)", f"{slope:+.2f} +- {error:.2f}", "0"),
        (f"  scrape p50 / p99, {h['scrapes']} scrapes (ms)", f"{h['p50'] * 1e3:.2f} / {h['p99'] * 1e3:.2f}", "< 10"),
        ("  exposition (series, KB)", f"{h['series']:,}, {h['bytes'] / 1e3:.0f}", ""),
        ("  machine load at the end (1/5/15 min)", load, ""),
    ]


def print_profile(stats_file: Path, top: int = 25, what: str = "the full load answered late") -> None:
    """The functions that cost the exporter most time of their own, and their callers' share."""
    print(f"\nprofile of {what} ({top} functions by own time):")
    pstats.Stats(str(stats_file)).sort_stats("tottime").print_stats(top)


def main() -> None:
    mode = sys.argv[1:]
    if mode[:1] == ["--host"]:
        host(mode[1:])
        return
    if mode == ["--idle"]:
        print_rows(idle_rows())
        return
    if mode == ["--reload"]:
        print_rows(reload_rows())
        return
    if len(mode) == 2 and mode[0] == "--late" and mode[1].isdigit():
        print_rows(late_rows(int(mode[1])))
        return
    if mode in (["--cost"], ["--profile"]):
        with tempfile.TemporaryDirectory() as tmp, responders():
            stats = Path(tmp) / "exporter.prof" if mode == ["--profile"] else None
            print_rows(cost_rows(stats) + wakeup_rows())
            if stats is not None:
                print_profile(stats)
        return
    with responders():
        s = scrape_latency()
        cost = cost_rows()
        idle = idle_rows()
        reloads = reload_rows()
    rows = [
        ("scrape p50, 500 peers (ms)", f"{s['p50'] * 1e3:.2f}", ""),
        ("scrape p99, 500 peers (ms)", f"{s['p99'] * 1e3:.2f}", "< 20"),
        ("first scrape, renders in the request (ms)", f"{s['max'] * 1e3:.2f}", ""),
        ("exposition size, 500 peers", f"{s['bytes'] / 1e6:.1f} MB, {s['lines']:.0f} lines", ""),
        *cost,
        *wakeup_rows(),
        *idle,
        *reloads,
    ]
    print_rows(rows)


def host(args: list[str]) -> None:
    """--host [MINUTES] [--fill SECONDS] [--trace] [--profile]: the fleet host's rows, with the
    responders; tracemalloc's tops or cProfile's printed after them."""
    fill = float(args[args.index("--fill") + 1]) if "--fill" in args else None
    rest = [
        a for i, a in enumerate(args) if a not in ("--fill", "--trace", "--profile") and args[i - 1 : i] != ["--fill"]
    ]
    minutes = float(rest[0]) if rest else 5.0
    with tempfile.TemporaryDirectory() as tmp, responders():
        trace = Path(tmp) / "trace" if "--trace" in args else None
        profile = Path(tmp) / "exporter.prof" if "--profile" in args else None
        print_rows(host_rows(minutes, fill, trace, profile))
        for top in sorted(Path(tmp).glob("trace.*"), key=lambda f: float(f.suffix[1:-1])):
            print(f"\ntracemalloc top at {top.suffix[1:]} (by line):\n{top.read_text()}")
        if profile is not None:
            print_profile(profile, what="the shipped defaults, from the exporter's start")


def print_rows(rows: list[tuple[str, str, str]]) -> None:
    print(f"{'measure':47} {'value':>22} {'target':>8}")
    for name, value, target in rows:
        print(f"{name:47} {value:>22} {target:>8}")
    print(f"\npython {sys.version.split()[0]}, {os.cpu_count()} cores, {len(os.sched_getaffinity(0))} usable")


if __name__ == "__main__":
    main()
