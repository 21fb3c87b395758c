"""Certificates for the tests that serve /metrics over TLS, made by openssl: a self-signed one
for 127.0.0.1, or a CA with a server certificate and a client certificate signed by it."""

import subprocess
from pathlib import Path

import bcrypt


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def _key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", str(path))


def self_signed(d: Path) -> tuple[Path, Path]:
    """(certificate, key) written into `d` by openssl."""
    cert, key = d / "cert.pem", d / "key.pem"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-days",
        "1",
        "-keyout",
        str(key),
        "-out",
        str(cert),
    )
    return cert, key


def signed_by(ca: Path, ca_key: Path, d: Path, name: str, extension: str) -> tuple[Path, Path]:
    """(certificate, key) for `name`, signed by the CA, with an X.509 extension line (SANs, usage)."""
    cert, key, csr, ext = d / f"{name}.pem", d / f"{name}-key.pem", d / f"{name}.csr", d / f"{name}.ext"
    _key(key)
    _openssl("req", "-new", "-key", str(key), "-subj", f"/CN={name}", "-out", str(csr))
    ext.write_text(extension + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        str(ext),
        "-out",
        str(cert),
    )
    return cert, key


def mutual_tls(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all in `d`:
    ca, server, server_key, client, client_key."""
    ca, ca_key = d / "ca.pem", d / "ca-key.pem"
    _key(ca_key)
    _openssl(
        "req", "-x509", "-new", "-key", str(ca_key), "-subj", "/CN=pathprobe test CA", "-days", "1", "-out", str(ca)
    )
    server, server_key = signed_by(
        ca, ca_key, d, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"
    )
    client, client_key = signed_by(ca, ca_key, d, "client", "extendedKeyUsage=clientAuth")
    return {"ca": ca, "server": server, "server_key": server_key, "client": client, "client_key": client_key}


def bcrypt_hash(password: str) -> str:
    """As htpasswd -B makes them, at bcrypt's lowest cost (the tests check many)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
