"""Child processes: THE place that starts, signals and reaps process groups.

Every child runs in its own session (so that a signal reaches its whole group) and
gets PR_SET_PDEATHSIG: when the process that started it dies, even by SIGKILL, the
kernel sends it SIGKILL, so no child outlives pathprobe. It starts with the signals
that stop it at their defaults, whatever pathprobe inherited: a shell's `cmd &` without
job control starts pathprobe with SIGINT and SIGQUIT ignored, a child inherits that,
and a child that does not set its own handler would then never stop on SIGINT.

Both are set by a fresh Python interpreter exec'd in front of the child (`_GUARD`), not
by a `preexec_fn`: with one, CPython forks and runs Python in the child before exec, which
can deadlock on a lock another thread held at the fork (the subprocess documentation
warns of it: "The preexec_fn parameter is NOT SAFE to use in the presence of threads");
an exporter under libfaketime hung so. util-linux's `setpriv --pdeathsig` would do the
same but calls capset(2), which the systemd unit's `SystemCallFilter=~@privileged` kills.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
# argv: the parent's pid, the program's path, the child's argv. A parent that died between the
# fork and the prctl sends no signal, hence the check after it. Python ignores SIGPIPE and
# SIGXFSZ at start: put back for the child, as subprocess's restore_signals does.
_GUARD = f"""
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
for sig in {[int(s) for s in (*STOP_SIGNALS, signal.SIGPIPE, signal.SIGXFSZ)]}:
    signal.signal(sig, signal.SIG_DFL)
os.execv(sys.argv[2], sys.argv[3:])
"""
_PROGRAM_HEADERS = (b"\x7fELF", b"#!")


def guarded(argv: list[str]) -> list[str]:
    """`argv` to run as a child of this process: SIGKILL when this process goes, and
    STOP_SIGNALS at their defaults (about 13 ms more per start). Raises OSError, as exec
    would, when argv[0] is missing, not executable, or not a program."""
    program = shutil.which(argv[0])
    if program is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory (or not executable)", argv[0])
    with open(program, "rb") as f:
        if not f.read(4).startswith(_PROGRAM_HEADERS):
            raise OSError(errno.ENOEXEC, "Exec format error", program)
    # -I -S: no environment variables, user site or site module of the host's Python read.
    return [sys.executable, "-I", "-S", "-c", _GUARD, str(os.getpid()), program, *argv]


async def start(argv: list[str], **kwargs: Any) -> asyncio.subprocess.Process:
    """Start `argv` guarded, in its own session (see the module's docstring)."""
    return await asyncio.create_subprocess_exec(*guarded(argv), start_new_session=True, **kwargs)


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


def children(pid: int) -> set[int]:
    """The pids of `pid`'s children, from every thread's list (a thread that ends meanwhile has none)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            found |= {int(c) for c in (task / "children").read_text().split()}
    return found


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
