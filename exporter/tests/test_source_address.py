"""A multi-homed host: its peers know it by an address that is not the one the route picks.
Real processes on loopback, where that is the case for every address but 127.0.0.1 (the
route to 127.0.0.0/8 has source 127.0.0.1): h0 is known as 127.0.0.3, h1 as 127.0.0.2,
each admits only the other. Every probe and test of h0 must reach h1's responders from
127.0.0.3, so h1 admits them all and refuses none."""

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from test_reload import free_port, wait_for

SLOT = 6.0  # one TCP test of 1 s and its margin in each half

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def member(name: str, address: str) -> dict[str, Any]:
    ports = {"rr_port": free_port(), "echo_port": free_port(), "iperf3_port": free_port()}
    return {"name": name, "address": address, "region": f"r-{name}", "path_class": "inter_region", **ports}


def config(tmp_path: Path, me: dict[str, Any], peer: dict[str, Any], web: int) -> Path:
    cfg = {
        "host": {"name": me["name"], "address": me["address"], "region": me["region"]},
        "peers": [peer],
        "probes": {
            "throughput": {"protocols": ["tcp"], "streams": [1], "duration_seconds": 1, "omit_seconds": 0},
            "rtt": {"interval_seconds": 0.2}, "loss": {"rate_pps": 10},
        },
        "schedule": {"slot_seconds": SLOT, "jitter_seconds": 0, "timeout_margin_seconds": 1},
        "responders": {"listen": me["address"], "rr_port": me["rr_port"], "echo_port": me["echo_port"]},
        "iperf3": {"port": me["iperf3_port"]},
        "web": {"listen": f"127.0.0.1:{web}"},
        "budget": {"state_file": str(tmp_path / f"budget-{me['name']}.json")},
    }  # fmt: skip
    path = tmp_path / f"{me['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@contextmanager
def exporter(path: Path, log: Path) -> Iterator[None]:
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pathprobe", "run", "--config", str(path)],
                                stdout=subprocess.DEVNULL, stderr=out)  # fmt: skip
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def count(got: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in got.items() if n == name and labels.items() <= dict(ls).items())


def test_a_host_known_by_a_second_address_is_admitted_by_its_peer(tmp_path: Path) -> None:
    h0, h1 = member("h0", "127.0.0.3"), member("h1", "127.0.0.2")
    web0, web1 = free_port(), free_port()
    with (exporter(config(tmp_path, h1, h0, web1), tmp_path / "h1.log"),
          exporter(config(tmp_path, h0, h1, web0), tmp_path / "h0.log")):  # fmt: skip
        requests = "pathprobe_responder_requests_total"

        def admitted_everything(got: Samples) -> bool:
            return all(count(got, requests, responder=r, result=ok) > 0
                       for r, ok in (("rr", "accepted"), ("echo", "accepted"), ("iperf3", "ok")))  # fmt: skip

        got = wait_for(web1, "h1 admitted h0's rr, echo and iperf3 tests", admitted_everything, seconds=4 * SLOT)
        refused = {r: count(got, requests, responder=r, result="not_allowed") for r in ("rr", "echo", "iperf3")}
        assert refused == {"rr": 0, "echo": 0, "iperf3": 0}
        runs = "pathprobe_probe_runs_total"
        got = wait_for(web0, "h0's throughput test against h1 ran",
                       lambda g: count(g, runs, probe="throughput", result="ok") > 0)  # fmt: skip
        failed = {p: count(got, runs, probe=p, result="not_allowed") for p in ("rtt", "loss", "throughput")}
        assert failed == {"rtt": 0, "loss": 0, "throughput": 0}
