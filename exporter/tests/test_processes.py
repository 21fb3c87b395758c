"""Real `pathprobe serve` processes on loopback: no child outlives it, and a taken port
is a clear error instead of a restart loop."""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pathprobe import procs

SERVE = [sys.executable, "-m", "pathprobe", "serve", "--listen", "127.0.0.1"]


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def start(ports: tuple[int, int]) -> subprocess.Popen[str]:
    rr, iperf3 = ports
    proc = subprocess.Popen(
        [*SERVE, "--rr-port", str(rr), "--echo-port", str(rr), "--iperf3-port", str(iperf3)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc


@pytest.fixture
def ports() -> tuple[int, int]:
    base = 20000 + os.getpid() % 20000
    return base, base + 1


def test_the_iperf3_server_dies_with_a_killed_serve(ports: tuple[int, int]) -> None:
    proc = start(ports)
    try:
        assert proc.stdout is not None and "answering" in proc.stdout.readline()  # ready
        deadline = time.monotonic() + 10
        while not (kids := children(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert kids, "no iperf3 server started"
        # Killed as soon as the child exists: before or after it has exec'd iperf3, it must go.
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while any(procs.alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(procs.alive(k) for k in kids), "iperf3 outlived its parent"
    finally:
        proc.kill()
        proc.wait()
    again = start(ports)  # the ports are free again at once
    try:
        assert again.stdout is not None and "answering" in again.stdout.readline()
    finally:
        again.terminate()
        again.wait(timeout=10)


def test_a_second_serve_on_the_same_ports_fails_clearly(ports: tuple[int, int]) -> None:
    first = start(ports)
    try:
        assert first.stdout is not None and "answering" in first.stdout.readline()
        second = start(ports)
        _, err = second.communicate(timeout=20)
        assert second.returncode != 0
        assert "cannot listen on 127.0.0.1" in err and "Traceback" not in err
    finally:
        first.terminate()
        first.wait(timeout=10)


def test_a_stopped_iperf3_server_is_reported_down_then_restarted(
    ports: tuple[int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathprobe.config import Iperf3Settings
    from pathprobe.responders import iperf3

    monkeypatch.setattr(iperf3, "WATCH_SECONDS", 0.1)
    monkeypatch.setattr(iperf3, "STOPPED_RESTART_SECONDS", 1.0)
    pidfile = tmp_path / "iperf3.pid"
    command = [*iperf3.server_command(Iperf3Settings(port=ports[1]), "127.0.0.1"), "-I", str(pidfile)]
    states: list[bool] = []
    restarts: list[int] = []

    async def drill() -> None:
        task = asyncio.create_task(iperf3.supervise(command, states.append, lambda: restarts.append(1)))
        try:
            async with asyncio.timeout(30):
                while not pidfile.exists() or not pidfile.read_text().strip("\0\n"):
                    await asyncio.sleep(0.05)
                first = int(pidfile.read_text().strip("\0\n"))
                os.kill(first, signal.SIGSTOP)
                while states[-1]:  # reported down while stopped
                    await asyncio.sleep(0.05)
                while not restarts or not states[-1]:  # killed and started again
                    await asyncio.sleep(0.05)
                assert not procs.alive(first)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(drill())
    assert states[:2] == [True, False] and states[-1] is False  # up, stopped: down, ..., cancelled: down
    assert restarts == [1]
