"""/metrics serving: snapshots, basic auth (WSGI app called directly)."""

import base64
import gzip
import time
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from pathprobe.web import Snapshot, make_app


def call(app: Any, path: str = "/metrics", auth: str | None = None) -> tuple[str, bytes]:
    environ = {"PATH_INFO": path}
    if auth:
        environ["HTTP_AUTHORIZATION"] = "Basic " + base64.b64encode(auth.encode()).decode()
    status: list[str] = []
    body = b"".join(app(environ, lambda s, h: status.append(s)))
    return status[0], body


def registry_with(value: float) -> tuple[CollectorRegistry, Gauge]:
    r = CollectorRegistry()
    g = Gauge("pathprobe_test_value", "test", registry=r)
    g.set(value)
    return r, g


def test_scrape_serves_the_snapshot_and_refreshes_behind() -> None:
    r, g = registry_with(1)
    snap = Snapshot(r)
    assert b"pathprobe_test_value 1.0" in snap.get()
    g.set(2)
    snap.render()  # what the background refresh does
    body = snap.get()
    assert b"pathprobe_test_value 2.0" in body
    assert b"pathprobe_scrape_snapshot_age_seconds" in body
    assert b"pathprobe_scrape_render_seconds" in body


def test_background_refresh_picks_up_new_values() -> None:
    r, g = registry_with(1)
    snap = Snapshot(r, refresh=0.05)
    snap.get()
    g.set(3)
    deadline = time.monotonic() + 5
    while b"pathprobe_test_value 3.0" not in snap.get() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b"pathprobe_test_value 3.0" in snap.get()


def test_gzip_snapshot_is_complete() -> None:
    r, _ = registry_with(5)
    body = gzip.decompress(Snapshot(r).get(gzipped=True))  # two gzip members: snapshot, trailer
    assert b"pathprobe_test_value 5.0" in body and b"pathprobe_scrape_snapshot_age_seconds" in body


def test_basic_auth() -> None:
    r, _ = registry_with(1)
    app = make_app(Snapshot(r), ("prom", "s3cret"))
    assert call(app)[0].startswith("401")
    assert call(app, auth="prom:wrong")[0].startswith("401")
    status, body = call(app, auth="prom:s3cret")
    assert status.startswith("200") and b"pathprobe_test_value" in body


def test_paths() -> None:
    r, _ = registry_with(1)
    app = make_app(Snapshot(r), None)
    assert call(app, "/")[0].startswith("200")
    assert call(app, "/nope")[0].startswith("404")
