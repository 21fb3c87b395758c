"""The web config file (exporter-toolkit's format): validation with file:line, the files it
names, reading it again when it changes, the password cache; the endpoints any exporter has
(/-/healthy, /-/ready, the landing page), the build info, and the log flags."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import shutil
import ssl
import sys
import types
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from certs import bcrypt_hash, mutual_tls
from prometheus_client import CollectorRegistry

from pathprobe import build, launch, logs, webconfig, yamlfile
from pathprobe.commands import main
from pathprobe.web import Snapshot, make_app
from pathprobe.webconfig import Passwords, WebConfigSource
from pathprobe.yamlfile import ConfigError


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    return mutual_tls(tmp_path_factory.mktemp("mtls"))


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as err:
        webconfig.load(path)
    return err.value.problems


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_bad_hash_an_unknown_key_and_an_unsupported_one_name_their_line(tmp_path: Path) -> None:
    web = write(
        tmp_path / "web.yml", "basic_auth_users:\n  prom: hunter2\nhttp_server_config:\n  headers: {Server: x}\n"
    )
    found = problems(web)
    assert any(p.startswith(f"{web}:2: ") and "not a bcrypt hash" in p for p in found), found
    assert any(p.startswith(f"{web}:4: ") and 'HTTP header "Server" can not be configured' in p for p in found), found
    web = write(tmp_path / "web.yml", f"basic_auth_users:\n  ok: '{bcrypt_hash('x')}'\n  prom: hunter2\n")
    found = problems(web)
    assert len(found) == 1 and found[0].startswith(f"{web}:3: basic_auth_users.prom: not a bcrypt hash"), found
    web = write(tmp_path / "web.yml", "tls_server_config:\n  cert_file: a\n  key_file: b\n  ciphers: []\n")
    assert problems(web) == [f"{web}:4: tls_server_config.ciphers: Extra inputs are not permitted"]


@pytest.mark.parametrize(
    ("tls", "says"),
    [
        ({"client_auth_type": "RequireAnyClientCert"}, "RequireAnyClientCert (any certificate, none verified) is not"),
        ({"client_auth_type": "RequireClientCert"}, "RequireClientCert (any certificate, none verified) is not"),
        ({"min_version": "TLS13", "max_version": "TLS12"}, "min_version TLS13 is above max_version TLS12"),
        ({"min_version": "TLS111"}, "unknown TLS version: TLS111"),
        ({"client_auth_type": "Sometimes"}, "invalid ClientAuth: Sometimes"),
        ({"cipher_suites": ["TLS_RSA_WITH_RC4_128_SHA"]}, "unknown cipher: TLS_RSA_WITH_RC4_128_SHA"),
        ({"curve_preferences": ["CurveP257"]}, "unknown curve: CurveP257"),
        ({"curve_preferences": ["X25519", "CurveP256"]}, "curve_preferences lists several curves"),
        ({"cert_file": ""}, "missing one of cert or cert_file"),
        ({"key_file": ""}, "missing one of key or key_file"),
    ],
)
def test_incoherent_tls_settings_are_refused_by_name(tmp_path: Path, tls: dict[str, Any], says: str) -> None:
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": "c.pem", "key_file": "k.pem", **tls}}))
    found = problems(web)
    assert len(found) == 1 and found[0].startswith(f"{web}:") and says in found[0], found


def test_files_are_relative_to_the_web_config_and_checked(tmp_path: Path, certs: dict[str, Path]) -> None:
    for name in ("server", "server_key", "ca"):
        shutil.copy(certs[name], tmp_path / certs[name].name)
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server-key.pem\n"
        "  client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n"
        "  min_version: TLS13\n"
    )
    access = webconfig.load(web)
    assert access.ssl_context is not None and access.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert access.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert set(access.files) == {web, tmp_path / "server.pem", tmp_path / "server-key.pem", tmp_path / "ca.pem"}
    (tmp_path / "ca.pem").unlink()
    assert problems(web) == [
        f"{web}:4: tls_server_config.client_ca_file: failed to read client_ca_file ({tmp_path / 'ca.pem'}): "
        "no such file or directory"
    ]
    shutil.copy(certs["ca"], tmp_path / "ca.pem")
    shutil.copy(certs["client_key"], tmp_path / "server-key.pem")  # a key of another certificate
    found = problems(web)
    assert len(found) == 1 and found[0].startswith(f"{web}:2: tls_server_config.cert_file: "), found


def test_request_client_cert_asks_nothing_it_would_not_use(tmp_path: Path, certs: dict[str, Path]) -> None:
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {
                    "cert_file": str(certs["server"]),
                    "key_file": str(certs["server_key"]),
                    "client_auth_type": "RequestClientCert",
                }
            }
        )
    )
    context = webconfig.load(web).ssl_context
    assert context is not None and context.verify_mode == ssl.CERT_NONE


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def users(source: WebConfigSource) -> set[str]:
    return set(source.current().users)


def test_a_changed_file_is_read_at_most_every_few_seconds_and_a_bad_one_keeps_the_last(tmp_path: Path) -> None:
    web = write(tmp_path / "web.yml", f"basic_auth_users: {{a: '{bcrypt_hash('x')}'}}\n")
    clock = Clock()
    source = WebConfigSource(web, clock)
    write(web, f"basic_auth_users: {{b: '{bcrypt_hash('y')}'}}\n")
    os.utime(web, ns=(1, 1))  # a different modification time, whatever the clock's resolution
    assert users(source) == {"a"}  # not looked at yet
    clock.now += webconfig.RECHECK_SECONDS
    assert users(source) == {"b"} and source.reloads == {"success": 1}
    write(web, "basic_auth_users: {c: plaintext}\n")
    clock.now += webconfig.RECHECK_SECONDS
    assert users(source) == {"b"} and source.reloads["failure"] == 1 and not source.last_reload_ok
    clock.now += webconfig.RECHECK_SECONDS
    assert users(source) == {"b"} and source.reloads["failure"] == 1  # the same broken file: not read again
    lines = "\n".join(source.exposition())
    assert 'pathprobe_web_config_reloads_total{result="failure"} 1' in lines
    assert "pathprobe_web_config_last_reload_successful 0" in lines
    write(web, f"basic_auth_users: {{d: '{bcrypt_hash('z')}'}}\n")
    assert source.reload() is None and users(source) == {"d"} and source.last_reload_ok  # SIGHUP: at once


def test_tls_cannot_be_dropped_or_added_by_a_change(tmp_path: Path, certs: dict[str, Path]) -> None:
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump({"tls_server_config": {"cert_file": str(certs["server"]), "key_file": str(certs["server_key"])}})
    )
    source = WebConfigSource(web)
    web.write_text("basic_auth_users: {}\n")
    problem = source.reload()
    assert problem is not None and "tls_server_config needs a restart" in problem
    assert source.current().ssl_context is not None


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_known_password_costs_no_bcrypt(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counted(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    table = {"prom": bcrypt_hash("s3cret").encode()}
    passwords = Passwords()
    assert passwords.check(table, basic("prom", "s3cret"))
    assert all(passwords.check(table, basic("prom", "s3cret")) for _ in range(100))
    assert len(calls) == 1
    assert not passwords.check(table, basic("prom", "wrong")) and not passwords.check(table, basic("prom", "wrong"))
    assert len(calls) == 2  # a wrong password is remembered too
    assert not passwords.check(table, basic("nobody", "s3cret")) and len(calls) == 3  # costs a bcrypt all the same
    assert passwords.check({"prom": bcrypt_hash("new").encode()}, basic("prom", "new")) and len(calls) == 4
    for i in range(Passwords.CACHE_SIZE + 10):
        passwords.check(table, basic("prom", f"guess{i}"))
    assert len(passwords._cache) == Passwords.CACHE_SIZE
    for header in ("Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode(), basic("prom", "x" * 80)):
        assert not passwords.check(table, header)


def call(app: Any, path: str, auth: str | None = None) -> tuple[str, bytes]:
    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
    if auth:
        environ["HTTP_AUTHORIZATION"] = auth
    status: list[str] = []
    body = b"".join(app(environ, lambda s, h: status.append(s)))
    return status[0], body


def test_healthy_ready_and_the_landing_page(tmp_path: Path) -> None:
    web = write(tmp_path / "web.yml", f"basic_auth_users: {{prom: '{bcrypt_hash('s3cret')}'}}\n")
    why: list[str | None] = ["the responders are not listening yet"]
    snapshot = Snapshot(CollectorRegistry())
    app = make_app(snapshot, WebConfigSource(web), ready=lambda: why[0])
    try:
        assert call(app, "/-/healthy") == ("200 OK", b"pathprobe is healthy.\n")  # no password: a health check
        assert call(app, "/-/ready") == (
            "503 Service Unavailable",
            b"pathprobe is not ready: the responders are not listening yet\n",
        )
        why[0] = None
        assert call(app, "/-/ready") == ("200 OK", b"pathprobe is ready.\n")
        assert call(app, "/")[0].startswith("401")  # the rest asks for the password
        status, page = call(app, "/", basic("prom", "s3cret"))
        assert status == "200 OK" and f"Version {build.VERSION}".encode() in page
        assert all(f'href="{p}"'.encode() in page for p in ("/metrics", "/-/healthy", "/-/ready"))
    finally:
        snapshot.close()


def test_the_version_and_revision_are_what_the_build_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pathprobe._version", None)  # no version file: its import fails
    assert build.stamp() == ("0+unknown", "unknown")
    baked = types.ModuleType("pathprobe._version")
    baked.VERSION, baked.NODE, baked.DIRTY = "1.2.3", "g0123abcd", False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pathprobe._version", baked)
    assert build.stamp() == ("1.2.3", "0123abcd")  # git's node: "g" and the commit
    baked.DIRTY = True  # type: ignore[attr-defined]
    assert build.stamp() == ("1.2.3", "0123abcd-dirty")
    baked.NODE, baked.DIRTY = "fedc0123", False  # type: ignore[attr-defined]  # the image's build argument
    assert build.stamp() == ("1.2.3", "fedc0123")
    labels = build.labels()
    assert (labels["version"], labels["revision"]) == (build.VERSION, build.revision())
    assert labels["python_version"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}.")


def record(message: str, exc: bool = False) -> logging.LogRecord:
    try:
        raise ValueError("boom")
    except ValueError:
        info = sys.exc_info() if exc else None
    return logging.LogRecord("pathprobe.web", logging.WARNING, __file__, 1, message, (), info)


def test_logfmt_and_json_lines() -> None:
    line = logs.Logfmt().format(record('refused "a" = b'))
    assert line.startswith("time=") and line.endswith(' level=warn source=pathprobe.web msg="refused \\"a\\" = b"')
    assert " " not in line.split(" ")[0].removeprefix("time=") and line.split(" ")[0].endswith("Z")
    parsed = json.loads(logs.Json().format(record("cut\nshort", exc=True)))
    assert parsed["level"] == "warn" and parsed["msg"] == "cut\nshort" and "ValueError: boom" in parsed["err"]
    assert "\n" not in logs.Logfmt().format(record("cut\nshort", exc=True))


def test_log_flags_and_their_old_spelling(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    missing = str(tmp_path / "missing.yaml")
    assert main(["--log.level", "debug", "--log.format", "json", "check-config", missing]) == 2
    assert logging.getLogger().level == logging.DEBUG
    assert isinstance(logging.getLogger().handlers[0].formatter, logs.Json)
    assert main(["--log-level", "warning", "check-config", missing]) == 2
    assert logging.getLogger().level == logging.WARNING
    assert isinstance(logging.getLogger().handlers[0].formatter, logs.Logfmt)
    assert launch.verb(["--log.level", "debug", "--log.format=json", "run", "--config", "x"]) == "run"
    assert launch.verb(["--log-level", "run", "check-config", "run"]) == "check-config"


def test_check_config_checks_the_web_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    web = write(tmp_path / "web.yml", "basic_auth_users:\n  prom: plaintext\n")
    cfg = tmp_path / "pathprobe.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "host": {"name": "a", "address": "127.0.0.1", "region": "r1"},
                "peers": [{"name": "b", "address": "127.0.0.2", "region": "r2", "path_class": "inter_region"}],
                "web": {"listen": "127.0.0.1:0", "config_file": str(web)},
            }
        )
    )
    assert main(["check-config", str(cfg)]) == 2
    assert f"{web}:2: basic_auth_users.prom: not a bcrypt hash" in capsys.readouterr().err
    good = write(tmp_path / "good.yml", f"basic_auth_users:\n  prom: '{bcrypt_hash('x')}'\n")
    assert main(["check-config", str(cfg), "--web.config.file", str(good)]) == 0
    web.unlink()
    # The config still names the missing file: check-config says so, whatever the flag says.
    assert main(["check-config", str(cfg), "--web.config.file", str(good)]) == 2
    assert f"web.config_file: cannot read {web}" in capsys.readouterr().err


def test_the_example_follows_the_format() -> None:
    example = Path(__file__).parents[1] / "examples" / "web-config.yml"
    parsed = yamlfile.validate(yamlfile.load(example), webconfig.WebConfigFile)
    assert parsed.tls_server_config is not None and set(parsed.basic_auth_users) == {"prometheus"}


def test_check_web_config_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    web = write(tmp_path / "web.yml", f"basic_auth_users: {{prom: '{bcrypt_hash('x')}'}}\n")
    assert main(["check-web-config", str(web)]) == 0
    assert capsys.readouterr().out == f"{web}: ok (plain HTTP; basic auth users: prom)\n"
    write(web, "basic_auth_users: {prom: x}\nrate_limit: {burst: 1, interval: 1x}\n")
    assert main(["check-web-config", str(web)]) == 2
    err = capsys.readouterr().err
    assert f"{web}:2: rate_limit.interval: not a duration: '1x'" in err, err


def test_an_empty_web_config_file_name_is_no_file_as_the_toolkits_flag() -> None:
    from pathprobe.commands.run import web_config_file
    from pathprobe.config import WebSettings

    cfg: Any = types.SimpleNamespace(web=WebSettings(config_file=Path("web.yml")))
    assert web_config_file(types.SimpleNamespace(web_config_file=""), cfg) is None  # type: ignore[arg-type]
    assert web_config_file(types.SimpleNamespace(web_config_file="w.yml"), cfg) == Path("w.yml")  # type: ignore[arg-type]
    assert web_config_file(types.SimpleNamespace(web_config_file=None), cfg) == Path("web.yml")  # type: ignore[arg-type]
    assert WebSettings.model_validate({"config_file": ""}).config_file is None


def test_a_rate_limit_lets_a_burst_through_then_one_per_interval() -> None:
    now = [0.0]
    limiter = webconfig.RateLimiter(
        webconfig.RateLimit.model_validate({"burst": 2, "interval": "1s"}), clock=lambda: now[0]
    )
    assert [limiter.allow() for _ in range(3)] == [True, True, False]
    now[0] = 0.5
    assert not limiter.allow()
    now[0] = 1.01
    assert limiter.allow() and not limiter.allow()
    assert webconfig.RateLimit.model_validate({"interval": "1m30s"}).interval == 90.0
