"""The sockets /metrics is served on: bound to listen addresses (`--web.listen-address`, repeatable,
else the config's web.listen), or passed by systemd (`--web.systemd-socket`: socket activation), as
Prometheus's exporters take them (exporter-toolkit's flags).

systemd's protocol (sd_listen_fds(3)) is small and stable: the sockets are descriptors 3, 4, ...;
$LISTEN_FDS says how many and $LISTEN_PID which process they are for (a child that inherited the
environment is not that process). It is read here directly rather than through a library: the
python-systemd bindings build against libsystemd's headers, which a host needs for nothing else,
for a dozen lines that systemd documents as its interface."""

from __future__ import annotations

import os
import socket

# Connections the kernel holds for the server: accepted and not yet taken, and (with
# TCP_DEFER_ACCEPT) connected but silent. Beyond it, Linux answers with SYN cookies, and such a
# connection is handed over at once (to the web server's caps and deadlines). Capped by
# net.core.somaxconn. A socket systemd passes has its unit's Backlog= instead.
BACKLOG = 4096

SD_LISTEN_FDS_START = 3  # the first descriptor systemd passes


class ListenError(Exception):
    """No socket to serve on, or one passed that cannot be served on: the message says which."""


def bind(address: str) -> socket.socket:
    """A listening TCP socket on `address` ("HOST:PORT", "[V6]:PORT", ":PORT" for every IPv4
    address), as config.WebSettings writes it. A taken port or an unknown host: OSError."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, int(port)), family=family, backlog=BACKLOG, reuse_port=False)


def defer_accept(listener: socket.socket, seconds: int) -> None:
    """As nginx's `listen ... deferred`: the kernel holds a connection until its first byte (or
    its close) arrives, so a client that connects and sends nothing costs the exporter nothing
    for that long (its deadlines run from the hand-over), and a scrape is never accepted
    behind a flood of them."""
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, seconds)


def systemd_sockets(environ: dict[str, str] | None = None) -> list[socket.socket]:
    """The listening sockets systemd passed this process (sd_listen_fds(3)), each descriptor
    closed on exec, and $LISTEN_* removed so that no child takes them for its own."""
    env = os.environ if environ is None else environ
    pid, fds = env.get("LISTEN_PID", ""), env.get("LISTEN_FDS", "")
    if not pid or not fds:
        raise ListenError(
            "--web.systemd-socket: no sockets passed (LISTEN_FDS is not set: start it from a .socket unit)"
        )
    if not pid.isdigit() or int(pid) != os.getpid():
        raise ListenError(f"--web.systemd-socket: LISTEN_PID={pid} is not this process ({os.getpid()})")
    if not fds.isdigit() or int(fds) < 1:
        raise ListenError(f"--web.systemd-socket: LISTEN_FDS={fds!r} is not a count of sockets")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(name, None)
    return [_passed(fd) for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(fds))]


def _passed(fd: int) -> socket.socket:
    try:
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ListenError(f"--web.systemd-socket: descriptor {fd} is not a socket: {exc.strerror}") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()  # systemd's, not ours to close
        raise ListenError(f"--web.systemd-socket: descriptor {fd} is not a listening stream socket (ListenStream=)")
    return sock
