"""/tests and /tests/<id>: the evidence store's records (evidence.py) as JSON, behind the same
authentication as /metrics (app.py checks it before any route). /tests lists the records, newest
first (`?peer=NAME` only that peer's, `?since=SECONDS` only tests started that many seconds ago
or later); /tests/<id> is one test's whole record, the id as pathprobe_evidence_last_test_info
names it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from ..evidence import ID, EvidenceStore

StartResponse = Callable[..., Any]
PREFIX = "/tests"
JSON = "application/json"


def routed(path: str) -> bool:
    """Whether `path` is one of these routes."""
    return path == PREFIX or path.startswith(PREFIX + "/")


class EvidenceRoutes:
    def __init__(self, store: EvidenceStore | None):
        self.store = store

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _answer(start_response, "405 Method Not Allowed", {"error": "only GET"}, [("Allow", "GET, HEAD")])
        if self.store is None:
            disabled = {"error": "the evidence store is disabled (evidence.enabled)"}
            return _answer(start_response, "404 Not Found", disabled)
        path = environ.get("PATH_INFO", PREFIX).rstrip("/")
        if path == PREFIX:
            return self._list(environ, start_response)
        test_id = path.removeprefix(PREFIX + "/")
        record = self.store.get(test_id) if ID.match(test_id) else None
        if record is None:
            missing = {"error": f"no record {test_id!r} (evicted, or never kept)"}
            return _answer(start_response, "404 Not Found", missing)
        return _answer(start_response, "200 OK", record)

    def _list(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        assert self.store is not None
        query = parse_qs(environ.get("QUERY_STRING", ""))
        peer = query.get("peer", [None])[0]
        since = None
        if "since" in query:
            try:
                since = time.time() - float(query["since"][0])
            except ValueError:
                return _answer(start_response, "400 Bad Request", {"error": "since: a number of seconds"})
        tests = [s.to_json() for s in self.store.summaries(since=since, peer=peer)]
        return _answer(start_response, "200 OK", {"tests": tests})


def _answer(
    start_response: StartResponse, status: str, body: dict[str, Any], extra: list[tuple[str, str]] | None = None
) -> list[bytes]:
    raw = json.dumps(body, indent=1).encode() + b"\n"
    start_response(status, [("Content-Type", JSON), ("Content-Length", str(len(raw))), *(extra or [])])
    return [raw]
