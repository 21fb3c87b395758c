"""The always-on side of a host: iperf3 server (supervised), TCP RR and UDP echo."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from .allow import AllowList
from .config import Iperf3Settings, Responders
from .echo import EchoResponder
from .rr import RrResponder, RrServer

log = logging.getLogger(__name__)

Count = Callable[[str, str], None]  # (responder, result)


def iperf3_server_command(settings: Iperf3Settings, listen: str) -> list[str]:
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


async def supervise_iperf3(
    command: list[str], up: Callable[[bool], None], restarted: Callable[[], None], backoff: float = 1.0
) -> None:
    """Keep an iperf3 server running until cancelled; then stop its process group."""
    while True:
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            log.error("cannot start iperf3 server %s: %s", command[0], exc)
            up(False)
            await asyncio.sleep(max(backoff, 10.0))
            continue
        up(True)
        try:
            assert proc.stderr is not None
            err = await proc.stderr.read()
            rc = await proc.wait()
        except asyncio.CancelledError:
            await stop_group(proc)
            up(False)
            raise
        up(False)
        restarted()
        log.warning("iperf3 server exited with %s: %s; restarting", rc, err.decode(errors="replace").strip()[-300:])
        await asyncio.sleep(backoff)


async def stop_group(proc: asyncio.subprocess.Process, grace: float = 2.0) -> None:
    """SIGTERM the process group, SIGKILL it after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            async with asyncio.timeout(grace):
                await proc.wait()
            return
        except TimeoutError:
            continue


@dataclass
class Running:
    rr: RrServer
    echo: asyncio.DatagramTransport

    def close(self) -> None:
        self.rr.close()
        self.echo.close()


async def start_rr_and_echo(settings: Responders, allow: AllowList, count: Count) -> Running:
    listen = str(settings.listen)
    rr = RrResponder(allow, settings.rr_max_connections_per_source, lambda result: count("rr", result))
    echo = EchoResponder(allow, settings.echo_max_pps_per_source, lambda result: count("echo", result))
    rr_server = await rr.start(listen, settings.rr_port)
    echo_transport = await echo.start(listen, settings.echo_port)
    log.info(
        "responders on %s: tcp rr :%d, udp echo :%d; allowed %s", listen, settings.rr_port, settings.echo_port, allow
    )
    return Running(rr_server, echo_transport)
