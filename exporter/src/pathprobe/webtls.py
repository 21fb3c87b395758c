"""The TLS side of the web config file (`tls_server_config`, exporter-toolkit's web/tls_config.go):
Go's names for versions, cipher suites and curves as OpenSSL's, the certificate and key from a
file or inline, the client CAs (a file, inline, or the system's roots when a verifying policy
names none, as Go's crypto/tls verifies against them), and the client SANs a certificate must
carry (`client_allowed_sans`, checked once the handshake is done: `allowed`).

What Python's ssl cannot do is refused by name: `RequireAnyClientCert` (OpenSSL verifies every
certificate it asks for) and a `curve_preferences` of more than one curve (Python 3.11 sets one
group). TLS 1.3's suites are not configurable, in Go as here."""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# Go's crypto/tls policies as OpenSSL's verify modes. RequestClientCert asks for a certificate it
# never checks nor uses: the access it grants is NoClientCert's, which is what this does (Python's
# ssl cannot ask for a certificate without verifying it).
VERIFY_MODES = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go's names (tls.CipherSuites()) and OpenSSL's. TLS 1.3's are accepted and, as in Go, change nothing.
CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": "",
    "TLS_AES_256_GCM_SHA384": "",
    "TLS_CHACHA20_POLY1305_SHA256": "",
}
# What Go's HTTP/2 server requires among the suites when HTTP/2 is on (its default).
HTTP2_REQUIRED = ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}


class FileProblem(Exception):
    """A file (or inline PEM) of tls_server_config that cannot be used: `field` names it."""

    def __init__(self, field: str, problem: str):
        super().__init__(problem)
        self.field, self.problem = field, problem


def readable(field: str, path: Path) -> None:
    """Raises FileProblem unless `path` can be read (as Go's os.ReadFile: /dev/null can)."""
    try:
        with open(path, "rb"):
            pass
    except IsADirectoryError:
        raise FileProblem(field, f"failed to read {field} ({path}): it is a directory") from None
    except OSError as exc:  # Go's wording, which users search for: "no such file or directory"
        raise FileProblem(field, f"failed to read {field} ({path}): {(exc.strerror or str(exc)).lower()}") from None


def _pem_file(text: str) -> int:
    """A memory file holding `text` (inline PEM): OpenSSL loads a chain from a file name only."""
    fd = os.memfd_create("pathprobe-web-pem", os.MFD_CLOEXEC)
    os.write(fd, text.encode())
    return fd


def load_chain(ctx: ssl.SSLContext, tls: Any) -> None:
    """The certificate and key: the file's when both are named, else the inline PEM (as Go)."""
    opened = []
    try:
        names = []
        for field in ("cert", "key"):
            path = getattr(tls, f"{field}_file")
            if path:
                names.append(str(path))
            else:
                opened.append(_pem_file(getattr(tls, field)))
                names.append(f"/proc/self/fd/{opened[-1]}")
        try:
            ctx.load_cert_chain(names[0], names[1])
        except (ssl.SSLError, OSError) as exc:
            raise FileProblem("cert_file", f"failed to load X509KeyPair: {exc}") from exc
    finally:
        for fd in opened:
            os.close(fd)


def client_cas(ctx: ssl.SSLContext, tls: Any) -> None:
    """The CAs a client's certificate is verified against: the file's, the inline ones, or, for a
    verifying policy that names none, the system's (Go's crypto/tls verifies against those)."""
    try:
        if tls.client_ca_file:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        elif tls.client_ca:
            ctx.load_verify_locations(cadata=tls.client_ca)
        elif VERIFY_MODES[tls.client_auth_type] != ssl.CERT_NONE:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    except (ssl.SSLError, OSError) as exc:
        where = "client_ca_file" if tls.client_ca_file else "client_ca"
        if "no certificate or crl found" in str(exc).lower() or "NO_CERTIFICATE" in str(exc):
            return  # Go's AppendCertsFromPEM takes an empty file (/dev/null) as no CA at all
        raise FileProblem(where, f"{tls.client_ca_file or 'client_ca'}: {exc}") from exc


def context(tls: Any) -> ssl.SSLContext:
    """The server's SSLContext for a validated tls_server_config (`webconfig.TlsServerConfig`)."""
    for field in ("cert_file", "key_file", "client_ca_file"):
        if path := getattr(tls, field):
            readable(field, path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version, ctx.maximum_version = VERSIONS[tls.min_version], VERSIONS[tls.max_version]
    load_chain(ctx, tls)
    suites = [CIPHERS[name] for name in tls.cipher_suites if CIPHERS[name]]
    if suites:
        ctx.set_ciphers(":".join(suites))
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.curve_preferences:
        ctx.set_ecdh_curve(CURVES[tls.curve_preferences[0]])
    client_cas(ctx, tls)
    ctx.verify_mode = VERIFY_MODES[tls.client_auth_type]
    return ctx


def sans(peercert: dict[str, Any]) -> list[str]:
    """A verified certificate's SANs as Go writes them (DNS names, emails, IPs, URIs)."""
    out = []
    for kind, value in peercert.get("subjectAltName", ()):
        out.append(str(ipaddress.ip_address(value.strip())) if kind == "IP Address" else value)
    return out


def allowed(peercert: dict[str, Any] | None, allowed_sans: Sequence[str] | None) -> bool:
    """Whether a client's certificate carries one of `allowed_sans` (None: any client its policy
    lets in; with allowed SANs, a client without a certificate is refused)."""
    if allowed_sans is None:
        return True
    return bool(peercert) and any(san in allowed_sans for san in sans(peercert or {}))
