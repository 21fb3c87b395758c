"""/metrics' exposition as client_python negotiates it (OpenMetrics when asked, gzip as
`gzip_accepted` decides), every format served from the one snapshot, and HTTP keep-alive:
several scrapes on one connection (one TLS handshake), an idle timeout, the caps kept."""

import contextlib
import gzip
import http.client
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from certs import self_signed
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from test_collector import config

from pathprobe.config import WebSettings
from pathprobe.exporter import Exporter
from pathprobe.metrics import registry
from pathprobe.web import ConnectionLimits, MetricsServer, Snapshot, Stats, serve

# What Prometheus 3 sends (scrape_protocols' default), and Prometheus 2.
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
    "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)
PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


@pytest.fixture
def snapshots() -> Iterator[list[Snapshot]]:
    made: list[Snapshot] = []
    yield made
    for s in made:
        s.close()


def populated(tmp_path: Path) -> CollectorRegistry:
    e = Exporter(config(tmp_path), clock=lambda: 1234.5)
    rtt = e.recorder("rtt", "b")
    for seconds in (0.0071, 0.0072, 0.009):
        rtt.rtt(seconds)
    rtt.failure("refused")
    echo = e.recorder("loss", "c")
    echo.sent(64)
    echo.received(0.0004)
    return registry(e.rooms)


@pytest.mark.parametrize("accept", [PROMETHEUS_3, PROMETHEUS_2, "application/openmetrics-text"])
def test_an_openmetrics_scraper_gets_openmetrics_of_the_same_snapshot(
    tmp_path: Path, snapshots: list[Snapshot], accept: str
) -> None:
    snapshot = Snapshot(populated(tmp_path), stats=Stats())
    snapshots.append(snapshot)
    text, text_type = snapshot.serve("")
    body, content_type = snapshot.serve(accept)
    assert text_type.startswith("text/plain; version=0.0.4")
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n") and body.count(b"# EOF") == 1  # after the trailer
    # The strict parser of OpenMetrics reads all of it, trailer included; the same samples as the text.
    om = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in openmetrics_families(body.decode())
        for s in f.samples
    }
    plain = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
    }

    def probes(samples: dict[tuple[str, Any], float]) -> dict[tuple[str, Any], float]:
        """What the rooms hold (not the process's CPU, nor the snapshot's own figures)."""
        return {k: v for k, v in samples.items() if k[0].startswith("pathprobe_") and "scrape" not in k[0]}

    assert probes(om) == probes(plain) and len(probes(om)) > 100
    assert om[("pathprobe_web_refused_total", (("reason", "busy"),))] == 0
    zipped, _ = snapshot.serve(accept, gzipped=True)
    assert gzip.decompress(zipped).endswith(b"# EOF\n")


class Counting:
    """A collector that counts its collections."""

    def __init__(self) -> None:
        self.collections = 0

    def collect(self) -> Iterator[Any]:
        self.collections += 1
        g = Gauge("pathprobe_test_value", "A value.", registry=None)
        g.set(1)
        yield from g.collect()


def test_every_format_is_served_from_the_snapshot_one_collection_per_render(snapshots: list[Snapshot]) -> None:
    r = CollectorRegistry()
    counting = Counting()
    r.register(counting)  # type: ignore[arg-type]
    snapshot = Snapshot(r, refresh=3600)
    snapshots.append(snapshot)
    snapshot.serve("")  # the very first scrape renders
    assert counting.collections == 1
    snapshot.serve(PROMETHEUS_3)  # the first in OpenMetrics renders both formats, from one collection
    assert counting.collections == 2
    for _ in range(5):
        assert b"pathprobe_test_value 1.0" in snapshot.serve(PROMETHEUS_3)[0]
        assert b"pathprobe_test_value 1.0" in gzip.decompress(snapshot.serve("", gzipped=True)[0])
    assert counting.collections == 2
    snapshot.render()
    assert counting.collections == 3


@pytest.mark.parametrize(
    ("accept_encoding", "zipped"),
    [("gzip", True), ("br, GZIP;q=0.5", True), ("x-gzip", False), ("nogzip", False), ("identity", False), ("", False)],
)
def test_gzip_is_chosen_as_client_python_chooses_it(
    snapshots: list[Snapshot], accept_encoding: str, zipped: bool
) -> None:
    from pathprobe.web.app import make_app

    snapshot = Snapshot(CollectorRegistry())
    snapshots.append(snapshot)
    started: list[Any] = []
    environ = {"PATH_INFO": "/metrics", "HTTP_ACCEPT_ENCODING": accept_encoding}
    body = b"".join(make_app(snapshot)(environ, lambda status, headers: started.extend(headers)))
    assert (("Content-Encoding", "gzip") in started) == zipped
    assert body.startswith(b"\x1f\x8b") == zipped


# --- keep-alive on real sockets --------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_settings(tmp_path_factory: pytest.TempPathFactory) -> WebSettings:
    d = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(d)
    (d / "web.yml").write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(cert), "key_file": str(key)}}))
    return WebSettings(listen="127.0.0.1:0", config_file=d / "web.yml")


@contextlib.contextmanager
def running(settings: WebSettings, **kw: Any) -> Iterator[tuple[MetricsServer, int]]:
    r = CollectorRegistry()
    Gauge("pathprobe_test_value", "A value.", registry=r).set(1)
    server = serve(settings, r, **kw)
    try:
        yield server, server.server_address[1]
    finally:
        server.shutdown()


def client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def test_a_tls_scraper_makes_three_scrapes_on_one_connection_with_one_handshake(tls_settings: WebSettings) -> None:
    with running(tls_settings) as (server, port):
        context = server.web_config.current().ssl_context
        assert context is not None
        before = context.session_stats()["accept"]
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=client_context())
        try:
            socks = []
            for _ in range(3):
                conn.request("GET", "/metrics", headers={"Accept": PROMETHEUS_3, "Accept-Encoding": "gzip"})
                resp = conn.getresponse()
                body = gzip.decompress(resp.read())
                assert resp.status == 200 and not resp.will_close and b"pathprobe_test_value 1.0" in body
                assert resp.getheader("Content-Type", "").startswith("application/openmetrics-text")
                socks.append(conn.sock)
            assert socks[0] is socks[1] is socks[2]
        finally:
            conn.close()
        assert context.session_stats()["accept"] - before == 1


def exchange(sock: socket.socket, request: bytes) -> bytes:
    """One answer (its head and Content-Length body) read from a connection kept open."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_kept_connection_is_closed_quietly_after_its_idle_timeout() -> None:
    # Every other limit a minute or more away: only the idle timeout can close it within 30 s (a bound
    # that a server waiting for a CPU at nice 19 beside three labs still meets).
    limits = ConnectionLimits(idle_seconds=0.5, request_seconds=60)
    with running(WebSettings(listen="127.0.0.1:0"), limits=limits) as (server, port):
        with socket.create_connection(("127.0.0.1", port)) as s:
            assert exchange(s, GET).startswith(b"HTTP/1.1 200 OK")
            assert exchange(s, GET).startswith(b"HTTP/1.1 200 OK")  # kept open
            start = time.monotonic()
            assert closed_within(s, 30.0)
            assert 0.4 < time.monotonic() - start < 30.0
        assert sum(server.stats.refused.values()) == 0  # an idle kept connection is no refusal


def test_connection_close_and_http_1_0_end_the_connection_after_the_answer() -> None:
    with running(WebSettings(listen="127.0.0.1:0")) as (_, port):
        for request in (b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", b"GET /metrics HTTP/1.0\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", port)) as s:
                answer = exchange(s, request)
                assert answer.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in answer
                assert closed_within(s, 2.0)


def test_pipelined_requests_are_answered_in_order() -> None:
    with running(WebSettings(listen="127.0.0.1:0")) as (_, port), socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /-/healthy HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n")
        s.settimeout(3)
        data = b""
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"Not found\n"):
            data += s.recv(65536)
        assert data.index(b"200 OK") < data.index(b"404 Not Found")


def test_idle_kept_connections_give_way_at_the_cap() -> None:
    limits = ConnectionLimits(per_source=2)
    with running(WebSettings(listen="127.0.0.1:0"), limits=limits) as (server, port):
        kept = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            for s in kept:
                assert exchange(s, GET).startswith(b"HTTP/1.1 200 OK")
            with socket.create_connection(("127.0.0.1", port)) as third:
                assert exchange(third, GET).startswith(b"HTTP/1.1 200 OK")
            assert closed_within(kept[0], 2.0)  # the oldest idle one gave way
            assert server.stats.refused["source_limit"] == 1
        finally:
            for s in kept:
                s.close()


def test_a_tls_client_on_the_plain_port_gets_a_400_at_once() -> None:
    # At once: not after the request's time is up (a minute here, so that a server waiting for a CPU
    # at nice 19 beside three labs is never mistaken for one waiting for the rest of a request).
    limits, context = ConnectionLimits(request_seconds=60), client_context()
    with (
        running(WebSettings(listen="127.0.0.1:0"), limits=limits) as (_, port),
        socket.create_connection(("127.0.0.1", port)) as raw,
    ):
        start = time.monotonic()
        with pytest.raises(ssl.SSLError, match=r"WRONG_VERSION_NUMBER|wrong version number"):
            context.wrap_socket(raw)
        assert time.monotonic() - start < 30.0
    # Go's client names it from the answer's first bytes: "server gave HTTP response to HTTPS client".
    with running(WebSettings(listen="127.0.0.1:0")) as (_, port), socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(b"\x16\x03\x01\x00\x05hello")
        raw.settimeout(2)
        assert raw.recv(65536).startswith(b"HTTP/1.1 400 Bad Request")


def test_plain_http_on_the_tls_port_gets_gos_answer(tls_settings: WebSettings) -> None:
    with running(tls_settings) as (server, port), socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(GET)
        s.settimeout(3)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        assert data == b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
        assert server.stats.refused["tls_handshake"] == 1
