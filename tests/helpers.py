"""Starting processes in lab hosts and reading their metrics, for the integration tests."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from prometheus_client.parser import text_string_to_metric_families

from pathprobe_lab.state import in_ns, ns, spawn
from pathprobe_lab.topology import Topology

T = TypeVar("T")
PATHPROBE = [sys.executable, "-m", "pathprobe"]


def topology(text: str) -> Topology:
    return Topology.model_validate(yaml.safe_load(text))


def in_host(host: str, cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(in_ns(ns(host), cmd), capture_output=True, text=True, timeout=timeout, check=False)


def start_exporter(host: str, cfg: dict[str, Any], workdir: Path) -> subprocess.Popen[bytes]:
    path = workdir / f"{host}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = in_ns(ns(host), [*PATHPROBE, "run", "--config", str(path)])
    return spawn(cmd, workdir / f"{host}.log", f"exporter {host}")


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(address: str, timeout: float = 5) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """Sum of the samples of `name` whose labels include `labels`; None when there are none."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    return sum(found) if found else None


def wait_for(what: str, check: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    """Poll `check` until it returns something other than None/False; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except OSError as exc:  # not up yet
            last_error = exc
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last error: {last_error})")


def payload_rate(link_bits_per_second: float, mtu: int = 1500) -> float:
    """TCP payload bytes/s through a shaper that counts whole Ethernet frames (MSS with timestamps)."""
    return link_bits_per_second / 8 * (mtu - 52) / (mtu + 14)
