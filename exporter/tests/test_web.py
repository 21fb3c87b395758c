"""/metrics serving: snapshots, basic auth (WSGI app called directly), and the server
on real sockets: TLS, idle, slow and many clients."""

import base64
import concurrent.futures
import contextlib
import gzip
import http.client
import logging
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from certs import bcrypt_hash, self_signed
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric

from pathprobe.config import WebSettings
from pathprobe.web import (
    MAX_AGE_SECONDS,
    RENDER_LEAD,
    RENDER_MARGIN_SECONDS,
    ConnectionLimits,
    MetricsServer,
    Scrapers,
    Snapshot,
    make_app,
    serve,
)
from pathprobe.webconfig import WebConfigSource


def call(app: Any, path: str = "/metrics", auth: str | None = None) -> tuple[str, bytes]:
    environ = {"PATH_INFO": path}
    if auth:
        environ["HTTP_AUTHORIZATION"] = "Basic " + base64.b64encode(auth.encode()).decode()
    status: list[str] = []
    body = b"".join(app(environ, lambda s, h: status.append(s)))
    return status[0], body


_snapshots: list[Snapshot] = []


def snapshot(registry: CollectorRegistry, refresh: float = 5.0) -> Snapshot:
    """A Snapshot whose render thread stops when the test ends (a broken one would log on for 300 s)."""
    _snapshots.append(Snapshot(registry, refresh=refresh))
    return _snapshots[-1]


@pytest.fixture(autouse=True)
def _close_snapshots() -> Iterator[None]:
    yield
    while _snapshots:
        _snapshots.pop().close()


def registry_with(value: float) -> tuple[CollectorRegistry, Gauge]:
    r = CollectorRegistry()
    g = Gauge("pathprobe_test_value", "test", registry=r)
    g.set(value)
    return r, g


def test_scrape_serves_the_snapshot_and_refreshes_behind() -> None:
    r, g = registry_with(1)
    snap = snapshot(r)
    assert b"pathprobe_test_value 1.0" in snap.get()
    g.set(2)
    snap.render()  # what the background refresh does
    body = snap.get()
    assert b"pathprobe_test_value 2.0" in body
    assert b"pathprobe_scrape_snapshot_age_seconds" in body
    assert b"pathprobe_scrape_render_seconds" in body


def test_background_refresh_picks_up_new_values() -> None:
    r, g = registry_with(1)
    snap = snapshot(r, refresh=0.05)
    snap.get()
    g.set(3)
    deadline = time.monotonic() + 5
    while b"pathprobe_test_value 3.0" not in snap.get() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b"pathprobe_test_value 3.0" in snap.get()


def test_scrapers_expect_each_one_interval_after_its_last_scrape() -> None:
    scrapers = Scrapers(kept=2)
    assert scrapers.next_expected(0.0) is None
    scrapers.scraped("10.0.0.1", 100.0)
    assert scrapers.next_expected(100.0) is None  # one scrape: no interval yet
    scrapers.scraped("10.0.0.1", 115.0)
    scrapers.scraped("10.0.0.2", 101.0)
    scrapers.scraped("10.0.0.2", 161.0)
    assert scrapers.next_expected(116.0) == 130.0  # the earlier of 115 + 15 and 161 + 60
    assert scrapers.next_expected(146.0) == 221.0  # the first missed two intervals: no longer expected
    assert scrapers.next_expected(116.0, shortest=30.0) == 221.0  # the 15 s one is too frequent to time for
    scrapers.scraped("10.0.0.3", 170.0)  # a third source: the one unheard of longest is forgotten
    assert scrapers.next_expected(171.0) == 221.0


def rendered_at(t: float, *scrapes: tuple[str, float]) -> Snapshot:
    """A snapshot (refresh 5 s) whose last render began at `t`, after these scrapes (source, time)."""
    snap = snapshot(CollectorRegistry(), refresh=5.0)
    snap._tried = t
    for source, at in scrapes:
        snap._scrapers.scraped(source, at)
    return snap


def test_renders_are_timed_just_ahead_of_a_steady_scrapers_next_scrape() -> None:
    assert rendered_at(100.0).next_render(100.0) == 105.0  # no scraper known: every refresh
    every_15s = rendered_at(114.9, ("a", 100.0), ("a", 115.0))
    lead = 130.0 - every_15s.next_render(115.0)
    assert lead == pytest.approx(RENDER_MARGIN_SECONDS + RENDER_LEAD * every_15s._render_seconds)
    # Rendered for that scrape and it has not come: again `refresh` after it was due.
    assert rendered_at(129.9, ("a", 100.0), ("a", 115.0)).next_render(130.0) == 135.0
    # Timed for it with a longer lead than the last render's time now gives: still rendered for it.
    timed_early = rendered_at(129.5, ("a", 100.0), ("a", 115.0))
    timed_early._rendered_for = 130.0
    assert timed_early.next_render(129.6) == 135.0
    # A 60 s scraper: a render ahead of its scrape, and none older than MAX_AGE_SECONDS meanwhile.
    assert rendered_at(100.0, ("b", 40.0), ("b", 100.0)).next_render(100.0) == 100.0 + MAX_AGE_SECONDS
    # One scraping every second (a test that polls): every refresh, as if none were known.
    assert rendered_at(100.0, ("c", 99.0), ("c", 100.0)).next_render(100.0) == 105.0
    # Beside the 15 s one: timed for that one (no render made yet: its lead is the margin alone).
    both = rendered_at(120.0, ("a", 100.0), ("a", 115.0), ("c", 119.0), ("c", 120.0))
    assert both.next_render(120.0) == pytest.approx(130.0 - RENDER_MARGIN_SECONDS)


class Costs:
    """A collector whose collect() takes `seconds`: of CPU (`busy`), or waiting (a busy host)."""

    def __init__(self, seconds: float, busy: bool) -> None:
        self.seconds, self.busy = seconds, busy

    def collect(self) -> Iterator[Metric]:
        if self.busy:
            end = time.thread_time() + self.seconds
            while time.thread_time() < end:
                pass
        else:
            time.sleep(self.seconds)
        yield GaugeMetricFamily("pathprobe_test_value", "A test value.", value=1)


@pytest.mark.parametrize(("seconds", "busy", "apart"), [(0.4, False, 5.0), (0.4, True, 8.0)])
def test_renders_are_spaced_by_their_cpu_time_not_by_a_busy_hosts_wait(
    seconds: float, busy: bool, apart: float
) -> None:
    """Renders are at least 20 times their CPU time apart (at most 5% of a core): a render that
    spent 0.4 s of CPU is followed 8 s later, not after the 5 s refresh; one that took 0.4 s only
    because it waited (a busy host's render thread waits for a CPU) holds the next off no longer
    than the refresh (it held the next off 8 s, and a rollout's check found a snapshot 20 s old)."""
    registry = CollectorRegistry()
    registry.register(Costs(seconds, busy))  # type: ignore[arg-type]
    snap = snapshot(registry, refresh=5.0)
    snap.render()
    assert snap._render_seconds >= seconds
    assert snap.next_render(snap._tried) == pytest.approx(snap._tried + apart, abs=0.4)


@pytest.mark.alone
def test_a_steady_scraper_gets_a_render_per_scrape_read_fresh() -> None:
    """Scrapes every 0.3 s against a refresh of 0.05 s: once the interval is known (the second
    scrape), one render per scrape (not six), each made after the scrape before it. A scrape that
    comes later than its interval foretold by more than a refresh (this test's sleep overslept on a
    busy machine) gets one render more: the one timed for it, and one a refresh after it was due.
    Renders alternate between 2.4 ms and none, as on a loaded machine: the lead a render is timed
    with then differs from the one its own time gives, and a render must still count as the one
    timed for its scrape (not be followed by another a refresh later)."""
    renders = []

    class Counts:
        def collect(self) -> Iterator[Metric]:
            renders.append(time.monotonic())
            time.sleep(0.0024 if len(renders) % 2 else 0.0)
            yield GaugeMetricFamily("pathprobe_test_rendered", "test", value=len(renders))

    r = CollectorRegistry()
    r.register(Counts())  # type: ignore[arg-type]
    snap = snapshot(r, refresh=0.05)
    scrapes, ages = [], []
    for _ in range(12):
        scrapes.append(time.monotonic())
        ages.append(trailer_value(snap.get(source="10.0.0.1"), "pathprobe_scrape_snapshot_age_seconds"))
        time.sleep(0.3)
    late = sum(
        1
        for before, last, this in zip(scrapes[1:], scrapes[2:], scrapes[3:], strict=False)
        if this - last > (last - before) + 0.05
    )
    assert len([t for t in renders if scrapes[2] < t <= scrapes[-1]]) <= 9 + 1 + late
    assert max(ages[3:]) < 0.3  # each read a render made after the scrape before


def test_a_client_polling_after_a_pause_reads_a_new_snapshot_before_the_slow_scrapers_render() -> None:
    """A client that polls in bursts (a test waiting for a value): the first poll after a pause looks
    like a slow scraper's, and the render thread times the next render for that one's next scrape.
    The polls after it are fast; the thread times its render again at each one, so the burst reads
    a new snapshot within a few of its polls, not at the slow scraper's next scrape (the render the
    thread had timed, read off the snapshot in this run: no wall-clock ceiling)."""
    r, g = registry_with(1)
    snap = snapshot(r, refresh=0.2)
    snap.get(source="10.0.0.2")  # the render thread starts
    now = time.monotonic()
    with snap._lock:
        snap._scrapers.scraped("10.0.0.1", now - 5.0)
        snap._scrapers.scraped("10.0.0.1", now)  # the poll after a 5 s pause: its next expected in 5 s
    slow_render = snap.next_render(now)  # what the thread times its render for: just ahead of that scrape
    assert slow_render > now + 4
    time.sleep(0.5)  # the thread has timed its render for then (it looks again at least every refresh)
    g.set(2)
    while b"pathprobe_test_value 2.0" not in snap.get(source="10.0.0.1") and time.monotonic() < slow_render + 1:
        time.sleep(0.05)
    # Read before the render timed for the slow scraper's next scrape: the burst's polls timed it again.
    assert time.monotonic() < slow_render


def test_the_refresh_setting_reaches_the_served_snapshot() -> None:
    """web.refresh_seconds sets how often a client polling /metrics faster than it sees a new
    render: at 0.2 s a new value shows within a few refreshes, well before the default 5 s."""
    r, g = registry_with(1)
    with running(WebSettings(listen="127.0.0.1:0", refresh_seconds=0.2), r) as (server, port):
        assert server.snapshot.refresh == 0.2
        assert b"pathprobe_test_value 1.0" in scrape(port, tls=False)[1]
        g.set(2)
        began = time.monotonic()
        while b"pathprobe_test_value 2.0" not in scrape(port, tls=False)[1] and time.monotonic() - began < 6:
            time.sleep(0.05)
        # 5 s or more with the default refresh; below that with room for a server waiting for a CPU.
        assert time.monotonic() - began < 4.5


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
    snap = snapshot(r, refresh=0.05)
    assert b"pathprobe_test_value 1.0" in snap.get()
    g.set(2)
    broke = time.monotonic()
    breaks.broken = True
    # Several background renders fail (timed by what happened: at nice 19 beside three labs the render
    # thread can wait longer than a fixed sleep for a CPU).
    while trailer_value(snap.get(), "pathprobe_scrape_render_errors_total") < 2:
        assert time.monotonic() - broke < 30, "the failing render was not retried"
        time.sleep(0.05)
    elapsed = time.monotonic() - broke
    body = snap.get()
    assert b"pathprobe_test_value 1.0" in body  # the last good snapshot, ageing
    assert trailer_value(body, "pathprobe_scrape_snapshot_age_seconds") >= elapsed  # rendered before it broke
    # Retried every `refresh`, not at once again: a failing render is no busy loop.
    assert trailer_value(body, "pathprobe_scrape_render_errors_total") <= (time.monotonic() - broke) / 0.05 + 2
    assert "rendering /metrics failed" in caplog.text and "KeyError" in caplog.text
    fixed = time.monotonic()
    breaks.broken = False
    while b"pathprobe_test_value 2.0" not in snap.get() and time.monotonic() < fixed + 30:
        time.sleep(0.05)
    body = snap.get()
    assert b"pathprobe_test_value 2.0" in body  # the render thread lived on and retried
    assert trailer_value(body, "pathprobe_scrape_snapshot_age_seconds") <= time.monotonic() - fixed  # since the fix


def test_a_first_render_that_raises_still_answers_200() -> None:
    r, _ = registry_with(1)
    breaks = Breaks()
    breaks.broken = True
    r.register(breaks)  # type: ignore[arg-type]
    status, body = call(make_app(snapshot(r)))
    assert status == "200 OK"
    assert trailer_value(body, "pathprobe_scrape_render_errors_total") == 1


def test_gzip_snapshot_is_complete() -> None:
    r, _ = registry_with(5)
    body = gzip.decompress(snapshot(r).get(gzipped=True))  # two gzip members: snapshot, trailer
    assert b"pathprobe_test_value 5.0" in body and b"pathprobe_scrape_snapshot_age_seconds" in body


def users_file(tmp_path: Path, **users: str) -> WebConfigSource:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {u: bcrypt_hash(p) for u, p in users.items()}}))
    return WebConfigSource(path)


def test_basic_auth(tmp_path: Path) -> None:
    r, _ = registry_with(1)
    app = make_app(snapshot(r), users_file(tmp_path, prom="s3cret"))
    assert call(app)[0].startswith("401")
    assert call(app, auth="prom:wrong")[0].startswith("401")
    status, body = call(app, auth="prom:s3cret")
    assert status.startswith("200") and b"pathprobe_test_value" in body


def test_paths() -> None:
    r, _ = registry_with(1)
    app = make_app(snapshot(r))
    assert call(app, "/")[0].startswith("200")
    assert call(app, "/nope")[0].startswith("404")


# --- the server on real sockets (127.0.0.1): TLS, basic auth, idle and slow clients ---


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("tls")
    return self_signed(d)


@pytest.fixture
def secured(tls_files: tuple[Path, Path], tmp_path: Path) -> WebSettings:
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(tls_files[0]), "key_file": str(tls_files[1])},
                "basic_auth_users": {"prom": bcrypt_hash("s3cret")},
            }
        )
    )
    return WebSettings(listen="127.0.0.1:0", config_file=web)


@contextlib.contextmanager
def running(settings: WebSettings, registry: CollectorRegistry | None = None, **kw: Any) -> Iterator[tuple[Any, int]]:
    server = serve(settings, registry or registry_with(1)[0], **kw)
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
    # Regression: the listening socket was wrapped in TLS, so accept() ran the
    # handshake of the idle connection on the serving thread, without a timeout: every
    # scrape after it hung.
    # The idle connection's handshake may take a minute: a scrape held behind it would wait that long.
    limits = ConnectionLimits(handshake_seconds=60)
    with running(secured, limits=limits) as (_, port), socket.create_connection(("127.0.0.1", port)):
        start = time.monotonic()
        status, body = scrape(port, timeout=30.0)
        assert status == 200 and b"pathprobe_test_value 1.0" in body
        assert time.monotonic() - start < 30.0


def test_32_concurrent_tls_scrapes_all_succeed(secured: WebSettings) -> None:
    with running(secured) as (_, port), socket.create_connection(("127.0.0.1", port)):
        barrier = threading.Barrier(32)

        def one(_: int) -> int:
            barrier.wait(timeout=10)
            return scrape(port, timeout=30.0)[0]

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            assert list(pool.map(one, range(32))) == [200] * 32


def test_idle_connections_are_closed_after_the_timeout_plain_and_tls(secured: WebSettings) -> None:
    plain = WebSettings(listen="127.0.0.1:0")
    # Deferred by the kernel for 1 s (its first SYN-ACK retransmission), then the deadline.
    quick = ConnectionLimits(handshake_seconds=0.5, request_seconds=0.5, defer_accept_seconds=1)
    for settings in (plain, secured):
        with running(settings, limits=quick) as (server, port):
            with socket.create_connection(("127.0.0.1", port)) as idle:
                assert closed_by_server(idle, within=30.0)
            assert scrape(port, tls=settings.config_file is not None)[0] == 200
            reason = "tls_handshake" if settings.config_file else "timeout"
            assert refusals(server, reason) >= 1


def test_a_trickling_client_is_cut_at_the_request_deadline() -> None:
    # The deadline covers the whole request, not each read: a byte every 0.2 s gains nothing (sent whole,
    # the trickle takes over 20 s: 15 s tells the two apart on a machine where the server waits for a CPU).
    with running(WebSettings(listen="127.0.0.1:0"), limits=ConnectionLimits(request_seconds=1.0)) as (server, port):
        with socket.create_connection(("127.0.0.1", port)) as slow:
            start = time.monotonic()
            closed = False
            for ch in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                try:
                    slow.send(bytes([ch]))
                except OSError:
                    closed = True
                    break
                if closed_by_server(slow, within=0.2):
                    closed = True
                    break
            assert closed and time.monotonic() - start < 15.0
        assert refusals(server, "timeout") == 1
        assert scrape(port, tls=False, auth=None)[0] == 200


def test_a_connection_past_its_deadline_is_cut() -> None:
    limits = ConnectionLimits(request_seconds=60.0, deadline_seconds=0.5)
    with running(WebSettings(listen="127.0.0.1:0"), limits=limits) as (server, port):
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"GET /metrics HTTP/1.1\r\n")
            assert closed_by_server(slow, within=30.0)
        assert refusals(server, "deadline") == 1


def slow_from(source: str, port: int) -> socket.socket:
    """A client that begins its request and sends no more. (One that sends nothing never reaches
    the server before the kernel's deferral ends: test_silent_connections_stay_with_the_kernel.)"""
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\r\n")
    return s


def reading(server: MetricsServer) -> int:
    """The server's connections whose task reads a request. Its task set also holds, for a moment,
    the task that hands an accepted socket to its stream (done before the set forgets it), and the
    server's thread changes the set while this one reads it."""
    while True:
        try:
            tasks = list(server._tasks)
        except RuntimeError:  # changed during the copy
            continue
        return sum(not t.done() and t.get_coro().__qualname__ == "MetricsServer._connection" for t in tasks)


def test_a_server_stopping_with_connections_mid_request_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """Connections still reading their request when the server stops end quietly: on Python 3.11 a
    connection task that ends cancelled is logged as an unhandled error by asyncio's streams."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    with running(WebSettings(listen="127.0.0.1:0")) as (server, port):
        clients = [slow_from("127.0.0.1", port) for _ in range(3)]
        deadline = time.monotonic() + 5
        while reading(server) < len(clients) and time.monotonic() < deadline:  # each one's task reads
            time.sleep(0.01)
        assert reading(server) == len(clients)
    for c in clients:
        c.close()
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


def test_silent_connections_stay_with_the_kernel_and_cost_the_server_nothing() -> None:
    with running(WebSettings(listen="127.0.0.1:0")) as (server, port):
        descriptors = len(os.listdir("/proc/self/fd"))
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
        try:
            assert scrape(port, tls=False, auth=None, timeout=30.0)[0] == 200
            # The test's own 200 sockets, none of the server's (they were never handed to it: the
            # scrape, accepted after them, would have been accepted after them), and perhaps the
            # server's end of the scrape, still closing.
            assert len(os.listdir("/proc/self/fd")) - descriptors in (200, 201)
        finally:
            for s in silent:
                s.close()
        # Closed unsent, they reach the server as a burst of closed connections: it still answers,
        # and holds none of them to a deadline or a cap.
        assert scrape(port, tls=False, auth=None, timeout=30.0)[0] == 200
        assert sum(server.stats.refused.values()) == 0


OUT_OF_DESCRIPTORS = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from prometheus_client import CollectorRegistry
from pathprobe.config import WebSettings
from pathprobe.web import ConnectionLimits, serve
server = serve(WebSettings(listen="127.0.0.1:0"), CollectorRegistry(), limits=ConnectionLimits(connections=1000))
print(server.server_address[1], flush=True)
sys.stdin.read()
"""


def test_out_of_descriptors_the_server_pauses_accepting_and_recovers() -> None:
    # Run apart, under a limit of 64 descriptors, with caps above it: accept() fails with EMFILE
    # while the listener stays readable. The server must wait, not spin, and serve again once
    # descriptors are free.
    proc = subprocess.Popen(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        slow = [slow_from(f"127.0.0.{2 + i % 3}", port) for i in range(100)]
        try:
            time.sleep(0.5)  # the server takes what it can and meets EMFILE
            cpu = _cpu_seconds(proc.pid)
            time.sleep(2.0)
            assert _cpu_seconds(proc.pid) - cpu < 0.5  # two seconds out of descriptors, not spent spinning
        finally:
            for s in slow:
                s.close()
        assert scrape_within(port, 10.0) == 200
    finally:
        proc.kill()
        proc.wait(10)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape_within(port: int, seconds: float) -> int:
    """The first status a plain scrape gets within `seconds` (connection errors retried)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return scrape(port, tls=False, auth=None, timeout=1.0)[0]
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.alone  # scrapes answered within a second: beside labs at the lowest priority one took 1.1 s
def test_slow_connections_take_no_worker_and_scrapes_answer_at_once() -> None:
    before = threading.active_count()
    with running(WebSettings(listen="127.0.0.1:0")) as (server, port):
        slow = [slow_from(f"127.0.0.{2 + i % 3}", port) for i in range(300)]  # under the cap of each address
        try:
            for _ in range(5):
                start = time.monotonic()
                assert scrape(port, tls=False, auth=None, timeout=1.0)[0] == 200
                assert time.monotonic() - start < 1.0
            # the server's loop, the renderer and its workers (4): none per connection
            assert threading.active_count() - before <= 6
            assert sum(server.stats.refused.values()) == 0  # all 300 held
        finally:
            for s in slow:
                s.close()


def test_a_source_at_its_cap_displaces_its_oldest_idle_connection_not_the_scrape() -> None:
    with running(WebSettings(listen="127.0.0.1:0"), limits=ConnectionLimits(per_source=4)) as (server, port):
        slow = [slow_from("127.0.0.1", port) for _ in range(10)]  # the scraper's own address
        try:
            assert all(closed_by_server(s, within=30.0) for s in slow[:6])  # the 6 oldest, displaced
            assert not closed_by_server(slow[-1], within=0.1)
            assert scrape(port, tls=False, auth=None, timeout=30.0)[0] == 200
            assert refusals(server, "source_limit", at_least=7) == 7  # and one more for the scrape
        finally:
            for s in slow:
                s.close()


def test_at_the_overall_cap_the_busiest_source_gives_way() -> None:
    with running(WebSettings(listen="127.0.0.1:0"), limits=ConnectionLimits(connections=8)) as (server, port):
        slow = [slow_from("127.0.0.2", port) for _ in range(6)] + [slow_from("127.0.0.3", port)]
        slow += [slow_from("127.0.0.4", port) for _ in range(3)]
        try:
            assert closed_by_server(slow[0], within=30.0) and closed_by_server(slow[1], within=30.0)
            assert not closed_by_server(slow[6], within=0.1)  # 127.0.0.3's one connection stays
            assert scrape(port, tls=False, auth=None, timeout=30.0)[0] == 200
            assert refusals(server, "busy", at_least=3) == 3
        finally:
            for s in slow:
                s.close()


def raw_exchange(port: int, request: bytes) -> bytes:
    """The server's answers to `request` (one or several), until it closes after the client's end."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)  # an HTTP/1.1 connection is kept open for the next request
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_head_bad_requests_and_bodies() -> None:
    with running(WebSettings(listen="127.0.0.1:0", enable_lifecycle=True), reload=lambda: None) as (server, port):
        head = raw_exchange(port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
        assert b"Content-Length: " in head and b"Connection: close" not in head  # kept open
        assert raw_exchange(port, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert raw_exchange(port, b"GET / HTTP/1.1\r\nno colon\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert refusals(server, "bad_request", at_least=2) == 2
        posted = raw_exchange(port, b"POST /-/reload HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
        assert posted.startswith(b"HTTP/1.1 200 OK") and posted.endswith(b"config reloaded\n")
        assert raw_exchange(port, b"GET /%6detrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 OK")


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
