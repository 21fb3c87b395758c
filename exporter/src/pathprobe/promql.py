"""THE Prometheus HTTP API query: the capacity review's history, the demo's table, the evidence
bundle's RTT and loss."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any


def query(url: str, expr: str, timeout: float = 30) -> list[dict[str, Any]]:
    """The instant vector `expr` evaluates to now, on the Prometheus at `url`."""
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=timeout) as r:
        return json.load(r)["data"]["result"]  # type: ignore[no-any-return]


def query_range(url: str, expr: str, span: tuple[float, float], step: float) -> list[dict[str, Any]]:
    """The range vector (matrix) `expr` evaluates to over `span` (Unix seconds) every `step` s."""
    args = urllib.parse.urlencode({"query": expr, "start": span[0], "end": span[1], "step": step})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{args}", timeout=30) as r:
        return json.load(r)["data"]["result"]  # type: ignore[no-any-return]
