"""`pathprobe demo`: the lab, one exporter per lab host, a real Prometheus and
Alertmanager, a webhook receiver that logs alerts to a file, and a live table."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import math
import os
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pathprobe import procs
from pathprobe.monitoring import prometheus, rules
from pathprobe.monitoring.params import Params
from pathprobe.promql import query

from . import net, shaping, topology
from .alerting import webhook_routing
from .configs import LAB_EVALUATION_INTERVAL, exporter_config, lab_alert_params, rotation_seconds, scrape_targets
from .state import LabError, State, in_ns, ns, spawn

WEBHOOK_PORT = 19099
# The demo's slot (--slot-seconds): a 120 s rotation of the default lab's four hosts.
SLOT_SECONDS = 40.0


def idle_tail_bound(p50: float) -> float:
    """How far above its p50 an idle RTT series' p99 may be in the demo for the lab to count as
    quiet: 10% of p50, or 0.15 ms on the sub-millisecond paths (where 10% is less than a
    scheduler's wake-up). The demo test asserts it; bench/lab_fidelity.py prints it beside ping."""
    return max(0.1 * p50, 0.15e-3)


def binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit(
        f"pathprobe demo: none of {', '.join(names)} is installed (apt-get install prometheus prometheus-alertmanager)"
    )


class _Webhook(http.server.BaseHTTPRequestHandler):
    log_file: Path

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.log_file.open("ab") as f:
            f.write(body.replace(b"\n", b" ") + b"\n")
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class _WebhookServer(http.server.ThreadingHTTPServer):
    # Alertmanager sends the notifications of many groups at once (the fire drills': dozens). With
    # socketserver's listen backlog of 5, the kernel drops the SYNs of the rest while this process
    # waits for a CPU, and each arrives a second later, behind notifications that left after it.
    request_queue_size = 128


def start_webhook(log_file: Path, port: int, host: str = "127.0.0.1") -> http.server.HTTPServer:
    """An Alertmanager webhook receiver that appends each notification to `log_file`, one JSON a line."""
    handler = type("Webhook", (_Webhook,), {"log_file": log_file})
    server = _WebhookServer((host, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def port_taken(port: int) -> bool:
    """Whether something listens on the port (SO_REUSEADDR as the servers bind it: a previous
    demo's connections in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def alertmanager_config(
    webhook_url: str, production: Path | None = None, evaluation_interval: str = LAB_EVALUATION_INTERVAL
) -> dict[str, Any]:
    """The production routing (`production`, e.g. alerts/alertmanager.yml) with every receiver a
    webhook and its waits scaled to `evaluation_interval` (alerting.webhook_routing); without one,
    everything to the webhook."""
    if production is not None:
        return webhook_routing(production.read_text(), webhook_url, evaluation_interval)
    return {
        "route": {
            "receiver": "log",
            "group_by": ["alertname", "region"],
            "group_wait": "5s",
            "group_interval": "10s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "log", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }


def wait_ready(url: str, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"pathprobe demo: {what} did not become ready at {url} in {timeout:g} s")


def _by_path(prom: str, expr: str) -> dict[tuple[str, str], float]:
    out = {}
    with contextlib.suppress(OSError, KeyError, ValueError):
        for s in query(prom, expr):
            out[(s["metric"].get("host", ""), s["metric"].get("peer", ""))] = float(s["value"][1])
    return out


TABLE_QUERIES = {
    "gbps_1": 'max by (host, peer) (pathprobe_throughput_bytes_per_second{streams="1",direction="send"}) * 8 / 1e9',
    "gbps_n": 'max by (host, peer) (pathprobe_throughput_bytes_per_second{streams!="1",direction="send"}) * 8 / 1e9',
    "expected": 'max by (host, peer) (pathprobe_throughput_expected_bytes_per_second{streams="1",direction="send"})'
    " * 8 / 1e9",
    "p50": 'max by (host, peer) (pathprobe_rtt_seconds{protocol="tcp", state="idle", quantile="0.5"})',
    "p99": 'max by (host, peer) (pathprobe_rtt_seconds{protocol="tcp", state="idle", quantile="0.99"})',
    "loss": 'sum by (host, peer) (increase(pathprobe_udp_packets_lost_total{state="idle"}[1m]))'
    ' / sum by (host, peer) (increase(pathprobe_udp_packets_sent_total{state="idle"}[1m]))',
    "age": "time() - max by (host, peer) (pathprobe_throughput_last_test_timestamp_seconds)",
}


def table(prom: str, topo: topology.Topology) -> str:
    data = {k: _by_path(prom, q) for k, q in TABLE_QUERIES.items()}
    firing = []
    with contextlib.suppress(OSError, KeyError, ValueError):
        firing = [
            a
            for a in json.load(urllib.request.urlopen(f"{prom}/api/v1/alerts", timeout=5))["data"]["alerts"]
            if a["state"] == "firing"
        ]

    def f(key: str, path: tuple[str, str], fmt: str, scale: float = 1) -> str:
        v = data[key].get(path)
        return "-" if v is None or math.isnan(v) else format(v * scale, fmt)  # v != v: NaN

    lines = [
        f"{'path':32} {'Gbit/s 1 flow':>13} {'N flows':>8} {'expected':>9} {'RTT p50':>9} {'p99':>8} "
        f"{'loss':>7} {'last test':>10}"
    ]
    for a in topo.hosts:
        for b in topo.hosts:
            if a is b:
                continue
            p = (a.name, b.name)
            lines.append(
                f"{a.name + ' -> ' + b.name:32} {f('gbps_1', p, '.3f'):>13} {f('gbps_n', p, '.3f'):>8} "
                f"{f('expected', p, '.3f'):>9} {f('p50', p, '.2f', 1e3) + ' ms':>9} "
                f"{f('p99', p, '.2f', 1e3) + ' ms':>8} {f('loss', p, '.2%'):>7} {f('age', p, '.0f') + ' s':>10}"
            )
    lines.append(f"firing alerts: {', '.join(sorted({a['labels']['alertname'] for a in firing})) or 'none'}")
    return "\n".join(lines)


def say(text: str) -> bool:
    """Print; False once stdout has gone (a closed pipe, a closed terminal), from then on
    writing to /dev/null: the demo must still clean up all it made."""
    try:
        print(text, flush=True)
        return True
    except OSError:  # BrokenPipeError, EIO from a hung-up terminal
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False


def dead_children(state: State | None) -> list[str]:
    """The demo's processes that have died (the delay line is restarted instead)."""
    return [
        f"{p['what']} (pid {p['pid']})"
        for p in (state.processes if state else [])
        if p["what"] != "delay-line" and not procs.alive(p["pid"])
    ]


# How often the demo checks its children; the live table is printed as often on a
# terminal, every TABLE_SECONDS into a pipe or file.
CHECK_SECONDS, TABLE_SECONDS = 5, 30


def run(args: argparse.Namespace) -> int:
    """The demo until Ctrl-C, SIGTERM, SIGHUP (a closed terminal), a closed stdout, the end of
    --duration or the death of one of its processes; whichever it is, everything it made goes."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    taken = [port for port in (args.prometheus_port, args.alertmanager_port, WEBHOOK_PORT) if port_taken(port)]
    if taken:  # before the clean-up below, which would take a running demo's lab away from it
        raise SystemExit(
            f"pathprobe demo: port(s) {', '.join(map(str, taken))} on 127.0.0.1 already in use "
            "(another demo running? stop it first, or choose other ports)"
        )
    if State.load() is not None or net._namespaces():
        say("cleaning up a previous lab:")
        for line in net.down():
            say("  " + line)
    topo = topology.load(args.topology)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    webhook = None
    failed: list[str] = []
    try:
        try:
            net.up(topo)
        except LabError as exc:
            raise SystemExit(f"pathprobe demo: {exc}") from exc
        exporters = start_exporters(topo, work, args.slot_seconds)
        alert_log = work / "alerts.log"
        alert_log.touch()
        webhook = start_webhook(alert_log, WEBHOOK_PORT)
        params = lab_alert_params(rotation_seconds(topo, args.slot_seconds))
        prom, _ = start_monitoring(
            topo, work, args.prometheus_port, args.alertmanager_port, args.alertmanager_routing, params
        )
        shown = say(
            f"Prometheus:   {prom}\nAlertmanager: http://127.0.0.1:{args.alertmanager_port}\n"
            f"Alerts log:   {alert_log}\nExporters:    "
            + ", ".join(f"http://{t}/metrics" for t in exporters)
            + "\nCtrl-C stops and cleans up everything."
        )
        deadline = time.monotonic() + args.duration if args.duration else None
        tty = sys.stdout.isatty()
        last_table = -math.inf
        while shown and not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            state = State.load()
            if state is not None and shaping.ensure_delay_line(state):
                shown = say("delay line had died: restarted")
            failed = dead_children(state)
            if failed:
                say(f"pathprobe demo: {', '.join(failed)} died (its log is in {work}): stopping")
                break
            if tty or time.monotonic() - last_table >= TABLE_SECONDS:
                last_table = time.monotonic()
                out = table(prom, topo)
                shown = say(("\x1b[H\x1b[2J" if tty else "\n") + time.strftime("%H:%M:%S ") + prom + "\n" + out)
            stop.wait(CHECK_SECONDS)
    finally:
        if webhook is not None:
            webhook.shutdown()
        say("\nstopping:")
        for line in net.down():
            say("  " + line)
    return 1 if failed else 0


def start_exporters(topo: topology.Topology, work: Path, slot_seconds: float) -> list[str]:
    targets = []
    for h in topo.hosts:
        cfg = exporter_config(topo, h.name, work, slot_seconds)
        path = work / f"{h.name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        cmd = in_ns(ns(h.name), [sys.executable, "-m", "pathprobe", "run", "--config", str(path)])
        spawn(cmd, work / f"{h.name}.log", f"exporter {h.name}")
        targets.append(cfg["web"]["listen"])
    for t in targets:
        wait_ready(f"http://{t}/metrics", f"exporter {t}", timeout=30)
    return targets


# The demo and the fire drill place the lab's monitoring each its own way: ports, routing, timing.
def start_monitoring(  # noqa: PLR0913, PLR0917 - see above
    topo: topology.Topology,
    work: Path,
    prom_port: int,
    am_port: int,
    routing: Path | None,
    params: Params,
    webhook_port: int = WEBHOOK_PORT,
    meshes: Mapping[str, str] | None = None,
) -> tuple[str, str]:
    rule_file = work / "pathprobe.rules.yml"
    rule_file.write_text(rules.dump(params))
    am_addr = f"127.0.0.1:{am_port}"
    targets = work / "targets.json"
    targets.write_text(json.dumps(scrape_targets(topo, meshes)))
    cfg = prometheus.render(
        "single", file_sd=str(targets), rule_files=[str(rule_file)], alertmanagers=[am_addr], interval="5s"
    )
    (work / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (work / "alertmanager.yml").write_text(
        yaml.safe_dump(alertmanager_config(f"http://127.0.0.1:{webhook_port}/alerts", routing), sort_keys=False)
    )
    for d in ("prometheus-data", "alertmanager-data"):
        shutil.rmtree(work / d, ignore_errors=True)
    am_cmd = [
        binary("prometheus-alertmanager", "alertmanager"),
        f"--config.file={work / 'alertmanager.yml'}",
        f"--storage.path={work / 'alertmanager-data'}",
        f"--web.listen-address={am_addr}",
        "--cluster.listen-address=",
    ]
    spawn(am_cmd, work / "alertmanager.log", "alertmanager")
    prom_cmd = [
        binary("prometheus"),
        f"--config.file={work / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        "--web.enable-lifecycle",
    ]
    spawn(prom_cmd, work / "prometheus.log", "prometheus")
    prom_url = f"http://127.0.0.1:{prom_port}"
    wait_ready(f"{prom_url}/-/ready", "Prometheus")
    wait_ready(f"http://{am_addr}/-/ready", "Alertmanager")
    return prom_url, f"http://{am_addr}"
