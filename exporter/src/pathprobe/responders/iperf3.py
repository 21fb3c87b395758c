"""The supervised iperf3 server that peers' throughput tests connect to."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import math
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .. import ends, iperf3, procs, sockdiag
from ..config import Iperf3Settings

log = logging.getLogger(__name__)

# A test's client address -> "ok", or the reason it may not test this host ("not_allowed",
# "out_of_turn"); counted as pathprobe_responder_requests_total{responder="iperf3"}.
Admit = Callable[[str], str]

# Restart back-off: doubles from the first to the last while the server keeps exiting;
# a server that ran this long counts as healthy again.
BACKOFF_FIRST, BACKOFF_LAST, HEALTHY_AFTER = 1.0, 60.0, 60.0
# How often the server's state is checked, and how long it may stay stopped before a restart.
WATCH_SECONDS, STOPPED_RESTART_SECONDS = 2.0, 30.0
# A wedged server is restarted (and counted with the reason) by this supervisor, whatever the
# iperf3 version does itself (3.20 adds --server-max-duration; Debian 13 ships 3.18, whose servers
# have been seen to stay busy after a client vanished mid-test, and to hang while writing their
# report, refusing every later client): a client this long in the handshake, or a test admitted this long ago
# whose client opened no data stream (3.12 waits for the parameters of a client that sent its cookie
# alone for as long as that client stays connected; 3.18 gives up after about 9 s, and resets the
# next client too), a test whose
# client has had no connection to the server this long, and a test older than its most
# (Iperf3Settings.max_test_seconds: no test of the schedule's may be longer than half a slot).
STALL_SECONDS, GONE_SECONDS = 10.0, 6.0
# Why a server was restarted (pathprobe_iperf3_server_restarts_total{reason}): it exited, it was
# stopped (SIGSTOP) too long, or the watchdog above found it wedged.
RESTART_REASONS = ("exited", "stopped", "stalled_client", "client_gone", "overran")


def server_command(settings: Iperf3Settings, listen: str, port: int | None = None) -> list[str]:
    """The command of the server on `port` (default: the first, iperf3.port)."""
    port = settings.port if port is None else port
    cmd = [settings.binary, "-s", "-p", str(port), "--idle-timeout", str(settings.idle_timeout_seconds)]
    if settings.max_test_seconds and iperf3.has_option(settings.binary, MAX_DURATION_OPTION):
        cmd += [MAX_DURATION_OPTION, str(int(settings.max_test_seconds))]
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
            "--rsa-private-key-path",
            str(settings.auth.private_key_file),
            "--authorized-users-path",
            str(settings.auth.authorized_users_file),
            *iperf3.server_options(settings.binary, settings.auth.legacy_rsa_padding),
        ]
    return cmd


MAX_DURATION_OPTION = "--server-max-duration"


async def watch(proc: asyncio.subprocess.Process, up: Callable[[bool], None],
                wedged: Callable[[], str | None] = lambda: None) -> tuple[int, str]:  # fmt: skip
    """Wait for the server to exit: its exit status, and why (RESTART_REASONS). A stopped server
    (SIGSTOP) accepts connections in the kernel yet serves none: it is reported down at once and
    killed (so restarted) after STOPPED_RESTART_SECONDS; a server that `wedged()` says is wedged
    is killed at once."""
    stopped_since: float | None = None
    reason = "exited"
    while True:
        try:
            async with asyncio.timeout(WATCH_SECONDS):
                return await proc.wait(), reason
        except TimeoutError:
            pass
        if not procs.stopped(proc.pid):
            if stopped_since is not None:
                log.warning("iperf3 server (pid %d) runs again", proc.pid)
                stopped_since = None
                up(True)
            found = wedged()
            if found is not None and reason == "exited":
                log.warning("iperf3 server (pid %d) is wedged (%s): restarting it", proc.pid, found)
                reason = found
                procs.kill_group(proc.pid)
            continue
        if stopped_since is None:
            log.warning("iperf3 server (pid %d) is stopped: peers' tests cannot run", proc.pid)
            stopped_since = time.monotonic()
            up(False)
        elif time.monotonic() - stopped_since > STOPPED_RESTART_SECONDS and reason == "exited":
            log.warning("iperf3 server (pid %d) stopped for %g s: restarting it", proc.pid, STOPPED_RESTART_SECONDS)
            reason = "stopped"
            procs.kill_group(proc.pid)


async def _tail(stream: asyncio.StreamReader, keep: int = 4096) -> bytes:
    """A pipe read to its end, keeping its last `keep` bytes: a server whose stderr nobody
    reads blocks on its next message (iperf3 -s writes one per aborted client)."""
    tail = b""
    while chunk := await stream.read(2**16):
        tail = (tail + chunk)[-keep:]
    return tail


def _remotes(port: int, state: int) -> list[sockdiag.Address]:
    """The remote addresses of this network namespace's TCP sockets on local `port` in `state`
    (sockdiag.TCP_LISTEN, TCP_ESTABLISHED): read-only, where a probing bind or connect would race
    the server or hold its one test. From sock_diag, the kernel filtering by port; from
    /proc/net/tcp (all of the host's sockets) where netlink is refused."""
    with contextlib.suppress(OSError):
        return sockdiag.remotes_on_port(port, 1 << state)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for row in rows:
            _, local, remote, st, *_ = row.split()
            if int(st, 16) == state and int(local.rsplit(":", 1)[1], 16) == port:
                found.append(_proc_address(remote.rsplit(":", 1)[0]))
    return found


def _proc_address(hex_address: str) -> sockdiag.Address:
    """An address as /proc/net/tcp writes it: each 32-bit word in the host's byte order; an
    IPv4-mapped one as IPv4."""
    packed = bytes.fromhex(hex_address)
    if sys.byteorder == "little":
        packed = b"".join(packed[i : i + 4][::-1] for i in range(0, len(packed), 4))
    ip = ipaddress.ip_address(packed)
    return (ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else ip


def listening(port: int) -> bool:
    """Whether a TCP socket of this network namespace listens on `port`."""
    return bool(_remotes(port, sockdiag.TCP_LISTEN))


def connected(port: int, client: str) -> bool:
    """Whether `client` has a TCP connection established to local `port`."""
    try:
        ip = ipaddress.ip_address(client.split("%", 1)[0])  # a link-local's scope: the kernel's address has none
    except ValueError:
        return True  # an address iperf3 printed that is not one: never taken for a client gone
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip in _remotes(port, sockdiag.TCP_ESTABLISHED)


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
# One line per data stream of the test, as it connects: the server's port.
STREAM = re.compile(rb"^\[\s*\d+\] local \S+ port (\d+) connected to ")
# A served test's end is kept this long for its client to ask for (its prober asks right after the
# test), for at most this many clients.
REPORT_KEEP_SECONDS, REPORTS_KEPT = 60.0, 256


def client_address(address: str) -> str:
    """A client's address as both iperf3 and a socket on "::" may print an IPv4 one (mapped)."""
    return address.removeprefix("::ffff:")


@dataclass
class _Test:
    """A test this host's servers run for one client: its processes and its end's figures."""

    client: str
    watch: ends.EndWatch
    pids: set[int]
    sampler: asyncio.Task[None]
    began: float = field(default_factory=time.monotonic)
    ports: dict[int, int] = field(default_factory=dict)  # pid -> its port, once a data stream connected
    gone_since: float | None = None  # since when the client has had no connection to the server
    done: asyncio.Event = field(default_factory=asyncio.Event)


class ServedTests:
    """The tests this host's iperf3 servers run for peers: whether one runs (`serving` is told), and
    this host's end of each (ends.EndWatch, sampled every ends.SAMPLE_SECONDS while it runs), kept
    by client address for that client's report request on the rr port (wire.py): a test's receiver
    is often the peer's server, and only its host can tell what its iperf3 used."""

    def __init__(
        self,
        version: str | None,
        ports: list[int],
        serving: Callable[[bool], None] = lambda _: None,
        max_test_seconds: float = math.inf,
    ):
        self.version, self.ports, self._serving, self.max_test_seconds = version, ports, serving, max_test_seconds
        self._running: dict[str, _Test] = {}
        self._ended: OrderedDict[str, tuple[float, ends.EndFigures]] = OrderedDict()

    def began(self, client: str, pid: int) -> None:
        """A server process admitted `client`'s test (one of its processes' share of it)."""
        self._serving(True)
        client = client_address(client)
        test = self._running.get(client)
        if test is not None:
            test.pids.add(pid)
            test.watch.pids.append(pid)
            return
        watch = ends.EndWatch(streams=0, version=self.version)
        watch.start([pid])
        sampler = asyncio.create_task(watch.sample_until_cancelled(), name=f"served-{client}")
        self._running[client] = _Test(client, watch, {pid}, sampler)

    def stream(self, pid: int, port: int) -> None:
        """A data stream of the test on server `pid` (listening on `port`) connected."""
        for test in self._running.values():
            if pid in test.pids:
                test.watch.streams += 1
                test.ports[pid] = port

    def wedged(self, pid: int) -> str | None:
        """Why server `pid` is wedged in its test (a RESTART_REASONS' watchdog reason), or None;
        also None where it runs no test."""
        test = self._test_of(pid)
        if test is None:
            return None
        now = time.monotonic()
        if now - test.began > self.max_test_seconds:
            return "overran"
        port = test.ports.get(pid)
        if port is None:
            return "stalled_client" if now - test.began > STALL_SECONDS else None
        if connected(port, test.client):
            test.gone_since = None
            return None
        test.gone_since = test.gone_since or now
        return "client_gone" if now - test.gone_since > GONE_SECONDS else None

    def testing(self, pid: int) -> bool:
        """Whether server `pid` runs an admitted test."""
        return self._test_of(pid) is not None

    def _test_of(self, pid: int) -> _Test | None:
        return next((t for t in self._running.values() if pid in t.pids), None)

    def ended(self, pid: int) -> None:
        """Server `pid` is done with its test (ready for the next, or gone)."""
        for client, test in list(self._running.items()):
            test.pids.discard(pid)
            if test.pids:
                continue
            test.sampler.cancel()
            test.watch.stop()
            del self._running[client]
            self._ended[client] = (time.monotonic(), test.watch.figures())
            self._ended.move_to_end(client)
            while len(self._ended) > REPORTS_KEPT:
                self._ended.popitem(last=False)
            test.done.set()
        self._serving(bool(self._running))

    async def report(self, client: str, wait: float) -> dict[str, Any]:
        """What `client` may know of its last test here (wire.py's report): after its running
        test ends, waiting at most `wait` seconds; a test still running then (its client has ended
        it, but a server short of CPU is slow to say so) reports its figures so far."""
        client = client_address(client)
        test = self._running.get(client)
        if test is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await test.done.wait()
        served = {"version": self.version, "ports": self.ports}
        running = self._running.get(client)
        if running is not None:
            running.watch.stop()  # its figures so far; the test's own end reads them again
            return {"iperf3": served, "end": running.watch.figures().to_json(), "ended_seconds_ago": 0.0}
        kept = self._ended.get(client)
        fresh = kept is not None and time.monotonic() - kept[0] <= REPORT_KEEP_SECONDS
        return {
            "iperf3": served,
            "end": kept[1].to_json() if kept is not None and fresh else None,
            "ended_seconds_ago": time.monotonic() - kept[0] if kept is not None and fresh else None,
        }


async def _admit(stdout: asyncio.StreamReader | None, admit: Admit | None, pid: int, served: ServedTests) -> str | None:
    """Read the server's output to its end; on a test that `admit` refuses, kill the server
    (the test dies with it, within milliseconds of its start) and return the refusal. `served`
    follows each admitted test from its start to its end."""
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
            served.ended(pid)
        stream = STREAM.match(line)
        if stream is not None:
            served.stream(pid, int(stream.group(1)))
        accepted = ACCEPTED.match(line)
        if accepted is None:
            continue
        address = accepted.group(1).decode(errors="replace")
        result = admit(address)
        if result == "ok":
            served.began(address, pid)
        else:
            log.warning("iperf3 test from %s refused (%s): the server is cut and restarted", address, result)
            procs.kill_group(pid)
            await _tail(stdout)
            return result


class Server(NamedTuple):
    """One supervised server: its command, and the port it listens on."""

    command: list[str]
    port: int


class _Handshakes:
    """A client held in the handshake: iperf3 admits a test (prints "Accepted connection") only
    once its client has sent its parameters, and until then serves no one else (3.12 for as long
    as that client stays connected). A connection to the server's port while it runs no admitted
    test is one, once it has lasted STALL_SECONDS."""

    def __init__(self, port: int):
        self.port = port
        self.since: float | None = None

    def stalled(self, testing: bool) -> bool:
        if testing or not _remotes(self.port, sockdiag.TCP_ESTABLISHED):
            self.since = None
            return False
        now = time.monotonic()
        self.since = self.since or now
        return now - self.since > STALL_SECONDS


async def supervise(
    server: Server,
    up: Callable[[bool], None],
    restarted: Callable[[str], None],
    admit: Admit | None = None,
    served: ServedTests | None = None,
) -> None:
    """Keep an iperf3 server running until cancelled; then stop its process group.
    The server dies with this process (PR_SET_PDEATHSIG), even on SIGKILL. With `admit`,
    every test's client address is checked as it connects (a refused one is cut at once), and
    `served` follows each admitted test; a server wedged in a test or a handshake is restarted."""
    served = served or ServedTests(None, [])
    command = server.command
    backoff = BACKOFF_FIRST
    output = asyncio.subprocess.DEVNULL if admit is None else asyncio.subprocess.PIPE
    while True:
        started = time.monotonic()
        try:
            proc = await procs.start(
                command, stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            log.error("cannot start iperf3 server (%s): %s", " ".join(command[:3]), exc)
            up(False)
            await asyncio.sleep(max(backoff, 10.0))
            continue
        up(True)
        try:
            assert proc.stderr is not None
            wedged = functools.partial(_wedged, served, proc.pid, _Handshakes(server.port))
            err, (rc, reason), refused = await asyncio.gather(
                _tail(proc.stderr), watch(proc, up, wedged), _admit(proc.stdout, admit, proc.pid, served)
            )
        except asyncio.CancelledError:
            await procs.stop_group(proc)
            up(False)
            served.ended(proc.pid)
            raise
        up(False)
        served.ended(proc.pid)
        if refused is not None:
            continue  # cut on purpose: back at once, no back-off, not a failure
        restarted(reason)
        if time.monotonic() - started > HEALTHY_AFTER or reason != "exited":
            backoff = BACKOFF_FIRST  # a wedged server was healthy until it wedged
        log.warning(
            "iperf3 server exited with %s (%s): %s; restarting in %g s",
            rc,
            reason,
            err.decode(errors="replace").strip()[-300:],
            backoff,
        )
        await asyncio.sleep(backoff)
        backoff = min(BACKOFF_LAST, backoff * 2)


def _wedged(served: ServedTests, pid: int, handshakes: _Handshakes) -> str | None:
    """Why server `pid` is wedged: in its test (ServedTests.wedged), or in a handshake."""
    return served.wedged(pid) or ("stalled_client" if handshakes.stalled(served.testing(pid)) else None)
