"""A self-signed certificate for 127.0.0.1, for the tests that serve /metrics over TLS."""

import subprocess
from pathlib import Path


def self_signed(d: Path) -> tuple[Path, Path]:
    """(certificate, key) written into `d` by openssl."""
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", "/CN=127.0.0.1", "-days", "1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key
