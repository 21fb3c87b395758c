"""`pathprobe run` (the exporter) and `pathprobe check-config`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from .. import __version__, config, iperf3, limits, listeners, responders, sighup, webconfig
from ..exporter import Exporter, epoch_too_far_ahead, host_max_mtu
from ..metrics import registry
from ..reloads import Reloads
from ..web import MetricsServer, raise_fd_limit, serve
from ..web.app import Reload
from ..webconfig import WebConfigSource
from ..yamlfile import ConfigError
from .common import EXIT_BAD_INPUT, EXIT_PROBE_FAILED, stop_on_signals

log = logging.getLogger("pathprobe")


def add_parser(sub: Any) -> None:
    c = sub.add_parser("check-config", help="validate a config file (exit 2 listing every error)")
    c.add_argument("file", help="the exporter's config file")
    c.add_argument(
        "--free-ports",
        action="store_true",
        help="also check that no other program holds the ports the exporter will listen on "
        "(before it is started: a running exporter holds them itself)",
    )
    c.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="the web config file to check instead of the config's web.config_file",
    )
    c.set_defaults(func=cmd_check_config)
    w = sub.add_parser(
        "check-web-config",
        help="validate a web config file of /metrics alone (exit 2 listing "
        "every error), as promtool check web-config does",
    )
    w.add_argument("file", type=Path, help="the web config file")
    w.set_defaults(func=cmd_check_web_config)
    r = sub.add_parser("run", help="the exporter: responders, scheduled probes, /metrics")
    r.add_argument("--config", required=True, metavar="FILE", help="the exporter's config file (docs/configuration.md)")
    where = r.add_mutually_exclusive_group()
    where.add_argument(
        "--web.listen-address",
        dest="web_listen_addresses",
        action="append",
        type=listen_address,
        metavar="[HOST]:PORT",
        help="an address to serve /metrics on, e.g. :9469 or [::1]:9469 (repeatable); instead of the config's "
        "web.listen",
    )
    where.add_argument(
        "--web.systemd-socket",
        dest="web_systemd_socket",
        action="store_true",
        help="serve /metrics on the sockets systemd passes (a .socket unit's ListenStream=), not on an address",
    )
    r.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS and basic auth of /metrics, in exporter-toolkit's web config format (read again on "
        "a reload and when it or a file it names changes); default: the config's "
        "web.config_file",
    )
    r.set_defaults(func=cmd_run)


def listen_address(text: str) -> str:
    """A --web.listen-address, checked as the config's web.listen is."""
    try:
        return config.WebSettings(listen=text).listen
    except ValueError as exc:  # pydantic's ValidationError
        raise argparse.ArgumentTypeError(
            f"{text!r} is not [HOST]:PORT (e.g. :9469, 127.0.0.1:9469, [::1]:9469)"
        ) from exc


def metrics_sockets(args: argparse.Namespace, web: config.WebSettings) -> tuple[list[socket.socket], str]:
    """The sockets /metrics is served on and where they are, in words: systemd's, the
    --web.listen-address ones, else the config's web.listen. A ListenError says why not."""
    if args.web_systemd_socket:
        sockets = listeners.systemd_sockets()
        return sockets, "systemd's sockets " + ", ".join(_where(s) for s in sockets)
    addresses = args.web_listen_addresses or [web.listen]
    sockets = []
    try:
        for address in addresses:
            sockets.append(listeners.bind(address))
    except OSError as exc:
        for bound in sockets:
            bound.close()
        raise listeners.ListenError(f"cannot serve /metrics on {address}: {exc.strerror or exc}") from exc
    return sockets, ", ".join(addresses)


def serve_metrics(
    args: argparse.Namespace, web: config.WebSettings, exporter: Exporter, access: WebConfigSource, reload: Reload
) -> tuple[MetricsServer, str]:
    """/metrics served, and where; a ListenError says why not."""
    sockets, where = metrics_sockets(args, web)
    try:
        server = serve(
            web,
            registry(exporter.rooms),
            reload=reload,
            ready=exporter.unready,
            web_config=access,
            listeners=sockets,
            evidence=exporter.evidence,
        )
    except OSError as exc:  # an unusable certificate (ssl.SSLError)
        raise listeners.ListenError(f"cannot serve /metrics on {where}: {exc}") from exc
    return server, where


def _where(sock: socket.socket) -> str:
    name = sock.getsockname()
    return f"[{name[0]}]:{name[1]}" if sock.family == socket.AF_INET6 else f"{name[0]}:{name[1]}"


def web_config_file(args: argparse.Namespace, cfg: config.Config) -> Path | None:
    """The web config file in force: --web.config.file, else the config's web.config_file."""
    if args.web_config_file is None:
        return cfg.web.config_file
    return Path(args.web_config_file) if args.web_config_file else None  # "": none, as the toolkit's flag


def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = config.load(args.file, check_files=True)
    found = [*limits.unknown_instance_types(cfg), *host_problems(cfg)]
    # A warning, not an error: the unit's ExecStartPre runs this too, and a host whose clock is a
    # day behind at boot would otherwise lose its RTT and loss monitoring with its tests.
    if (epoch := epoch_too_far_ahead(cfg, time.time())) is not None:
        print(f"{args.file}: warning: {epoch}", file=sys.stderr)
    if args.free_ports:
        found += responders.held_ports(cfg)
    problems = [f"{args.file}: {p}" for p in found]
    if (web := web_config_file(args, cfg)) is not None:
        try:
            webconfig.load(web)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return EXIT_BAD_INPUT
    print(
        f"{args.file}: ok ({cfg.host.name}, {len(cfg.peers)} peers; probes {len(cfg.rtt_peers)} for RTT, "
        f"{len(cfg.throughput_peers)} for throughput)"
    )
    return 0


def cmd_check_web_config(args: argparse.Namespace) -> int:
    access = webconfig.load(args.file)  # a ConfigError lists the problems, exit 2
    users = ", ".join(sorted(access.users)) or "none"
    print(f"{args.file}: ok ({'TLS' if access.ssl_context else 'plain HTTP'}; basic auth users: {users})")
    return 0


def host_problems(cfg: config.Config) -> list[str]:
    """What this host cannot do of a valid config (check-config runs where the exporter will)."""
    problems = []
    ports = local_port_range()
    for probe in ("rtt", "loss"):
        flows = getattr(cfg.probes, probe).flows
        if ports is not None and flows * (len(cfg.rtt_peers) + 1) > ports:
            problems.append(
                f"probes.{probe}.flows: {flows} flows to each of {len(cfg.rtt_peers)} peers need more "
                f"source ports than this host's ip_local_port_range has ({ports})"
            )
    if shutil.which(cfg.iperf3.binary) is None:
        problems.append(
            f"iperf3.binary: {cfg.iperf3.binary!r} is not an executable on this host's PATH "
            "(peers' tests against this host and its own would fail)"
        )
    mtu = host_max_mtu()
    for i, size in enumerate(cfg.probes.mtu.sizes or []):
        if mtu is not None and size > mtu:
            problems.append(f"probes.mtu.sizes.{i}: {size} is larger than any interface MTU of this host ({mtu})")
    return problems


def local_port_range() -> int | None:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return None
    return high - low + 1


def notify_systemd(state: str) -> None:
    """sd_notify(3) for Type=notify units: a datagram to $NOTIFY_SOCKET (absent: not under systemd)."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    address = "\0" + path[1:] if path.startswith("@") else path  # "@": an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(state.encode(), address)
    except OSError as exc:
        log.warning("cannot tell systemd %s: %s", state, exc)


# How long POST /-/reload waits for a reload to be applied.
RELOAD_WAIT_SECONDS = 30.0


def cmd_run(args: argparse.Namespace) -> int:
    cfg = config.load(args.config, check_files=True)
    if (epoch := epoch_too_far_ahead(cfg, time.time())) is not None:
        log.warning("%s: %s", args.config, epoch)  # runs on: RTT, loss and the responders are not held back
    web_config = WebConfigSource(web_config_file(args, cfg))  # a bad file: ConfigError, exit 2
    exporter = Exporter(cfg)
    running: list[asyncio.AbstractEventLoop] = []

    def reload_from_web() -> str | None:  # on a web thread: the reload is asked for on the loop
        if not running:
            return "the exporter is still starting"

        async def on_loop() -> str | None:
            return await reloads.request()

        return asyncio.run_coroutine_threadsafe(on_loop(), running[0]).result(RELOAD_WAIT_SECONDS)

    raise_fd_limit()  # before any connection: /metrics' cap on connections follows it
    try:
        server, where = serve_metrics(args, cfg.web, exporter, web_config, reload_from_web)
    except listeners.ListenError as exc:  # a taken port, no socket from systemd, an unusable certificate
        print(f"pathprobe: {exc}", file=sys.stderr)
        return EXIT_PROBE_FAILED
    reloads = Reloads(exporter, args.config, also=web_config.reload, applied=server.renew)
    log.info("pathprobe %s for %s: metrics on %s", __version__, cfg.host.name, where)
    if cfg.iperf3.auth:  # the padding decides which peers' iperf3 can authenticate with this one
        log.log(*iperf3.describe(cfg.iperf3.binary, cfg.iperf3.auth.legacy_rsa_padding))

    async def run() -> None:
        stop = asyncio.Event()
        await stop_on_signals(stop)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, reloads.request)
        if sighup.pending():  # one came while the exporter started: it was kept for now
            reloads.request()
        reloading = asyncio.create_task(reloads.run(), name="reloads")
        running.append(loop)
        notify_systemd("READY=1")
        try:
            await exporter.run(stop)
        finally:
            reloading.cancel()

    try:
        asyncio.run(run())
    except responders.ResponderError as exc:
        print(f"pathprobe: {exc}", file=sys.stderr)
        return EXIT_PROBE_FAILED
    finally:
        server.shutdown()
    return 0
