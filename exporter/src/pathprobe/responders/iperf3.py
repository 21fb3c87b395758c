"""The supervised iperf3 server that peers' throughput tests connect to."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from .. import procs
from ..config import Iperf3Settings

log = logging.getLogger(__name__)

# Restart back-off: doubles from the first to the last while the server keeps exiting;
# a server that ran this long counts as healthy again.
BACKOFF_FIRST, BACKOFF_LAST, HEALTHY_AFTER = 1.0, 60.0, 60.0
# How often the server's state is checked, and how long it may stay stopped before a restart.
WATCH_SECONDS, STOPPED_RESTART_SECONDS = 2.0, 30.0


def server_command(settings: Iperf3Settings, listen: str) -> list[str]:
    cmd = [settings.binary, "-s", "-p", str(settings.port), "--idle-timeout", str(settings.idle_timeout_seconds)]
    if listen not in ("0.0.0.0", "::"):
        cmd += ["-B", listen]
    if settings.server_bitrate_limit:
        cmd += ["--server-bitrate-limit", f"{settings.server_bitrate_limit:.0f}"]
    if settings.auth:
        cmd += [
            "--rsa-private-key-path", str(settings.auth.private_key_file),
            "--authorized-users-path", str(settings.auth.authorized_users_file),
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


async def supervise(command: list[str], up: Callable[[bool], None], restarted: Callable[[], None]) -> None:
    """Keep an iperf3 server running until cancelled; then stop its process group.
    The server dies with this process (PR_SET_PDEATHSIG), even on SIGKILL."""
    backoff = BACKOFF_FIRST
    while True:
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, preexec_fn=procs.die_with(os.getpid()),
            )  # fmt: skip
        except OSError as exc:
            log.error("cannot start iperf3 server %s: %s", command[0], exc)
            up(False)
            await asyncio.sleep(max(backoff, 10.0))
            continue
        up(True)
        try:
            assert proc.stderr is not None
            err, rc = await asyncio.gather(_tail(proc.stderr), watch(proc, up))
        except asyncio.CancelledError:
            await procs.stop_group(proc)
            up(False)
            raise
        up(False)
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
