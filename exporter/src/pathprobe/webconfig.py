"""The web config file of /metrics, in the format of Prometheus's exporter-toolkit (the file every
Go exporter reads with --web.config.file: github.com/prometheus/exporter-toolkit,
docs/web-configuration.md): TLS (`tls_server_config`), basic auth users with bcrypt hashes
(`basic_auth_users`), the headers of every answer (`http_server_config.headers`) and a rate
limit (`rate_limit`); an empty file is no TLS and no users, as in the toolkit. One format for
every exporter on a host, and the Ansible roles of prometheus-community template it the same way.

`WebConfigSource` owns the file in force: loaded at start (a bad file stops the start), read
again on a config reload (SIGHUP, POST /-/reload) and when it, or a certificate, key or CA file
it names, changes on disk (looked at, by their stat, at most every `RECHECK_SECONDS`, as a new
connection or request arrives). `webtls` makes its TLS context; the HTTP side (`headers`,
`rate_limit`) is applied by web/app.py. A file that fails then is logged and counted, and the
last good one stays in force. `Passwords` checks basic auth against the users, caching each
verdict as the toolkit does, so that a scrape with a known password costs no bcrypt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import ssl
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import bcrypt
import yaml
from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from . import webtls, yamlfile
from .strict import Strict
from .yamlfile import ConfigError

log = logging.getLogger(__name__)

_BCRYPT = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")


def _bcrypt_hash(value: str) -> str:
    if not _BCRYPT.match(value):
        raise ValueError(
            "not a bcrypt hash ($2a$, $2b$ or $2y$, a cost of 04-31, 60 characters), e.g. from "
            "`htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
        )
    return value


def _one_of(names: Mapping[str, object], what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in names:
            raise ValueError(f"unknown {what}: {value}")
        return value

    return check


Cipher = Annotated[str, AfterValidator(_one_of(webtls.CIPHERS, "cipher"))]
Curve = Annotated[str, AfterValidator(_one_of(webtls.CURVES, "curve"))]
TlsVersion = Annotated[str, AfterValidator(_one_of(webtls.VERSIONS, "TLS version"))]
# Go's names, "RequireClientCert" the old one of RequireAnyClientCert.
CLIENT_AUTH = (*webtls.VERIFY_MODES, "RequireAnyClientCert", "RequireClientCert")


class TlsServerConfig(Strict):
    """exporter-toolkit's TLSConfig; TLS is on when any of the certificate, key, client CA or
    client policy fields is set (its IsEnabled)."""

    cert_file: Path | None = None
    key_file: Path | None = None
    cert: str = ""  # inline PEM, used when cert_file is not set
    key: str = ""
    client_ca_file: Path | None = None
    client_ca: str = ""
    client_auth_type: str = ""
    cipher_suites: list[Cipher] = Field(default_factory=list)
    curve_preferences: list[Curve] = Field(default_factory=list)
    min_version: TlsVersion = "TLS12"
    max_version: TlsVersion = "TLS13"
    prefer_server_cipher_suites: bool = True
    client_allowed_sans: list[str] | None = None

    @field_validator("cert_file", "key_file", "client_ca_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value  # as Go's zero value: not a file named ""

    def enabled(self) -> bool:
        given = (self.cert_file, self.cert, self.key_file, self.key, self.client_ca_file, self.client_ca)
        return any(given) or bool(self.client_auth_type)

    @model_validator(mode="after")
    def _coherent(self) -> TlsServerConfig:
        """The toolkit's checks in its order (ConfigToTLSConfig), so that a file is refused for
        what the toolkit refuses it for; what Python's ssl cannot do, by name."""
        if not self.enabled():
            return self
        if not (self.cert_file or self.cert):
            raise ValueError("missing one of cert or cert_file")
        if not (self.key_file or self.key):
            raise ValueError("missing one of key or key_file")
        if self.client_auth_type not in CLIENT_AUTH:
            raise ValueError(f"invalid ClientAuth: {self.client_auth_type}")
        if self.client_auth_type in ("RequireAnyClientCert", "RequireClientCert"):
            raise ValueError(
                f"client_auth_type {self.client_auth_type} (any certificate, none verified) is not "
                "supported: Python's ssl verifies every certificate it asks for; use "
                "RequireAndVerifyClientCert with client_ca_file"
            )
        if len(self.curve_preferences) > 1:
            raise ValueError(
                "curve_preferences lists several curves: Python's ssl (3.11) sets one; list one, or "
                "none for OpenSSL's default (X25519, P-256, X448, P-521, P-384)"
            )
        if webtls.VERSIONS[self.min_version] > webtls.VERSIONS[self.max_version]:
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        return self

    def policy_problem(self) -> str | None:
        """After the files are read, as in the toolkit: a CA without a policy is most likely a policy forgotten."""
        if (self.client_ca_file or self.client_ca) and self.client_auth_type in ("", "NoClientCert"):
            return "client CA's have been configured without a Client Auth Policy"
        return None


# The headers the toolkit lets a file set (web/handler.go), with the values each may take (none: any).
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}


def _scalar_text(value: Any) -> Any:
    """A header's value as Go's YAML reads a scalar into a string (`X-XSS-Protection: 1`)."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if isinstance(value, int | float) else value


class HttpServerConfig(Strict):
    # HTTP/2 is never spoken here (HTTP/1.1 with keep-alive); the flag is read for the toolkit's check
    # of the cipher suites that HTTP/2 requires.
    http2: bool = True
    headers: dict[str, Annotated[str, BeforeValidator(_scalar_text)]] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _allowed(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if name not in HEADERS:
                raise ValueError(f'HTTP header "{name}" can not be configured')
            if HEADERS[name] and value not in HEADERS[name]:
                raise ValueError(
                    f"invalid value for {name}. Expected one of: {list(HEADERS[name])}, but got: {value!r}"
                )
        return headers


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")


def _go_duration(value: Any) -> float:
    """Seconds of a Go duration ("1s", "1m30s", "250ms"), or 0."""
    if value in (0, "0"):
        return 0.0
    if not isinstance(value, str) or not (parts := _DURATION.findall(value)) or _DURATION.sub("", value):
        raise ValueError(f"not a duration: {value!r} (Go's format, e.g. 1s, 500ms, 1m30s)")
    return sum(float(n) * _UNITS[unit] for n, unit in parts)


Duration = Annotated[float, BeforeValidator(_go_duration)]


class RateLimit(Strict):
    """Requests let through: `burst` at once, then one per `interval` (Go's rate.Limiter); interval 0: no limit."""

    burst: int = Field(default=0, ge=0)
    interval: Duration = 0.0


class WebConfigFile(Strict):
    tls_server_config: TlsServerConfig = Field(default_factory=TlsServerConfig)
    http_server_config: HttpServerConfig = Field(default_factory=HttpServerConfig)
    rate_limit: RateLimit = Field(default_factory=RateLimit)
    basic_auth_users: dict[Annotated[str, Field(min_length=1)], Annotated[str, AfterValidator(_bcrypt_hash)]] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _http2_suites(self) -> WebConfigFile:
        tls = self.tls_server_config
        http2_suite = any(name in webtls.HTTP2_REQUIRED for name in tls.cipher_suites)
        if self.http_server_config.http2 and tls.enabled() and tls.cipher_suites and not http2_suite:
            # As Go's http2.ConfigureServer refuses it (the toolkit's noHTTP2Cipher case).
            raise ValueError(
                "http2: TLSConfig.CipherSuites is missing an HTTP/2-required AES_128_GCM_SHA256 cipher "
                "(need at least one of TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 or "
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256); or set http_server_config.http2: false"
            )
        return self


class RateLimiter:
    """Go's rate.Limiter with Allow(): a bucket of `burst` tokens, one more every `interval`."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.clock = limit, clock
        self._tokens, self._at = float(limit.burst), clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self.clock()
            self._tokens = min(self.limit.burst, self._tokens + (now - self._at) / self.limit.interval)
            self._at = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            return False


@dataclass(frozen=True)
class WebAccess:
    """What a web config file decides: TLS (None: plain HTTP), who may ask (no users: anyone),
    the headers every answer carries and the rate limit (None: none)."""

    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    files: tuple[Path, ...] = ()  # the file and those it names: a change to any is a new config
    headers: tuple[tuple[str, str], ...] = ()
    rate_limit: RateLimit | None = None
    client_allowed_sans: tuple[str, ...] | None = None


OPEN = WebAccess()


def _is_empty(path: Path) -> bool:
    """An empty file (or one of comments only): no TLS, no users, as the toolkit reads it."""
    try:
        return yaml.safe_load(yamlfile.read_text(path)) is None
    except yaml.YAMLError:
        return False  # yamlfile.load says what is wrong with it


def load(path: Path) -> WebAccess:
    """The web config file as a WebAccess; raises ConfigError listing every problem with file:line
    and field. Relative file names are relative to the file's directory, as in the toolkit."""
    if _is_empty(path):
        return WebAccess(files=(path,))
    doc = yamlfile.load(path)
    cfg = yamlfile.validate(doc, WebConfigFile)
    files = [path]
    context = None
    tls = cfg.tls_server_config
    if tls.enabled():
        base = path.parent
        tls = tls.model_copy(update={name: base / value for name, value in tls if isinstance(value, Path)})
        files += [p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p is not None]
        where = ("tls_server_config",)
        try:
            context = webtls.context(tls)
        except webtls.FileProblem as exc:
            raise ConfigError(
                [f"{doc.where((*where, exc.field))}: {'.'.join((*where, exc.field))}: {exc.problem}"]
            ) from exc
        if (problem := tls.policy_problem()) is not None:
            raise ConfigError([f"{doc.where(where)}: tls_server_config: {problem}"])
    users = {user: hashed.encode() for user, hashed in cfg.basic_auth_users.items()}
    headers = tuple(cfg.http_server_config.headers.items())
    limit = cfg.rate_limit if cfg.rate_limit.interval > 0 else None
    sans = tuple(tls.client_allowed_sans) if tls.enabled() and tls.client_allowed_sans is not None else None
    return WebAccess(context, users, tuple(files), headers, limit, sans)


# How often, at most, the files are looked at for a change: the toolkit reads them per connection
# (its reload test reconnects 250 ms after a change); a stat of each every 0.1 s at most costs nothing.
RECHECK_SECONDS = 0.1

Stamp = tuple[int, int, int, int] | None


def _stamp(path: Path) -> Stamp:
    """What tells a rewritten file from the one read: an atomic replace changes the inode, an
    edit in place the modification time or size."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size


class WebConfigSource:
    """The web config in force (OPEN without a file); `current()` is called per connection and
    per request, from any thread."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.clock = path, clock
        self._lock = threading.Lock()
        self._access = load(path) if path is not None else OPEN
        self._stamps = [_stamp(p) for p in self._access.files]
        self._checked = clock()
        self.reloads: Counter[str] = Counter()  # success, failure
        self.last_reload_ok = True

    def current(self) -> WebAccess:
        with self._lock:
            if self.path is None or self.clock() - self._checked < RECHECK_SECONDS:
                return self._access
            self._checked = self.clock()
            changed = [_stamp(p) for p in self._access.files] != self._stamps
        if changed:
            self.reload()
        return self._access

    def reload(self) -> str | None:
        """Read the file again; None when it is in force, else what is wrong (the last good one stays)."""
        if self.path is None:
            return None
        with self._lock:
            stamps = [_stamp(p) for p in self._access.files]
            try:
                access = load(self.path)
            except ConfigError as exc:
                return self._refused(stamps, "; ".join(exc.problems))
            if (access.ssl_context is None) != (self._access.ssl_context is None):
                # As the toolkit, TLS or not is decided at start: a file that lost its
                # tls_server_config must not turn /metrics into plain HTTP unnoticed.
                return self._refused(stamps, f"{self.path}: adding or removing tls_server_config needs a restart")
            self._access, self._stamps = access, [_stamp(p) for p in access.files]
            self.reloads["success"] += 1
            self.last_reload_ok = True
        log.info("web config %s: read again and in force", self.path)
        return None

    def _refused(self, stamps: list[Stamp], problem: str) -> str:
        self._stamps = stamps  # the same broken files are not read again at every connection
        self.reloads["failure"] += 1
        self.last_reload_ok = False
        log.error("web config refused, the last good one stays in force: %s", problem)
        return problem

    def exposition(self) -> list[str]:
        with self._lock:
            counts, ok = dict(self.reloads), self.last_reload_ok
        return [
            "# HELP pathprobe_web_config_reloads_total Readings of the web config file after the start (a reload "
            "or a change on disk), by result; a failed one keeps the last good file in force.",
            "# TYPE pathprobe_web_config_reloads_total counter",
            *(f'pathprobe_web_config_reloads_total{{result="{r}"}} {counts.get(r, 0)}' for r in ("success", "failure")),
            "# HELP pathprobe_web_config_last_reload_successful Whether the last reading of the web config file "
            "was put in force.",
            "# TYPE pathprobe_web_config_last_reload_successful gauge",
            f"pathprobe_web_config_last_reload_successful {int(ok)}",
        ]


# A bcrypt hash of a password nobody has: an unknown user costs the same time as a known one,
# so that timing does not tell which users exist (as the toolkit does).
_NOBODY = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


class Passwords:
    """Basic auth against bcrypt hashes. bcrypt at cost 10 takes ~50-100 ms, a scrape's budget:
    each verdict is cached (at most CACHE_SIZE, the oldest dropped first), keyed by the user, the
    hash it was checked against and a SHA-256 of the password given, so a scrape with a known
    password costs a dictionary lookup, and a changed users file is checked afresh. One bcrypt runs
    at a time, as the toolkit does: a flood of wrong passwords takes one core, not all."""

    CACHE_SIZE = 100

    def __init__(self) -> None:
        self._cache: OrderedDict[tuple[str, bytes, bytes], bool] = OrderedDict()
        self._lock = threading.Lock()
        self._bcrypt = threading.Lock()

    def check(self, users: Mapping[str, bytes], authorization: str) -> bool:
        """Whether an Authorization header names a user of `users` with their password."""
        user, password = _basic(authorization)
        if user is None or password is None:
            return False
        stored = users.get(user)
        key = (user, stored or b"", hashlib.sha256(password).digest())
        with self._lock:
            known = self._cache.get(key)
            if known is not None:
                self._cache.move_to_end(key)
                return known
        with self._bcrypt:
            try:
                ok = bcrypt.checkpw(password, stored or _NOBODY) and stored is not None
            except ValueError:  # a password over bcrypt's 72 bytes: no hash can match it
                ok = False
        with self._lock:
            self._cache[key] = ok
            while len(self._cache) > self.CACHE_SIZE:
                self._cache.popitem(last=False)
        return ok


def _basic(authorization: str) -> tuple[str | None, bytes | None]:
    scheme, _, encoded = authorization.partition(" ")
    if not hmac.compare_digest(scheme.lower().encode(), b"basic"):
        return None, None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None, None
    user, colon, password = decoded.partition(b":")
    if not colon:
        return None, None
    return user.decode("utf-8", errors="replace"), password
