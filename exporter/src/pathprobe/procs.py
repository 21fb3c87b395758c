"""Child processes: THE place that starts, signals and reaps process groups.

Every child runs in its own session (so that a signal reaches its whole group) and
gets PR_SET_PDEATHSIG: when the process that started it dies, even by SIGKILL, the
kernel sends it SIGKILL, so no child outlives pathprobe. It starts with the signals
that stop it at their defaults, whatever pathprobe inherited: a shell's `cmd &` without
job control starts pathprobe with SIGINT and SIGQUIT ignored, a child inherits that,
and a child that does not set its own handler would then never stop on SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
_libc = ctypes.CDLL(None, use_errno=True)


def die_with(parent: int) -> Callable[[], None]:
    """A preexec_fn for children of `parent` (pass os.getpid()): SIGKILL when it goes (Linux),
    and STOP_SIGNALS at their defaults. A parent that died between fork and the prctl sends
    no signal, hence the check after."""

    def preexec() -> None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        for sig in STOP_SIGNALS:  # libc's: Python's signal.signal() refuses outside the main thread
            _libc.signal(int(sig), ctypes.c_void_p(int(signal.SIG_DFL)))

    return preexec


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def stopped(pid: int) -> bool:
    """Whether `pid` is stopped (SIGSTOP, a debugger): alive, yet serving nothing."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] in "Tt"
    except (OSError, IndexError):
        return False


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group led by `pid`; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def terminate(pid: int, grace: float = 3.0, group: bool = False) -> None:
    """SIGTERM `pid` (or its group), SIGKILL after `grace` seconds; returns once it is gone.
    For processes that are not an asyncio child of this one (e.g. recorded by pid)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig) if group else os.kill(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return
            if not alive(pid):
                return
            time.sleep(0.05)


async def stop_group(proc: asyncio.subprocess.Process, grace: float = 2.0, first: int = signal.SIGTERM) -> None:
    """Signal the asyncio child's process group (`first`, then SIGKILL after `grace` seconds)
    and reap it. Nobody else may be reading its pipes by then."""
    for sig in (first, signal.SIGKILL):
        kill_group(proc.pid, sig)
        try:
            async with asyncio.timeout(grace):
                await _ended(proc)
            return
        except TimeoutError:
            continue


async def _ended(proc: asyncio.subprocess.Process) -> None:
    """Wait for an asyncio child, reading its pipes to their end: asyncio reports the exit
    only once every pipe has closed, and a full pipe that nobody reads never closes."""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            while await stream.read(2**16):
                pass
    await proc.wait()
