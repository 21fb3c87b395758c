"""The supervised iperf3 server that peers' throughput tests connect to."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

from .. import iperf3, procs
from ..config import Iperf3Settings

log = logging.getLogger(__name__)

# A test's client address -> "ok", or the reason it may not test this host ("not_allowed",
# "out_of_turn"); counted as pathprobe_responder_requests_total{responder="iperf3"}.
Admit = Callable[[str], str]

# Restart back-off: doubles from the first to the last while the server keeps exiting;
# a server that ran this long counts as healthy again.
BACKOFF_FIRST, BACKOFF_LAST, HEALTHY_AFTER = 1.0, 60.0, 60.0
# /proc/net/tcp's state column for a listening socket.
LISTEN_STATE = "0A"
# How often the server's state is checked, and how long it may stay stopped before a restart.
WATCH_SECONDS, STOPPED_RESTART_SECONDS = 2.0, 30.0


def server_command(settings: Iperf3Settings, listen: str) -> list[str]:
    cmd = [settings.binary, "-s", "-p", str(settings.port), "--idle-timeout", str(settings.idle_timeout_seconds)]
    if settings.admit != "anyone":
        # iperf3 flushes its output once per interval report (1 s): line-buffered (coreutils'
        # stdbuf), "Accepted connection from ..." reaches the admission ~3 ms after the client
        # connects, before the test's data stream exists.
        cmd = ["stdbuf", "-oL", *cmd]
    if listen not in ("0.0.0.0", "::"):
        cmd += ["-B", listen]
    if settings.server_bitrate_limit:
        cmd += ["--server-bitrate-limit", f"{settings.server_bitrate_limit:.0f}"]
    if settings.auth:
        cmd += [
            "--rsa-private-key-path", str(settings.auth.private_key_file),
            "--authorized-users-path", str(settings.auth.authorized_users_file),
            *iperf3.server_options(settings.binary, settings.auth.legacy_rsa_padding),
        ]  # fmt: skip
    return cmd


async def watch(proc: asyncio.subprocess.Process, up: Callable[[bool], None]) -> int:
    """Wait for the server to exit. A stopped server (SIGSTOP) accepts connections in the
    kernel yet serves none: it is reported down at once and killed (so restarted) after
    STOPPED_RESTART_SECONDS."""
    stopped_since: float | None = None
    while True:
        try:
            async with asyncio.timeout(WATCH_SECONDS):
                return await proc.wait()
        except TimeoutError:
            pass
        if not procs.stopped(proc.pid):
            if stopped_since is not None:
                log.warning("iperf3 server (pid %d) runs again", proc.pid)
                stopped_since = None
                up(True)
            continue
        if stopped_since is None:
            log.warning("iperf3 server (pid %d) is stopped: peers' tests cannot run", proc.pid)
            stopped_since = time.monotonic()
            up(False)
        elif time.monotonic() - stopped_since > STOPPED_RESTART_SECONDS:
            log.warning("iperf3 server (pid %d) stopped for %g s: restarting it", proc.pid, STOPPED_RESTART_SECONDS)
            procs.kill_group(proc.pid)


async def _tail(stream: asyncio.StreamReader, keep: int = 4096) -> bytes:
    """A pipe read to its end, keeping its last `keep` bytes: a server whose stderr nobody
    reads blocks on its next message (iperf3 -s writes one per aborted client)."""
    tail = b""
    while chunk := await stream.read(2**16):
        tail = (tail + chunk)[-keep:]
    return tail


def listening(port: int) -> bool:
    """Whether a TCP socket of this network namespace listens on `port` (/proc/net/tcp and
    tcp6: read-only, where a probing bind or connect would race the server or hold its one test)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for row in rows:
            _, local, _, state, *_ = row.split()
            if state == LISTEN_STATE and int(local.rsplit(":", 1)[1], 16) == port:
                return True
    return False


async def wait_listening(port: int, timeout: float, down: Callable[[], bool]) -> bool:
    """Whether the server, started in a process of its own, came to listen on `port` within
    `timeout`; False as soon as `down()` says it exited."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while not listening(port):
                if down():
                    return False
                await asyncio.sleep(0.01)
            return True
    return False


# iperf3 -s prints this once a client's control connection has sent its cookie, before the
# test's parameters are exchanged and before any data stream exists; and the second once it
# is ready for the next test (the last one ended).
ACCEPTED = re.compile(rb"^Accepted connection from (\S+), port \d+")
LISTENING = re.compile(rb"^Server listening on ")


async def _admit(stdout: asyncio.StreamReader | None, admit: Admit | None, pid: int,
                 serving: Callable[[bool], None]) -> str | None:  # fmt: skip
    """Read the server's output to its end; on a test that `admit` refuses, kill the server
    (the test dies with it, within milliseconds of its start) and return the refusal.
    `serving(True)` as a test is admitted, `serving(False)` when it has ended."""
    if stdout is None or admit is None:
        return None
    while True:
        try:
            line = await stdout.readline()
        except ValueError:  # a line beyond the reader's limit: not one of iperf3's
            continue
        if not line:
            return None
        if LISTENING.match(line):
            serving(False)
        accepted = ACCEPTED.match(line)
        if accepted is None:
            continue
        address = accepted.group(1).decode(errors="replace")
        result = admit(address)
        if result == "ok":
            serving(True)
        else:
            log.warning("iperf3 test from %s refused (%s): the server is cut and restarted", address, result)
            procs.kill_group(pid)
            await _tail(stdout)
            return result


async def supervise(command: list[str], up: Callable[[bool], None], restarted: Callable[[], None],
                    admit: Admit | None = None, serving: Callable[[bool], None] = lambda _: None) -> None:  # fmt: skip
    """Keep an iperf3 server running until cancelled; then stop its process group.
    The server dies with this process (PR_SET_PDEATHSIG), even on SIGKILL. With `admit`,
    every test's client address is checked as it connects (a refused one is cut at once),
    and `serving` follows whether an admitted test runs."""
    backoff = BACKOFF_FIRST
    output = asyncio.subprocess.DEVNULL if admit is None else asyncio.subprocess.PIPE
    while True:
        started = time.monotonic()
        try:
            proc = await procs.start(command, stdin=asyncio.subprocess.DEVNULL, stdout=output,
                                     stderr=asyncio.subprocess.PIPE)  # fmt: skip
        except OSError as exc:
            log.error("cannot start iperf3 server (%s): %s", " ".join(command[:3]), exc)
            up(False)
            await asyncio.sleep(max(backoff, 10.0))
            continue
        up(True)
        try:
            assert proc.stderr is not None
            err, rc, refused = await asyncio.gather(_tail(proc.stderr), watch(proc, up),
                                                    _admit(proc.stdout, admit, proc.pid, serving))  # fmt: skip
        except asyncio.CancelledError:
            await procs.stop_group(proc)
            up(False)
            serving(False)
            raise
        up(False)
        serving(False)
        if refused is not None:
            continue  # cut on purpose: back at once, no back-off, not a failure
        restarted()
        if time.monotonic() - started > HEALTHY_AFTER:
            backoff = BACKOFF_FIRST
        log.warning(
            "iperf3 server exited with %s: %s; restarting in %g s",
            rc,
            err.decode(errors="replace").strip()[-300:],
            backoff,
        )
        await asyncio.sleep(backoff)
        backoff = min(BACKOFF_LAST, backoff * 2)
