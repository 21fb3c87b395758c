"""Real `pathprobe serve` processes on loopback: no child outlives it, and a taken port
is a clear error instead of a restart loop."""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopback_mesh import unused_port

from pathprobe import procs, wire
from pathprobe.responders.iperf3 import listening, wait_listening

SERVE = [sys.executable, "-m", "pathprobe", "serve", "--listen", "127.0.0.1"]


def start(ports: tuple[int, int]) -> subprocess.Popen[str]:
    rr, iperf3 = ports
    proc = subprocess.Popen(
        [*SERVE, "--rr-port", str(rr), "--echo-port", str(rr), "--iperf3-port", str(iperf3)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc


@pytest.fixture
def ports() -> tuple[int, int]:
    """(the RR and echo port, the iperf3 port): below the ephemeral range, where no other test's
    socket can take them meanwhile (one run found 20000 + its pid % 20000, in that range, taken)."""
    rr = unused_port()
    while (iperf3 := unused_port()) == rr:
        pass
    return rr, iperf3


def test_the_iperf3_server_dies_with_a_killed_serve(ports: tuple[int, int]) -> None:
    proc = start(ports)
    try:
        assert proc.stdout is not None and "answering" in proc.stdout.readline()  # ready
        deadline = time.monotonic() + 10
        while not (kids := procs.children(proc.pid)) and time.monotonic() < deadline:
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


def test_serve_says_ready_once_its_iperf3_server_listens(ports: tuple[int, int]) -> None:
    """A client that connects as soon as `serve` says "ready" finds iperf3 there (before, a lab
    test's stranger once found the port closed: iperf3 starts in a process of its own)."""
    proc = start(ports)
    try:
        assert proc.stdout is not None and "answering" in proc.stdout.readline()  # ready
        assert listening(ports[1])
        socket.create_connection(("127.0.0.1", ports[1]), timeout=2).close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert not listening(ports[1])


def test_waiting_for_a_server_ends_when_it_is_down_or_late(ports: tuple[int, int]) -> None:
    started = time.monotonic()
    assert not asyncio.run(wait_listening(ports[1], 60, down=lambda: True))
    assert time.monotonic() - started < 30  # at once, not at the timeout (half of it: a busy machine is not late)
    assert not asyncio.run(wait_listening(ports[1], 0.05, down=lambda: False))
    with socket.create_server(("127.0.0.1", ports[1])):
        assert asyncio.run(wait_listening(ports[1], 5, down=lambda: False))


def test_serve_states_its_clock_error_bound_in_every_echo_answer(ports: tuple[int, int]) -> None:
    """Peers trust one-way delays to a responder only with its clock error bound: `serve` states
    the one it is given (or reads chronyd's or ClockBound's) in each answer."""
    rr, iperf3 = ports
    proc = subprocess.Popen(
        [
            *SERVE,
            "--rr-port",
            str(rr),
            "--echo-port",
            str(rr),
            "--iperf3-port",
            str(iperf3),
            "--clock-error-bound",
            "2us",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "clock error bound 2 us (stated)" in proc.stdout.readline()  # ready
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(5)
            sock.sendto(wire.echo_packet(1, 64, time.time_ns()), ("127.0.0.1", rr))
            answer = sock.recv(2048)
        (bound_ns,) = wire.ECHO_BOUND.unpack_from(answer, wire.ECHO_BOUND_OFFSET)
        assert answer[:4] == wire.ECHO_MAGIC and bound_ns == 2000
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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
    restarts: list[str] = []

    async def drill() -> None:
        task = asyncio.create_task(iperf3.supervise(iperf3.Server(command, ports[1]), states.append, restarts.append))
        try:
            async with asyncio.timeout(30):
                # Up, as the supervisor reports it (iperf3 writes its pid file before the supervisor's
                # next look: a stop before that look would make its first report a down one).
                while not (states and states[-1]) or not pidfile.exists() or not pidfile.read_text().strip("\0\n"):
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
    assert restarts == ["stopped"]


def fake_iperf3(tmp_path: Path, script: str) -> str:
    binary = tmp_path / "iperf3"
    binary.write_text(f"#!/bin/sh\n{script}\n")
    binary.chmod(0o755)
    return str(binary)


@pytest.mark.parametrize(
    ("script", "reason", "margin"),
    [
        # Prints without end: more than the output bound, before the test's time is up (32 MiB read by a
        # test process at nice 19 beside three labs took more than 2 s once).
        ("exec yes", "error", 15),
        ("head -c 300000 /dev/zero; exec sleep 60", "timeout", 1),  # prints, then hangs with its pipe unread
        ("exec sleep 60", "timeout", 1),
    ],
)
def test_a_runaway_iperf3_client_ends_the_test_and_leaves_nothing(
    tmp_path: Path, script: str, reason: str, margin: float
) -> None:
    from pathprobe.probes import ProbeFailure, Target, ThroughputProber, ThroughputTest

    binary = fake_iperf3(tmp_path, script)
    test = ThroughputTest(duration_seconds=1, omit_seconds=0, binary=binary, margin_seconds=margin)
    prober = ThroughputProber(Target("127.0.0.1", 5201), test)

    async def once() -> ProbeFailure:
        async with asyncio.timeout(test.max_seconds() + 18):  # the old code never returned from the first two
            try:
                await prober.measure()
            except ProbeFailure as exc:
                return exc
        raise AssertionError("a result from a fake iperf3")

    started = time.monotonic()
    failure = asyncio.run(once())
    assert failure.reason == reason, failure
    assert time.monotonic() - started < test.max_seconds() + 8  # killed at its time, or once past the bound
    assert not procs.children(os.getpid())


def test_a_test_is_killed_at_its_turns_end_however_long_it_may_run(tmp_path: Path) -> None:
    """A scheduled test that started late is cut where its turn ends, not its own length after it
    started: the next half's test may begin then (a lab's ran 0.13 s into it)."""
    from pathprobe.probes import ProbeFailure, Target, ThroughputProber, ThroughputTest

    binary = fake_iperf3(tmp_path, "exec sleep 60")
    kill_at = time.monotonic() + 1.0
    test = ThroughputTest(duration_seconds=5, omit_seconds=0, binary=binary, margin_seconds=5, kill_at=kill_at)
    with pytest.raises(ProbeFailure, match="did not finish by its turn's end") as failed:
        asyncio.run(ThroughputProber(Target("127.0.0.1", 5201), test).measure())
    assert failed.value.reason == "timeout"
    # Its processes are gone by then (the kill and reaping take a few ms; 10 s is what it would have run).
    assert time.monotonic() - kill_at < 5
    assert not procs.children(os.getpid())


def test_a_server_that_writes_much_to_stderr_is_never_blocked(tmp_path: Path) -> None:
    from pathprobe.responders import iperf3

    # iperf3 -s writes a line per aborted client; 400 kB is a few thousand of them.
    done = tmp_path / "done"
    command = ["sh", "-c", f"head -c 400000 /dev/zero >&2; touch {done}; exec sleep 60"]
    states: list[bool] = []

    async def run() -> None:
        task = asyncio.create_task(iperf3.supervise(iperf3.Server(command, 0), states.append, lambda _: None))
        try:
            async with asyncio.timeout(10):
                while not done.exists():
                    await asyncio.sleep(0.05)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(run())
    assert states[0] is True


def test_a_taken_metrics_port_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    import yaml

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = tmp_path / "pathprobe.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "host": {"name": "a", "address": "127.0.0.1", "region": "r1"},
                    "peers": [{"name": "b", "address": "127.0.0.2", "region": "r2", "path_class": "inter_region"}],
                    "web": {"listen": f"127.0.0.1:{port}"},
                    "budget": {"state_file": str(tmp_path / "budget.json")},
                }
            )
        )
        run = subprocess.run(
            [sys.executable, "-m", "pathprobe", "run", "--config", str(cfg)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert run.returncode == 1, run.stderr
    assert f"cannot serve /metrics on 127.0.0.1:{port}" in run.stderr and "Traceback" not in run.stderr, run.stderr


def iperf3_client(port: int, source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-B", source, "-t", "1", "-J"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_strangers_iperf3_test_is_cut_and_counted_and_a_peers_runs(ports: tuple[int, int]) -> None:
    # Found by an attack run: `serve --allow 127.0.0.1/32`, a test from 127.0.0.2 ran at 19 Gbit/s.
    rr, port = ports
    proc = subprocess.Popen(
        [*SERVE, "--allow", "127.0.0.1/32", "--rr-port", str(rr), "--echo-port", str(rr), "--iperf3-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and "answering" in proc.stdout.readline()  # ready: iperf3 listens
        # iperf3 3.12 exits 0 with -J whatever happened: its JSON says.
        stranger = json.loads(iperf3_client(port, "127.0.0.2").stdout)
        assert "error" in stranger and not stranger["intervals"], stranger  # cut before any data interval
        for _ in range(50):  # the server is back at once (no back-off): a peer's test runs
            peer = json.loads(iperf3_client(port, "127.0.0.1").stdout)
            if "error" not in peer:
                break
            time.sleep(0.1)
        assert "error" not in peer and peer["end"]["sum_received"]["bytes"] > 0, peer
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    assert "iperf3 not_allowed=1" in out and "iperf3 ok=1" in out, out + err
    assert "iperf3 test from 127.0.0.2 refused (not_allowed)" in err, err


def test_a_missing_iperf3_binary_leaves_the_other_responders_answering(ports: tuple[int, int]) -> None:
    rr, port = ports
    proc = subprocess.Popen(
        [
            *SERVE,
            "--iperf3",
            "/nonexistent/iperf3",
            "--rr-port",
            str(rr),
            "--echo-port",
            str(rr),
            "--iperf3-port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and "answering" in proc.stdout.readline()  # ready
        probe = [sys.executable, "-m", "pathprobe", "probe", "rtt", "127.0.0.1", "--port", str(rr), "-c", "3"]
        rtt = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
        assert rtt.returncode == 0, rtt.stderr
        assert proc.poll() is None  # still serving
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    # Said, with the binary named, and retried with a back-off (no restart loop at full speed).
    assert "/nonexistent/iperf3" in err and "restarting in" in err, err
    assert "Traceback" not in err


CHILD_OF_AN_IGNORING_PARENT = """
import os, subprocess, threading
from pathprobe import procs, wire
def spawn():  # from a thread, as the exporter's probes do
    subprocess.run(procs.guarded(["grep", "SigIgn", "/proc/self/status"]), start_new_session=True, check=True)
print(open("/proc/self/status").read().split("SigIgn:")[1].split()[0])
t = threading.Thread(target=spawn)
t.start()
t.join()
"""


def test_a_child_stops_on_sigint_even_when_pathprobe_was_started_with_it_ignored() -> None:
    # A shell's `cmd &` without job control starts cmd with SIGINT and SIGQUIT ignored.
    out = subprocess.run(
        ["sh", "-c", 'trap "" HUP INT QUIT; exec "$0" -c "$1"', sys.executable, CHILD_OF_AN_IGNORING_PARENT],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    parent, child = out.split("\n")[0], out.split("SigIgn:")[1].split()[0]
    stop_mask = sum(1 << (int(s) - 1) for s in procs.STOP_SIGNALS)
    assert int(parent, 16) & stop_mask == 0b111  # HUP, INT, QUIT ignored in pathprobe
    assert int(child, 16) & stop_mask == 0, (parent, child)


def test_a_guarded_child_runs_only_while_the_process_that_started_it_does(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    argv = procs.guarded(["touch", str(ran)])
    assert subprocess.run(argv, check=False).returncode == 0 and ran.exists()
    ran.unlink()
    # Run from a grandchild: its parent is not the process that asked (as if that one had died).
    late = subprocess.run(["sh", "-c", '"$@"; exit $?', "sh", *argv], check=False)
    assert late.returncode == 1 and not ran.exists()


def test_a_guarded_child_that_cannot_run_is_an_oserror_before_any_fork(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="/nonexistent/iperf3"):
        procs.guarded(["/nonexistent/iperf3", "-s"])
    text = tmp_path / "iperf3"
    text.write_text("echo a shell would run this\n")
    text.chmod(0o755)
    with pytest.raises(OSError, match="Exec format error") as err:
        procs.guarded([str(text)])
    assert err.value.errno == 8  # ENOEXEC, as exec reports it
