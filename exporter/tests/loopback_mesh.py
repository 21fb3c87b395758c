"""Exporters of a small mesh on loopback, each known by its own 127.0.0.x address (the route
to 127.0.0.0/8 picks 127.0.0.1, so every other address is a second one, as on a multi-homed
host): their configs, their processes, and their counters."""

import http.client
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

SLOT = 6.0  # one TCP test of 1 s and its margin in each half

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def unused_port() -> int:
    """A port free for TCP and UDP below the kernel's ephemeral range (32768-60999 by default):
    no prober's socket can take it between this choice and the exporter's bind."""
    while True:
        port = random.randrange(20000, 32768)
        try:
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                with socket.socket(socket.AF_INET, kind) as s:
                    s.bind(("0.0.0.0", port))
        except OSError:
            continue
        return port


def serve(address: str, ports: dict[str, Any], seconds: float = 30) -> subprocess.Popen[bytes]:
    """`pathprobe serve` (the responders alone) on `address` at `ports`' rr, echo and iperf3 ports,
    once it says it is ready: its iperf3 listens then (a prober that connects before would be refused,
    and on a VM short of CPU the server's start takes seconds)."""
    flags = {"--rr-port": ports["rr_port"], "--echo-port": ports["echo_port"], "--iperf3-port": ports["iperf3_port"]}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pathprobe", "serve", "--listen", address, *(f"{k}={v}" for k, v in flags.items())],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    said, deadline = b"", time.monotonic() + seconds
    while b"pathprobe serve:" not in said:
        left = deadline - time.monotonic()
        readable = left > 0 and select.select([proc.stdout], [], [], left)[0]
        chunk = os.read(proc.stdout.fileno(), 4096) if readable else b""
        if not chunk:
            proc.kill()
            proc.wait()
            raise AssertionError(f"pathprobe serve not ready within {seconds:g} s (exit {proc.returncode}): {said!r}")
        said += chunk
    return proc


def member(name: str, address: str) -> dict[str, Any]:
    ports = {"rr_port": unused_port(), "echo_port": unused_port(), "iperf3_port": unused_port()}
    return {"name": name, "address": address, "region": f"r-{name}", "path_class": "inter_region", **ports}


def config(tmp_path: Path, me: dict[str, Any], peers: list[dict[str, Any]], web: int, slot: float = SLOT) -> Path:
    cfg = {
        "host": {"name": me["name"], "address": me["address"], "region": me["region"]},
        "peers": peers,
        "probes": {
            "throughput": {"protocols": ["tcp"], "streams": [1], "duration_seconds": 1, "omit_seconds": 0},
            "rtt": {"interval_seconds": 0.2},
            "loss": {"rate_pps": 10},
        },
        "schedule": {"slot_seconds": slot, "jitter_seconds": 0, "timeout_margin_seconds": 1},
        "responders": {"listen": me["address"], "rr_port": me["rr_port"], "echo_port": me["echo_port"]},
        "iperf3": {"port": me["iperf3_port"]},
        "web": {"listen": f"127.0.0.1:{web}"},
        "budget": {"state_file": str(tmp_path / f"budget-{me['name']}.json")},
        # One kernel clock: one-way delays of some microseconds are exact to the stamps' nanoseconds.
        "clock": {"source": "stated", "error_bound_seconds": 1e-8},
    }
    path = tmp_path / f"{me['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@contextmanager
def exporter(path: Path, log: Path, prefix: tuple[str, ...] = ()) -> Iterator[None]:
    """`pathprobe run` on `path`, its log in `log`; `prefix`: a command that runs it (e.g. env)."""
    with log.open("w") as out:
        # A session of its own: a prefix (faketime) may run the exporter as its child, and the
        # signal must reach the exporter, not only the prefix.
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "pathprobe", "run", "--config", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=out,
            start_new_session=True,
        )
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # a hung exporter, and a child stuck between fork and exec
            proc.wait(timeout=5)
            raise


def count(got: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for (n, ls), v in got.items() if n == name and labels.items() <= dict(ls).items())


def until(what: str, check: Callable[[], Any], seconds: float = 30) -> Any:
    """Poll `check` until it returns something true, for at most `seconds`."""
    deadline = time.monotonic() + seconds
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, http.client.HTTPException) as exc:  # not up yet, or a connection cut
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.2)
    raise AssertionError(f"not within {seconds} s: {what} (last: {last!r})")


def request(port: int, method: str, path: str) -> tuple[int, str]:
    """(status, body) of one HTTP request to an exporter's web port on 127.0.0.1."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def samples(port: int) -> Samples:
    """Every sample of one scrape of an exporter's /metrics, by name and label set."""
    status, text = request(port, "GET", "/metrics")
    assert status == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def peers_shown(got: Samples) -> set[str]:
    """The peers a scrape shows (their pathprobe_peer_info)."""
    return {dict(labels)["peer"] for name, labels in got if name == "pathprobe_peer_info"}


def wait_for(port: int, what: str, check: object, seconds: float = 20, show: tuple[str, ...] = ()) -> dict:
    """Scrape until `check(samples)` holds (/metrics is a snapshot refreshed in the background);
    on a timeout, the last scrape's samples of the families `show` say what it read instead."""
    last: dict = {}  # the last scrape's samples (none after a failed one)

    def scraped() -> dict | None:
        last.clear()
        last.update(samples(port))
        return dict(last) if check(last) else None  # type: ignore[operator]

    try:
        return until(what, scraped, seconds)
    except AssertionError:
        shown = sorted((n, sorted(ls), v) for (n, ls), v in last.items() if n in show)
        read = shown if show else sorted(n for n, _ in last)[:20]
        raise AssertionError(f"not within {seconds} s: {what}; last scrape: {read}") from None


@contextmanager
def prometheus(work: Path, scrape_configs: list[dict[str, Any]], rule_files: tuple[Path, ...] = ()) -> Iterator[str]:
    """A real Prometheus scraping and evaluating every second, its data and log in `work`; yields
    its URL once ready."""
    port = unused_port()
    (work / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(f) for f in rule_files],
                "scrape_configs": scrape_configs,
            }
        )
    )
    with (work / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        until("Prometheus ready", lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def api(url: str, path: str, **params: str) -> Any:
    """The `data` of a Prometheus API answer (`path`: e.g. "query", "alerts")."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}/api/v1/{path}{query}", timeout=5) as resp:
        return json.load(resp)["data"]
