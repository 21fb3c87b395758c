"""/metrics serving: snapshots, basic auth (WSGI app called directly), and the server
on real sockets: TLS, idle, slow and many clients."""

import base64
import concurrent.futures
import contextlib
import gzip
import http.client
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric

from pathprobe.config import BasicAuth, TlsSettings, WebSettings
from pathprobe.web import Snapshot, make_app, serve


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


class Breaks:
    """A collector that raises while `broken` is set, as a render once did on a removed peer."""

    def __init__(self) -> None:
        self.broken = False

    def collect(self) -> Iterator[Metric]:
        if self.broken:
            raise KeyError("h1")
        yield GaugeMetricFamily("pathprobe_test_rendered", "test", value=1)


def trailer_value(body: bytes, name: str) -> float:
    line = next(x for x in body.decode().splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def test_a_render_that_raises_keeps_the_last_snapshot_counted_and_retries(caplog: pytest.LogCaptureFixture) -> None:
    r, g = registry_with(1)
    breaks = Breaks()
    r.register(breaks)  # type: ignore[arg-type]
    snap = Snapshot(r, refresh=0.05)
    assert b"pathprobe_test_value 1.0" in snap.get()
    g.set(2)
    breaks.broken = True
    time.sleep(0.3)  # several background renders fail
    body = snap.get()
    assert b"pathprobe_test_value 1.0" in body  # the last good snapshot, ageing
    assert trailer_value(body, "pathprobe_scrape_render_errors_total") >= 2
    assert trailer_value(body, "pathprobe_scrape_snapshot_age_seconds") >= 0.2
    assert "rendering /metrics failed" in caplog.text and "KeyError" in caplog.text
    breaks.broken = False
    deadline = time.monotonic() + 5
    while b"pathprobe_test_value 2.0" not in snap.get() and time.monotonic() < deadline:
        time.sleep(0.05)
    body = snap.get()
    assert b"pathprobe_test_value 2.0" in body  # the render thread lived on and retried
    assert trailer_value(body, "pathprobe_scrape_snapshot_age_seconds") < 0.2


def test_a_first_render_that_raises_still_answers_200() -> None:
    r, _ = registry_with(1)
    breaks = Breaks()
    breaks.broken = True
    r.register(breaks)  # type: ignore[arg-type]
    status, body = call(make_app(Snapshot(r), None))
    assert status == "200 OK"
    assert trailer_value(body, "pathprobe_scrape_render_errors_total") == 1


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


# --- the server on real sockets (127.0.0.1): TLS, basic auth, idle and slow clients ---


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", "/CN=127.0.0.1", "-days", "1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def secured(tls_files: tuple[Path, Path], tmp_path: Path) -> WebSettings:
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    return WebSettings(
        listen="127.0.0.1:0",
        tls=TlsSettings(cert_file=tls_files[0], key_file=tls_files[1]),
        basic_auth=BasicAuth(username="prom", password_file=password),
    )


@contextlib.contextmanager
def running(settings: WebSettings, **kw: Any) -> Iterator[tuple[Any, int]]:
    r, _ = registry_with(1)
    server = serve(settings, r, **kw)
    try:
        yield server, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def scrape(port: int, tls: bool = True, auth: str | None = "prom:s3cret", timeout: float = 3.0) -> tuple[int, bytes]:
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn: http.client.HTTPConnection = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=ctx)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def refusals(server: Any, *reasons: str, at_least: int = 1, within: float = 5.0) -> int:
    """The server's count of those refusals, once it reaches `at_least` (it counts just after
    it closes the connection, so a client can see the close first)."""
    deadline = time.monotonic() + within
    while (n := sum(server.stats.refused[r] for r in reasons)) < at_least and time.monotonic() < deadline:
        time.sleep(0.01)
    return n


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """True when the server closes `sock` (EOF or reset) within `within` seconds; what it sends first
    (a TLS alert) is read and dropped."""
    end = time.monotonic() + within
    try:
        while (left := end - time.monotonic()) > 0:
            sock.settimeout(left)
            if sock.recv(4096) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        pass
    return False


def test_an_idle_connection_does_not_block_tls_scrapes(secured: WebSettings) -> None:
    # Regression (issue 17.1): the listening socket was wrapped in TLS, so accept() ran the
    # handshake of the idle connection on the serving thread, without a timeout: every
    # scrape after it hung.
    with running(secured) as (_, port), socket.create_connection(("127.0.0.1", port)):
        start = time.monotonic()
        status, body = scrape(port, timeout=2.0)
        assert status == 200 and b"pathprobe_test_value 1.0" in body
        assert time.monotonic() - start < 2.0


def test_32_concurrent_tls_scrapes_all_succeed(secured: WebSettings) -> None:
    with running(secured) as (_, port), socket.create_connection(("127.0.0.1", port)):
        barrier = threading.Barrier(32)

        def one(_: int) -> int:
            barrier.wait(timeout=10)
            return scrape(port, timeout=5.0)[0]

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            assert list(pool.map(one, range(32))) == [200] * 32


def test_idle_connections_are_closed_after_the_timeout_plain_and_tls(secured: WebSettings) -> None:
    plain = WebSettings(listen="127.0.0.1:0")
    for settings in (plain, secured):
        with running(settings, io_timeout=0.5) as (server, port):
            with socket.create_connection(("127.0.0.1", port)) as idle:
                assert closed_by_server(idle, within=5.0)
            assert scrape(port, tls=settings.tls is not None)[0] == 200
            reason = "tls_handshake" if settings.tls else "timeout"
            assert refusals(server, reason) >= 1


def test_a_trickling_client_is_cut_at_the_deadline() -> None:
    with running(WebSettings(listen="127.0.0.1:0"), io_timeout=1.0, deadline=1.0) as (server, port):
        with socket.create_connection(("127.0.0.1", port)) as slow:
            start = time.monotonic()
            closed = False
            for ch in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                try:
                    slow.send(bytes([ch]))
                except OSError:
                    closed = True
                    break
                if closed_by_server(slow, within=0.2):  # a byte every 0.2 s beats the 1 s read timeout
                    closed = True
                    break
            assert closed and time.monotonic() - start < 5.0
        assert refusals(server, "deadline") == 1
        assert scrape(port, tls=False, auth=None)[0] == 200


def test_workers_are_bounded_and_serve_again_when_idle_clients_go() -> None:
    before = threading.active_count()
    with running(WebSettings(listen="127.0.0.1:0"), io_timeout=0.5, max_workers=4) as (server, port):
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        try:
            peak = threading.active_count()
            assert peak - before <= 4 + 3  # the workers, the serving thread, the reaper, the renderer
            assert scrape(port, tls=False, auth=None, timeout=15.0)[0] == 200
        finally:
            for s in idle:
                s.close()
        assert refusals(server, "timeout", "busy") >= 1


def test_plain_http_on_the_tls_port_is_refused_and_counted(secured: WebSettings) -> None:
    with running(secured) as (server, port):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert closed_by_server(s, within=5.0)
        assert refusals(server, "tls_handshake") == 1
        assert scrape(port)[0] == 200


def test_credentials_over_tls_none_wrong_and_oversized(secured: WebSettings) -> None:
    with running(secured) as (server, port):
        assert scrape(port, auth=None)[0] == 401
        assert scrape(port, auth="prom:wrong")[0] == 401
        assert scrape(port, auth="prom:" + "x" * 5000)[0] == 431
        # Over http.server's 64 KiB line limit: refused before the app (the server closes while the
        # client still sends, so the client may see the close rather than the 431), counted all the same.
        with contextlib.suppress(OSError):
            scrape(port, auth="prom:" + "x" * 2**20)
        assert refusals(server, "header_too_large", at_least=2) == 2
        status, body = scrape(port)
        assert status == 200
        assert b'pathprobe_web_refused_total{reason="unauthorized"} 2' in body
        assert b'pathprobe_web_refused_total{reason="header_too_large"} 2' in body
        assert refusals(server, "unauthorized", at_least=2) == 2
