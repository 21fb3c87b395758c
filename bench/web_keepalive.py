"""Scrapes of a TLS /metrics on loopback: on one kept connection against a new connection (and
TLS handshake) each, the time per scrape and the CPU of client and server together.

Run: .venv/bin/python bench/web_keepalive.py [RUNS]   (loopback only; a few seconds a run)
"""

from __future__ import annotations

import http.client
import ssl
import sys
import tempfile
import time
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, Gauge

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "exporter" / "tests"))
from certs import self_signed

from pathprobe.config import WebSettings
from pathprobe.web import serve

SCRAPES = 200
HEADERS = {"Accept-Encoding": "gzip"}


CLIENT = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # one context, as a scraper holds one
CLIENT.check_hostname = False
CLIENT.verify_mode = ssl.CERT_NONE


def kept(port: int, n: int) -> float:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=CLIENT, timeout=5)
    start = time.perf_counter()
    for _ in range(n):
        conn.request("GET", "/metrics", headers=HEADERS)
        conn.getresponse().read()
    conn.close()
    return (time.perf_counter() - start) / n


def fresh(port: int, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=CLIENT, timeout=5)
        conn.request("GET", "/metrics", headers={**HEADERS, "Connection": "close"})
        conn.getresponse().read()
        conn.close()
    return (time.perf_counter() - start) / n


def main(runs: int) -> None:
    d = Path(tempfile.mkdtemp())
    cert, key = self_signed(d)
    (d / "web.yml").write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(cert), "key_file": str(key)}}))
    registry = CollectorRegistry()
    for i in range(200):
        Gauge(f"pathprobe_bench_{i}", "A gauge.", registry=registry).set(i)
    server = serve(WebSettings(listen="127.0.0.1:0", config_file=d / "web.yml"), registry)
    port = server.server_address[1]
    try:
        kept(port, 5)  # the first render
        for run in range(runs):
            cpu = time.process_time()
            k = kept(port, SCRAPES)
            cpu_kept, cpu = time.process_time() - cpu, time.process_time()
            f = fresh(port, SCRAPES)
            cpu_fresh = time.process_time() - cpu
            print(
                f"run {run + 1}: kept connection {k * 1e3:.2f} ms/scrape ({cpu_kept / SCRAPES * 1e3:.2f} ms CPU), "
                f"new connection {f * 1e3:.2f} ms/scrape ({cpu_fresh / SCRAPES * 1e3:.2f} ms CPU)"
            )
    finally:
        server.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
