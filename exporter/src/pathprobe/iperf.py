"""iperf3 as the throughput engine: command lines, running, and parsing `-J`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .results import ProbeFailure, Reason, ThroughputResult

# Substrings of iperf3's "error" field, first match wins.
_ERROR_REASONS: tuple[tuple[str, Reason], ...] = (
    ("busy", "busy"),
    ("connection refused", "refused"),
    ("no route to host", "unreachable"),
    ("network is unreachable", "unreachable"),
    ("host is unreachable", "unreachable"),
    ("timed out", "timeout"),
    ("timeout", "timeout"),
    ("authentication failed", "not_allowed"),
    ("authorization failed", "not_allowed"),
)


@dataclass(frozen=True)
class ThroughputTest:
    address: str
    port: int = 5201
    protocol: str = "tcp"
    streams: int = 1
    direction: str = "send"  # send: this host -> peer; receive: peer -> this host (-R)
    duration_seconds: float = 5
    omit_seconds: float = 1
    congestion: str | None = None
    udp_bitrate: float = 100e6
    window_bytes: int | None = None
    connect_timeout_seconds: float = 3
    # RSA authentication (client side).
    username: str | None = None
    password_file: Path | None = None
    public_key_file: Path | None = None

    def command(self, binary: str = "iperf3") -> list[str]:
        cmd = [
            binary, "-c", self.address, "-p", str(self.port), "-J",
            "-t", f"{self.duration_seconds:g}", "-O", f"{self.omit_seconds:g}",
            "-P", str(self.streams),
            "--connect-timeout", str(int(self.connect_timeout_seconds * 1000)),
        ]  # fmt: skip
        if self.protocol == "udp":
            # -b is per stream in iperf3; the configured rate is the total.
            cmd += ["-u", "-b", f"{self.udp_bitrate / self.streams:.0f}"]
        if self.direction == "receive":
            cmd.append("-R")
        if self.congestion and self.protocol == "tcp":
            cmd += ["-C", self.congestion]
        if self.window_bytes:
            cmd += ["-w", str(self.window_bytes)]
        if self.username and self.public_key_file:
            cmd += ["--username", self.username, "--rsa-public-key-path", str(self.public_key_file)]
        return cmd

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.password_file:
            env["IPERF3_PASSWORD"] = self.password_file.read_text().strip()
        return env

    def max_seconds(self, margin_seconds: float) -> float:
        """The longest a test may take before it is killed (connecting included in the margin)."""
        return self.omit_seconds + self.duration_seconds + margin_seconds


def classify_error(message: str) -> Reason:
    low = message.lower()
    for needle, reason in _ERROR_REASONS:
        if needle in low:
            return reason
    return "error"


def parse(output: str | bytes, test: ThroughputTest, now: float | None = None) -> ThroughputResult:
    """Parse iperf3 -J output; raise ProbeFailure for an error report or garbage."""
    try:
        doc = json.loads(output)
    except (ValueError, UnicodeDecodeError) as exc:
        snippet = (output[:80] if isinstance(output, str) else output[:80].decode(errors="replace")).strip()
        raise ProbeFailure("error", f"iperf3 output is not JSON ({exc}): {snippet!r}") from exc
    if not isinstance(doc, dict):
        raise ProbeFailure("error", "iperf3 output is not a JSON object")
    if doc.get("error"):
        message = str(doc["error"])
        raise ProbeFailure(classify_error(message), message)
    try:
        return _result(doc, test, now)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProbeFailure("error", f"iperf3 JSON lacks an expected field: {exc!r}") from exc


def _result(doc: dict[str, Any], test: ThroughputTest, now: float | None) -> ThroughputResult:
    end = doc["end"]
    start = doc.get("start", {})
    sent = end["sum_sent"]
    if test.protocol == "udp":
        # iperf3 >= 3.7 has the receiver's view in sum_received; older ones only in sum.
        recv = end["sum_received"] if "lost_packets" in end.get("sum_received", {}) else end["sum"]
        packets = int(recv["packets"])
        lost = int(recv["lost_packets"])
        return ThroughputResult(
            **_settings(test),
            receiver_bytes_per_second=float(recv["bits_per_second"]) / 8,
            sender_bytes_per_second=float(sent["bits_per_second"]) / 8,
            bytes_transferred=int(sent["bytes"]),
            udp_packets=packets,
            udp_lost=lost,
            udp_loss_ratio=lost / packets if packets else 0.0,
            jitter_seconds=float(recv.get("jitter_ms", 0.0)) / 1000,
            timestamp=now if now is not None else time.time(),
            iperf3_version=str(start.get("version", "")),
        )
    recv = end["sum_received"]
    return ThroughputResult(
        **_settings(test),
        receiver_bytes_per_second=float(recv["bits_per_second"]) / 8,
        sender_bytes_per_second=float(sent["bits_per_second"]) / 8,
        bytes_transferred=int(sent["bytes"]),
        retransmits=int(sent["retransmits"]) if "retransmits" in sent else None,
        timestamp=now if now is not None else time.time(),
        iperf3_version=str(start.get("version", "")),
    )


def _settings(test: ThroughputTest) -> dict[str, Any]:
    return {
        "protocol": test.protocol,
        "streams": test.streams,
        "direction": test.direction,
        "duration_seconds": test.duration_seconds,
        "omit_seconds": test.omit_seconds,
        "congestion": test.congestion,
        "target_bits_per_second": test.udp_bitrate if test.protocol == "udp" else None,
    }


async def run(test: ThroughputTest, binary: str = "iperf3", margin_seconds: float = 5) -> ThroughputResult:
    """Run one iperf3 client test; on timeout its whole process group is killed."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *test.command(binary),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
            env=test.env(),
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise ProbeFailure("error", f"iperf3 binary not found: {binary}") from exc
    try:
        async with asyncio.timeout(test.max_seconds(margin_seconds)):
            out, err = await proc.communicate()
    except (TimeoutError, asyncio.CancelledError) as exc:
        _kill_group(proc.pid)
        await proc.wait()
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise ProbeFailure("timeout", f"iperf3 did not finish within {test.max_seconds(margin_seconds):g} s") from exc
    if not out.strip():
        raise ProbeFailure(
            "error", f"iperf3 exited {proc.returncode} with no output: {err.decode(errors='replace')[:200]}"
        )
    return parse(out, test)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
