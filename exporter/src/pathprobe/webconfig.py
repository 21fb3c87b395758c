"""The web config file of /metrics, in the format of Prometheus's exporter-toolkit (the file every
Go exporter reads with --web.config.file: github.com/prometheus/exporter-toolkit,
docs/web-configuration.md): TLS (`tls_server_config`) and basic auth users with bcrypt hashes
(`basic_auth_users`). One format for every exporter on a host, and the Ansible roles of
prometheus-community template it the same way.

`WebConfigSource` owns the file in force: loaded at start (a bad file stops the start), read
again on a config reload (SIGHUP, POST /-/reload) and when it, or a certificate, key or CA file
it names, changes on disk (looked at, by their stat, at most every `RECHECK_SECONDS`, as a new
connection or request arrives). A file that fails then is logged and counted, and the last good
one stays in force. `Passwords` checks basic auth against the users, caching each verdict as
the toolkit does, so that a scrape with a known password costs no bcrypt.
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
from typing import Annotated, Any, Literal

import bcrypt
from pydantic import AfterValidator, Field, model_validator

from . import yamlfile
from .config import Strict
from .yamlfile import ConfigError

log = logging.getLogger(__name__)

ClientAuth = Literal[
    "NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"
]
TlsVersion = Literal["TLS12", "TLS13"]
VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}

# Go's crypto/tls policies as OpenSSL's verify modes. RequestClientCert asks for a certificate it
# never checks nor uses: the access it grants is NoClientCert's, which is what this does (Python's
# ssl cannot ask for a certificate without verifying it).
VERIFY_MODES = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}

# Keys of the toolkit's format that pathprobe does not implement: named as such rather than as
# unknown, so that a file written for a Go exporter says what to drop.
UNSUPPORTED = {
    (): ("http_server_config", "rate_limit"),
    ("tls_server_config",): ("cert", "key", "client_ca", "client_allowed_sans", "cipher_suites",
                             "curve_preferences", "prefer_server_cipher_suites"),
}  # fmt: skip

_BCRYPT = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")


def _bcrypt_hash(value: str) -> str:
    if not _BCRYPT.match(value):
        raise ValueError("not a bcrypt hash ($2a$, $2b$ or $2y$, a cost of 04-31, 60 characters), e.g. from "
                         "`htpasswd -nBC 10 \"\" | tr -d ':\\n'`")  # fmt: skip
    return value


def _refuse_unsupported(data: Any, where: tuple[str, ...]) -> Any:
    given = sorted(k for k in UNSUPPORTED[where] if isinstance(data, dict) and k in data)
    if given:
        raise ValueError(f"{', '.join(given)}: part of exporter-toolkit's web config format that pathprobe "
                         "does not implement; remove it")  # fmt: skip
    return data


class TlsServerConfig(Strict):
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: ClientAuth = "NoClientCert"
    min_version: TlsVersion = "TLS12"
    max_version: TlsVersion = "TLS13"

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        return _refuse_unsupported(data, ("tls_server_config",))

    @model_validator(mode="after")
    def _coherent(self) -> TlsServerConfig:
        if self.client_auth_type == "RequireAnyClientCert":
            # Python's ssl verifies every certificate it asks for: "any" certificate cannot be let in.
            raise ValueError("client_auth_type RequireAnyClientCert (any certificate, none verified) is not "
                             "supported: use RequireAndVerifyClientCert with client_ca_file")  # fmt: skip
        verifies = self.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
        if verifies and self.client_ca_file is None:
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file (the CA that signs "
                             "the clients' certificates)")  # fmt: skip
        if self.client_ca_file is not None and self.client_auth_type == "NoClientCert":
            # As the toolkit: a CA without a policy is most likely a policy forgotten.
            raise ValueError("client_ca_file is set but client_auth_type is NoClientCert: set "
                             "client_auth_type: RequireAndVerifyClientCert")  # fmt: skip
        if VERSIONS[self.min_version] > VERSIONS[self.max_version]:
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        return self


class WebConfigFile(Strict):
    tls_server_config: TlsServerConfig | None = None
    basic_auth_users: dict[Annotated[str, Field(min_length=1)], Annotated[str, AfterValidator(_bcrypt_hash)]] = Field(
        default_factory=dict
    )

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        return _refuse_unsupported(data, ())


@dataclass(frozen=True)
class WebAccess:
    """What a web config file decides: TLS (None: plain HTTP) and who may ask (no users: anyone)."""

    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    files: tuple[Path, ...] = ()  # the file and those it names: a change to any is a new config


OPEN = WebAccess()


def load(path: Path) -> WebAccess:
    """The web config file as a WebAccess; raises ConfigError listing every problem with file:line
    and field. Relative file names are relative to the file's directory, as in the toolkit."""
    doc = yamlfile.load(path)
    cfg = yamlfile.validate(doc, WebConfigFile)
    files = [path]
    context = None
    tls = cfg.tls_server_config
    if tls is not None:
        base = path.parent
        tls = tls.model_copy(update={name: base / value for name, value in tls if isinstance(value, Path)})
        files += [p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p is not None]
        try:
            context = _ssl_context(tls)
        except _FileProblem as exc:
            raise ConfigError([f"{doc.where(exc.loc)}: {'.'.join(exc.loc)}: {exc.problem}"]) from exc
    users = {user: hashed.encode() for user, hashed in cfg.basic_auth_users.items()}
    return WebAccess(context, users, tuple(files))


class _FileProblem(Exception):
    def __init__(self, loc: tuple[str, ...], problem: str):
        super().__init__(problem)
        self.loc, self.problem = loc, problem


def _ssl_context(tls: TlsServerConfig) -> ssl.SSLContext:
    where = ("tls_server_config",)
    for name in ("cert_file", "key_file", "client_ca_file"):
        path = getattr(tls, name)
        if path is not None and (problem := yamlfile.file_problem(path)):
            raise _FileProblem((*where, name), problem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version, ctx.maximum_version = VERSIONS[tls.min_version], VERSIONS[tls.max_version]
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise _FileProblem((*where, "cert_file"), f"{tls.cert_file} with {tls.key_file}: {exc}") from exc
    if tls.client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise _FileProblem((*where, "client_ca_file"), f"{tls.client_ca_file}: {exc}") from exc
    ctx.verify_mode = VERIFY_MODES[tls.client_auth_type]
    return ctx


# How often, at most, the files are looked at for a change.
RECHECK_SECONDS = 2.0

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
