"""A real `pathprobe run` on loopback with a web config file of mutual TLS and a bcrypt user,
scraped by a real Prometheus with the client certificate and the password; what a wrong
password, no client certificate and a changed users file get; the endpoints it serves."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from certs import bcrypt_hash, mutual_tls
from loopback_mesh import api, prometheus, until, unused_port

if shutil.which("prometheus") is None or shutil.which("openssl") is None:
    pytest.skip("needs prometheus and openssl", allow_module_level=True)


def web_config(path: Path, certs: dict[str, Path], password: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {
                    "cert_file": str(certs["server"]),
                    "key_file": str(certs["server_key"]),
                    "client_ca_file": str(certs["ca"]),
                    "client_auth_type": "RequireAndVerifyClientCert",
                },
                "basic_auth_users": {"prom": bcrypt_hash(password)},
            }
        )
    )


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("webtls")
    certs = mutual_tls(d)
    web = d / "web.yml"
    web_config(web, certs, "s3cret")
    port = unused_port()
    cfg = d / "pathprobe.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "host": {"name": "a", "address": "127.0.0.1", "region": "r1"},
                "peers": [{"name": "b", "address": "127.0.0.2", "region": "r2", "path_class": "inter_region"}],
                "probes": {
                    "throughput": {"enabled": False},
                    "rtt": {"interval_seconds": 1},
                    "loss": {"rate_pps": 1},
                    "mtu": {"enabled": False},
                },
                "responders": {"listen": "127.0.0.1", "rr_port": unused_port(), "echo_port": unused_port()},
                "iperf3": {"port": unused_port()},
                "web": {"listen": f"127.0.0.1:{port}"},
                "budget": {"state_file": str(d / "budget.json")},
            }
        )
    )
    log = (d / "exporter.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "--log.format",
            "json",
            "run",
            "--config",
            str(cfg),
            "--web.config.file",
            str(web),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    info = {"dir": d, "certs": certs, "web": web, "port": port, "proc": proc, "log": d / "exporter.log"}
    try:
        until("the exporter's TLS port", lambda: get(info, "/-/healthy")[0] == 200)
        yield info
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        log.close()
        assert proc.returncode == 0, (d / "exporter.log").read_text()[-3000:]


def tls_client(certs: dict[str, Path], client_cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs["ca"]))
    if client_cert:
        ctx.load_cert_chain(str(certs["client"]), str(certs["client_key"]))
    return ctx


def get(info: dict[str, Any], path: str, password: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", info["port"], timeout=5, context=tls_client(info["certs"]))
    headers = {"Authorization": "Basic " + base64.b64encode(f"prom:{password}".encode()).decode()} if password else {}
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_prometheus_scrapes_it_with_the_client_certificate_and_the_password(exporter: dict[str, Any]) -> None:
    d, certs = exporter["dir"], exporter["certs"]
    (d / "password").write_text("s3cret")
    scrape = {
        "job_name": "pathprobe",
        "scheme": "https",
        "static_configs": [{"targets": [f"127.0.0.1:{exporter['port']}"]}],
        "tls_config": {
            "ca_file": str(certs["ca"]),
            "cert_file": str(certs["client"]),
            "key_file": str(certs["client_key"]),
        },
        "basic_auth": {"username": "prom", "password_file": str(d / "password")},
    }
    with prometheus(d, [scrape]) as url:
        up = until("up == 1 in Prometheus", lambda: api(url, "query", query='up{job="pathprobe"} == 1')["result"])
        assert up[0]["metric"]["instance"] == f"127.0.0.1:{exporter['port']}"


def test_a_wrong_password_is_401_and_no_client_certificate_no_handshake(exporter: dict[str, Any]) -> None:
    assert get(exporter, "/metrics", "wrong")[0] == 401
    assert get(exporter, "/metrics")[0] == 401
    status, body = get(exporter, "/metrics", "s3cret")
    assert status == 200 and b"pathprobe_build_info{" in body
    # TLS 1.3 finishes the client's side of the handshake before the server has read that no
    # certificate came: the refusal shows at the first read, as an alert or a closed connection.
    answer = without_client_certificate(exporter)
    assert answer == b"" or isinstance(answer, (ssl.SSLError, ConnectionResetError)), answer
    _, body = get(exporter, "/metrics", "s3cret")
    assert b'pathprobe_web_refused_total{reason="tls_handshake"} ' in body
    assert b'pathprobe_web_refused_total{reason="tls_handshake"} 0' not in body


def without_client_certificate(info: dict[str, Any]) -> bytes | Exception:
    """What a request over TLS without a client certificate gets back."""
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=5) as raw:
        try:
            with tls_client(info["certs"], client_cert=False).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
                return tls.recv(1024)
        except (ssl.SSLError, ConnectionResetError) as exc:
            return exc


def test_a_changed_users_file_takes_effect_without_a_restart(exporter: dict[str, Any]) -> None:
    web, certs = exporter["web"], exporter["certs"]
    new = web.with_suffix(".new")
    web_config(new, certs, "rotated")
    new.replace(web)  # as Ansible writes it: a new file moved in place
    until("the new password accepted", lambda: get(exporter, "/metrics", "rotated")[0] == 200)
    assert get(exporter, "/metrics", "s3cret")[0] == 401
    web.write_text("basic_auth_users: {prom: not-a-hash}\n")  # broken: the last good file stays
    exporter["proc"].send_signal(signal.SIGHUP)  # at once, without waiting for the next look at the files
    until(
        "the failure counted",
        lambda: b'pathprobe_web_config_reloads_total{result="failure"} 1' in get(exporter, "/metrics", "rotated")[1],
    )
    assert get(exporter, "/metrics", "s3cret")[0] == 401
    assert b"pathprobe_web_config_last_reload_successful 0" in get(exporter, "/metrics", "rotated")[1]
    web_config(web, certs, "s3cret")
    until("the old password back", lambda: get(exporter, "/metrics", "s3cret")[0] == 200)


def test_it_serves_health_readiness_the_landing_page_and_its_build(exporter: dict[str, Any]) -> None:
    assert get(exporter, "/-/healthy") == (200, b"pathprobe is healthy.\n")
    until("ready", lambda: get(exporter, "/-/ready") == (200, b"pathprobe is ready.\n"))
    status, page = get(exporter, "/", "s3cret")
    assert status == 200 and b'href="/-/ready"' in page
    _, body = get(exporter, "/metrics", "s3cret")
    line = next(x for x in body.decode().splitlines() if x.startswith("pathprobe_build_info{"))
    assert 'revision="' in line and f'python_version="{sys.version_info.major}.' in line
    logged = [json.loads(x) for x in exporter["log"].read_text().splitlines() if x.strip()]
    assert any(r["level"] == "info" and "metrics on" in r["msg"] for r in logged), logged[:5]
