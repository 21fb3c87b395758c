"""Attacks on a running exporter's entry points, one after the other, each bounded in count
and time, on loopback only: what each did, what the exporter counted, whether a peer's
probes and an authorized scrape still worked right after, and the exporter's RSS and open
fds before and after (the attack table).

Run: .venv/bin/python bench/attacks.py      (loopback only; about 40 s; needs openssl)

The exporter (`pathprobe run`) listens on 127.0.0.1 with /metrics over TLS and basic auth;
its peer's probes come from 127.0.0.1 (`responders.allow`); strangers from 127.0.0.3. Its own probes are off,
so every count is the attacks'. Bound checked after each attack: RSS within +20 MiB and
open fds within +16 of the exporter's before the first one.
"""

from __future__ import annotations

import base64
import json
import os
import random
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "exporter" / "src"))
import contextlib

import bcrypt
from prometheus_client.parser import text_string_to_metric_families

from pathprobe import procs, wire

PATHPROBE = [sys.executable, "-m", "pathprobe"]
HOST, STRANGER = "127.0.0.1", "127.0.0.3"
RR, IPERF3, WEB = 29470, 25201, 29469
USER, PASSWORD = "prometheus", "correct horse battery staple"
RSS_BOUND, FD_BOUND = 20 * 2**20, 16


def tls_files(work: Path) -> tuple[Path, Path]:
    cert, key = work / "cert.pem", work / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def start(work: Path) -> subprocess.Popen[bytes]:
    cert, key = tls_files(work)
    # The web config file as exporter-toolkit reads it: TLS and one bcrypt user (cost 10, as htpasswd -B).
    web = {
        "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
        "basic_auth_users": {USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()},
    }
    (work / "web.yml").write_text(json.dumps(web))
    cfg = {
        "host": {"name": "target", "address": HOST, "region": "r1"},
        "peers": [{"name": "peer", "address": "127.0.0.2", "region": "r2", "path_class": "inter_region"}],
        "probes": {
            "throughput": {"enabled": False},
            "rtt": {"enabled": False},
            "loss": {"enabled": False},
            "mtu": {"enabled": False},
        },
        "responders": {"listen": HOST, "rr_port": RR, "echo_port": RR, "allow": [f"{HOST}/32"]},
        "iperf3": {"port": IPERF3, "admit": "peers"},
        # Renders every 0.5 s, not 5: the bench reads the counts of a snapshot rendered after each attack.
        "web": {"listen": f"{HOST}:{WEB}", "config_file": str(work / "web.yml"), "refresh_seconds": 0.5},
        "budget": {"state_file": str(work / "budget.json")},
    }
    path = work / "target.yaml"
    path.write_text(json.dumps(cfg))
    log = (work / "target.log").open("wb")
    # Guarded: killed with this bench, which a test's timeout may kill (its exporter once held the
    # ports for the rest of a CI run).
    proc = subprocess.Popen(procs.guarded([*PATHPROBE, "run", "--config", str(path)]), stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            scrape()
            return proc
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the exporter did not start: {(work / 'target.log').read_text()[-2000:]}")


CONTEXT = ssl.create_default_context()
CONTEXT.check_hostname = False
CONTEXT.verify_mode = ssl.CERT_NONE


def scrape(auth: str | None = f"{USER}:{PASSWORD}", timeout: float = 5) -> dict[tuple[str, str], float]:
    req = urllib.request.Request(f"https://{HOST}:{WEB}/metrics")
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    with urllib.request.urlopen(req, timeout=timeout, context=CONTEXT) as r:
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in ("pathprobe_responder_requests_total", "pathprobe_web_refused_total"):
                key = (s.labels.get("responder", "web"), s.labels.get("result") or s.labels.get("reason", ""))
                out[key] = s.value
            elif s.name == "pathprobe_scrape_snapshot_age_seconds":
                out["age", ""] = s.value
    return out


def counts_since(moment: float) -> dict[tuple[str, str], float]:
    """The counts of a snapshot rendered after `moment` (time.monotonic()): /metrics serves
    a snapshot rendered in the background, up to its refresh interval old."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = scrape()
        if got.pop(("age", "")) < time.monotonic() - moment:
            return got
        time.sleep(0.2)
    raise SystemExit("no fresh /metrics snapshot in 30 s")


def footprint(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def closed(pid: int, fds: int) -> None:
    """Until process `pid` holds at most `fds` open files, for at most 10 s (then the bound says it),
    and at least 1 s: connections the attack left are closed as their timeouts end."""
    started = time.monotonic()
    while time.monotonic() - started < 1 or (footprint(pid)[1] > fds and time.monotonic() - started < 10):
        time.sleep(0.1)


def peer_probes_work() -> bool:
    """A peer's RTT and loss probes and an authorized scrape, right after an attack. Answered is
    what is asked, not fast: an answer counts for 5 s, as the exporter can be short of a CPU when
    the tests run at the lowest priority beside labs (CI's first phase)."""
    ok = True
    for probe in (["rtt", "-c", "5", "-i", "50ms"], ["loss", "-c", "20", "--rate", "50/s"]):
        cmd = [*PATHPROBE, "probe", probe[0], HOST, "--port", str(RR), *probe[1:], "--timeout", "5s", "--json"]
        ok &= subprocess.run(cmd, capture_output=True, timeout=60, check=False).returncode == 0
    try:
        scrape()
    except OSError:
        return False
    return ok


# --- the attacks: each returns what it sent -----------------------------------------------
def connect(source: str = HOST, port: int = RR) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(2)
    s.connect((HOST, port))
    return s


def rr_garbage() -> str:
    for _ in range(200):
        with connect() as s:
            s.sendall(random.randbytes(64))
            with contextlib.suppress(OSError):
                s.recv(16)
    return "200 connections, 64 random bytes as the hello"


def rr_oversized() -> str:
    for size in (0, wire.RR_MAX_SIZE + 1, 2**32 - 1):
        with connect() as s:
            s.sendall(wire.RR_HELLO.pack(wire.RR_MAGIC, wire.RR_VERSION, size))
            with contextlib.suppress(OSError):
                s.recv(16)
    return "hellos asking 0, 64 KiB + 1 and 4 GiB request sizes"


def rr_slowloris() -> str:
    conns = [connect() for _ in range(50)]
    for i in range(3):  # one byte of the hello per second, 3 s
        for s in conns:
            with contextlib.suppress(OSError):
                s.send(wire.RR_HELLO.pack(wire.RR_MAGIC, wire.RR_VERSION, 1)[i : i + 1])
        time.sleep(1)
    for s in conns:
        s.close()
    return "50 connections, one hello byte a second for 3 s"


def rr_connection_flood() -> str:
    held = []
    for _ in range(200):
        with contextlib.suppress(OSError):
            held.append(connect())
    time.sleep(1)
    for s in held:
        s.close()
    return "200 connections from one source, held 1 s"


def rr_never_reads() -> str:
    with connect() as s:
        s.sendall(wire.RR_HELLO.pack(wire.RR_MAGIC, wire.RR_VERSION, 1024))
        s.settimeout(0.2)
        sent, deadline = 0, time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                sent += s.send(b"x" * 65536)
            except OSError:
                time.sleep(0.05)
    return f"requests sent for 3 s without reading an answer ({sent / 2**20:.0f} MiB went out)"


def udp(payloads: list[bytes], source: str = HOST) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((source, 0))
        for p in payloads:
            with contextlib.suppress(OSError):
                s.sendto(p, (HOST, RR))


def echo_garbage() -> str:
    udp([random.randbytes(random.randint(1, 1400)) for _ in range(5000)])
    return "5,000 random datagrams"


def echo_truncated_and_oversized() -> str:
    head = wire.echo_packet(1, 64, time.time_ns())
    udp([head[: random.randint(1, wire.ECHO_HEADER.size - 1)] for _ in range(1000)])
    udp([wire.echo_packet(2, 64, time.time_ns()) + b"\0" * random.randint(1400, 60000) for _ in range(1000)])
    return "1,000 truncated headers; 1,000 datagrams of 1.4-60 kB from a peer (echoed: MTU probes go up to 64 KiB)"


def echo_flood() -> str:
    sent, deadline = 0, time.monotonic() + 2
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        while time.monotonic() < deadline:
            for seq in range(200):
                s.sendto(wire.echo_packet(seq, 64, time.time_ns()), (HOST, RR))
            sent += 200
    return f"{sent:,} valid echoes in 2 s from a peer ({sent / 2:,.0f}/s; the cap is 2,000/s)"


def strangers() -> str:
    try:
        with connect(STRANGER) as s:
            s.sendall(wire.RR_HELLO.pack(wire.RR_MAGIC, wire.RR_VERSION, 1))
            s.recv(1)
    except OSError:
        pass
    udp([wire.echo_packet(i, 64, time.time_ns()) for i in range(100)], source=STRANGER)
    subprocess.run(
        ["iperf3", "-c", HOST, "-p", str(IPERF3), "-B", STRANGER, "-t", "1"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return "from 127.0.0.3: an rr hello, 100 echoes, an iperf3 test"


def metrics_credentials() -> str:
    for auth in [None, f"{USER}:wrong", f"{USER}:" + "x" * 2**20] * 30:
        with contextlib.suppress(OSError):
            scrape(auth)
    return "90 scrapes: none, wrong and 1 MiB credentials"


def metrics_concurrency() -> str:
    threads = [threading.Thread(target=lambda: _quietly(scrape)) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return "64 concurrent authorized scrapes"


def metrics_slow_clients() -> str:
    conns = []
    for _ in range(20):
        raw = socket.create_connection((HOST, WEB), timeout=2)
        try:
            conns.append(CONTEXT.wrap_socket(raw, server_hostname="localhost"))
        except OSError:
            raw.close()
    for i in range(3):
        for c in conns:
            _quietly(lambda c=c, i=i: c.send(b"GET /metrics HTTP/1.1\r\n"[i : i + 1]))
        time.sleep(1)
    for c in conns:
        c.close()
    return "20 TLS clients sending a request a byte a second for 3 s"


def _quietly(f: Callable[[], object]) -> None:
    with contextlib.suppress(OSError):
        f()


ATTACKS = [
    rr_garbage,
    rr_oversized,
    rr_slowloris,
    rr_connection_flood,
    rr_never_reads,
    echo_garbage,
    echo_truncated_and_oversized,
    echo_flood,
    strangers,
    metrics_credentials,
    metrics_concurrency,
    metrics_slow_clients,
]


def main() -> int:
    """Prints the table; exit status 1 when any attack left the exporter down, the peer
    unanswered or the footprint beyond the bound (exporter/tests/test_attacks.py runs it)."""
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        proc = start(Path(tmp))
        try:
            base_rss, base_fds = footprint(proc.pid)
            print(f"exporter pid {proc.pid}: RSS {base_rss / 2**20:.1f} MiB, {base_fds} fds before the attacks\n")
            print("| attack | what | counted | exporter up, peer probed, scraped | RSS MiB | fds | within bound |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            for attack in ATTACKS:
                before_counts, (rss0, fds0) = counts_since(time.monotonic()), footprint(proc.pid)
                what = attack()
                closed(proc.pid, base_fds + FD_BOUND)  # the exporter closes what the attack left
                after_counts = counts_since(time.monotonic())  # the attack's own counts, before the peer's probes
                works = proc.poll() is None and peer_probes_work()
                rss1, fds1 = footprint(proc.pid)
                delta = {k: v - before_counts.get(k, 0) for k, v in after_counts.items() if v - before_counts.get(k, 0)}
                counted = ", ".join(f"{r} {res}={n:,.0f}" for (r, res), n in sorted(delta.items())) or "-"
                bound = rss1 <= base_rss + RSS_BOUND and fds1 <= base_fds + FD_BOUND
                failed += not (works and bound)
                memory = f"{rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f}"
                print(
                    f"| {attack.__name__} | {what} | {counted} | {'yes' if works else 'NO'} | {memory} | "
                    f"{fds0} -> {fds1} | {'yes' if bound else 'NO'} |"
                )
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
