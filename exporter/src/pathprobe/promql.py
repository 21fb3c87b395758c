"""THE Prometheus HTTP API query: the capacity review's history and the demo's table."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any


def query(url: str, expr: str, timeout: float = 30) -> list[dict[str, Any]]:
    """The instant vector `expr` evaluates to now, on the Prometheus at `url`."""
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=timeout) as r:
        return json.load(r)["data"]["result"]  # type: ignore[no-any-return]
