"""The host's iperf3 binary: its version, and the authentication options that depend on it.

iperf3 3.17 (its release notes, ESnet, May 2024) encrypts the credentials of its RSA
authentication with OAEP padding instead of PKCS#1 v1.5, which older versions cannot read:
between a 3.17+ end and an older one every authenticated test fails ("test authorization
failed", both ways; Debian 13's 3.18 against Debian 12's 3.12, measured). Builds that have the
new padding have --use-pkcs1-padding, which gives them the old one: up to 3.19 as client and
server, from 3.20 as server only (esnet/iperf pull request 1894, "Allow setting options only for
client or server", May 2025), so a 3.20+ client cannot test a server older than 3.17 at all.
What a build has is read from its --help, not guessed from its version: a distribution may
carry the change in an older version."""

from __future__ import annotations

import logging
import re
import subprocess

PKCS1_OPTION = "--use-pkcs1-padding"
SERVER_ONLY_SINCE = (3, 20)  # the option's first version as a server-only option
_VERSION = re.compile(r"iperf (\d+)\.(\d+)")
_read: dict[tuple[str, str], str] = {}  # (binary, flag) -> its output; failed reads are tried again


def _output(binary: str, flag: str) -> str | None:
    if (binary, flag) not in _read:
        try:
            proc = subprocess.run([binary, flag], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        if proc.returncode != 0:
            return None
        _read[binary, flag] = proc.stdout
    return _read[binary, flag]


def version(binary: str) -> tuple[int, int] | None:
    """(major, minor) of `binary`, None if it does not run or says no version."""
    found = _VERSION.match(_output(binary, "--version") or "")
    return (int(found[1]), int(found[2])) if found else None


def version_text(binary: str) -> str | None:
    """`binary`'s version as "major.minor" (what ends.threads_per_stream reads), None if unknown."""
    found = version(binary)
    return f"{found[0]}.{found[1]}" if found else None


def has_option(binary: str, option: str) -> bool:
    """Whether `binary`'s --help lists `option`."""
    return option in (_output(binary, "--help") or "")


def has_pkcs1_option(binary: str) -> bool:
    """Whether `binary` pads with OAEP and can be told to use the old padding."""
    return has_option(binary, PKCS1_OPTION)


def server_options(binary: str, legacy_rsa_padding: bool) -> list[str]:
    """The padding option of an authenticated server: the old padding while the fleet has older iperf3."""
    return [PKCS1_OPTION] if legacy_rsa_padding and has_pkcs1_option(binary) else []


def client_options(binary: str, legacy_rsa_padding: bool) -> list[str]:
    """The padding option of an authenticated client (a 3.20+ client has none: OAEP only)."""
    found = version(binary)
    client_can = has_pkcs1_option(binary) and found is not None and found < SERVER_ONLY_SINCE
    return [PKCS1_OPTION] if legacy_rsa_padding and client_can else []


def describe(binary: str, legacy_rsa_padding: bool) -> tuple[int, str]:
    """The log level and line for the binary's version and the padding its authenticated tests use."""
    found = version(binary)
    name = f"iperf3 {found[0]}.{found[1]} ({binary})" if found else f"iperf3 of unknown version ({binary})"
    if not has_pkcs1_option(binary):
        return logging.INFO, f"{name}: authenticated tests use the old (PKCS#1) padding, the only one it has"
    if not legacy_rsa_padding:
        return logging.INFO, f"{name}: authenticated tests use OAEP padding"
    if client_options(binary, legacy_rsa_padding):
        return logging.INFO, f"{name}: authenticated tests use the old (PKCS#1) padding (legacy_rsa_padding)"
    return logging.WARNING, (
        f"{name}: serves the old (PKCS#1) padding (legacy_rsa_padding), but its client "
        "has OAEP only: its tests of hosts with iperf3 older than 3.17 fail"
    )
