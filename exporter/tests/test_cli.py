"""The command line as its users type it: every flag says what it is for; durations and rates
say their unit; a bad value, a bad host name, a missing file or a reader gone is one line (or
nothing) on stderr and an exit status, never a traceback; --log.level before or after the
command; /metrics on several --web.listen-address values, or on the sockets systemd passes."""

import argparse
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from loopback_mesh import unused_port

from pathprobe.commands import EXIT_BROKEN_PIPE, build_parser, every_parser

PATHPROBE = str(Path(sys.executable).parent / "pathprobe")  # the installed command, as users run it


def test_every_command_and_flag_has_help() -> None:
    missing = []
    for parser in every_parser(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{parser.prog} {c.dest}" for c in action._choices_actions if not c.help]
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, "no help text: " + ", ".join(missing)


@pytest.mark.parametrize(
    "argv",
    [
        ["--log.level", "debug", "run", "--config", "c"],
        ["run", "--log.level", "debug", "--config", "c"],
        ["run", "--config", "c", "--log-level=debug"],
        ["probe", "rtt", "127.0.0.1", "--log.level", "debug"],
        ["lab", "status", "--log.level", "debug"],
    ],
)
def test_log_level_is_taken_before_and_after_the_command(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.log_level, args.log_format) == ("debug", "logfmt")


def test_log_options_after_the_command_win_and_default_before() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "--config", "c"]).log_level == "info"
    args = parser.parse_args(["--log.level", "error", "run", "--config", "c", "--log.format", "json"])
    assert (args.log_level, args.log_format) == ("error", "json")
    args = parser.parse_args(["--log.level", "error", "run", "--config", "c", "--log.level", "debug"])
    assert args.log_level == "debug"


def run(
    *argv: str, stdout: int = subprocess.PIPE, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PATHPROBE, *argv], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60, check=False, env=env
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


PREDICT = ["capacity", "--predict", "--from", "c6gn.large", "--to", "c6gn.large"]


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        ([*PREDICT, "--rtt", "8"], 2, "error: --rtt: '8' has no unit; write e.g. 8ms or 0.008s"),
        (["probe", "throughput", "127.0.0.1", "-t", "10"], 2, "--duration/-t: '10' has no unit; write e.g. 10s"),
        (["probe", "rtt", "127.0.0.1", "-i", "0.05"], 2, "'0.05' has no unit; write e.g. 0.05ms or 0.00005s"),
        (["probe", "loss", "127.0.0.1", "--rate", "50"], 2, "--rate: '50' has no unit; write e.g. 50/s"),
        (["probe", "throughput", "127.0.0.1", "-b", "500"], 2, "--bitrate/-b: '500' has no unit; write e.g. 500M"),
        (["serve", "--clock-error-bound", "0.000002"], 2, "'0.000002' has no unit; write e.g. 0.000002s or 0.002ms"),
        (["lab", "impair", "a", "b", "--delay", "30"], 2, "--delay: '30' has no unit; write e.g. 30ms"),
        (["alerts", "prometheus-config", "--interval", "60"], 2, "--interval: '60' has no unit"),
        (["aws-performance", "--config", "c", "--interval", "300"], 2, "--interval: '300' has no unit"),
        (["evidence", "--config", "c", "--out", "o", "--since", "2"], 2, "--since: '2' has no unit"),
        (["probe", "rtt", "not..a..host"], 2, "cannot resolve 'not..a..host'"),
        (["run", "--config", "/nonexistent/pathprobe.yaml"], 2, "/nonexistent/pathprobe.yaml: cannot read"),
        (["check-web-config", "/nonexistent/web.yml"], 2, "/nonexistent/web.yml: cannot read"),
        (["alerts", "render", "--out", "/nonexistent/rules.yml"], 2, "/nonexistent/rules.yml: No such file"),
        (["lab", "webhook-routing", "--url", "http://x", "--config", "/nonexistent/am.yml"], 2, "/nonexistent/am.yml"),
        (["run", "--config", "c", "--web.listen-address", "nowhere"], 2, "'nowhere' is not [HOST]:PORT"),
        (["run", "--config", "c", "--web.systemd-socket", "--web.listen-address", ":1"], 2, "not allowed with"),
        (["capacity", "--bogus"], 2, "error: unrecognized arguments: --bogus"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_status(argv: list[str], code: int, says: str) -> None:
    proc = run(*argv)
    assert proc.returncode == code, proc.stderr
    assert says in one_line(proc)


def test_a_reader_gone_is_exit_141_and_nothing_on_stderr() -> None:
    """`pathprobe limits show TYPE --json | head`: the pipe's reading end closed before a byte."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = run("limits", "show", "c6gn.large", "--json", stdout=write)
    finally:
        os.close(write)
    assert proc.returncode == EXIT_BROKEN_PIPE == 141
    assert proc.stderr == ""


def exporter_config(tmp_path: Path) -> tuple[Path, int]:
    """A config whose probes are off, and its web.listen's port (which the flags replace)."""
    port = unused_port()
    cfg = {
        "host": {"name": "a", "address": "127.0.0.1", "region": "r1"},
        "peers": [{"name": "b", "address": "127.0.0.2", "region": "r2", "path_class": "inter_region"}],
        "probes": {kind: {"enabled": False} for kind in ("throughput", "rtt", "loss", "mtu")},
        "responders": {"listen": "127.0.0.1", "rr_port": unused_port(), "echo_port": unused_port()},
        "iperf3": {"port": unused_port()},
        "web": {"listen": f"127.0.0.1:{port}"},
        "budget": {"state_file": str(tmp_path / "budget.json")},
    }
    path = tmp_path / "pathprobe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, port


@contextmanager
def started(argv: list[str], pass_fds: tuple[int, ...] = ()) -> Iterator[subprocess.Popen[str]]:
    """The exporter, once it told systemd's notify socket (ours here) READY=1; stopped after."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        name = f"pathprobe-test-{os.getpid()}-{id(notify)}"
        notify.bind("\0" + name)
        notify.settimeout(30)
        env = {**os.environ, "NOTIFY_SOCKET": "@" + name}
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, pass_fds=pass_fds
        )
        try:
            try:
                assert notify.recv(64) == b"READY=1"
            except TimeoutError:
                proc.kill()
                pytest.fail(f"the exporter did not start: {proc.communicate()[1][-2000:]}")
            yield proc
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=15)
            assert proc.returncode == 0, err[-2000:]
            assert "Traceback" not in err, err[-2000:]


def scrape(host: str, port: int) -> bytes:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        body: bytes = resp.read()
        return body


def test_two_listen_addresses_serve_metrics_on_both_instead_of_the_configs(tmp_path: Path) -> None:
    path, configured = exporter_config(tmp_path)
    first, second = unused_port(), unused_port()
    argv = [PATHPROBE, "run", "--config", str(path)]
    argv += ["--web.listen-address", f"127.0.0.1:{first}", "--web.listen-address", f"127.0.0.2:{second}"]
    with started(argv):
        assert b"pathprobe_build_info" in scrape("127.0.0.1", first)
        assert b"pathprobe_build_info" in scrape("127.0.0.2", second)
        with pytest.raises(OSError):  # the flags override web.listen, as an exporter's do its default
            scrape("127.0.0.1", configured)


# Where systemd forks, sets LISTEN_PID to the child's pid and LISTEN_FDS, and execs the service
# with its sockets from descriptor 3 on: the same process, so LISTEN_PID is the exporter's own.
LAUNCHER = """
import os, sys
fd = int(sys.argv[1])
os.dup2(fd, 3)
os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.argv[2], sys.argv[2:])
"""


def test_the_socket_systemd_passes_serves_metrics(tmp_path: Path) -> None:
    path, configured = exporter_config(tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    fd = os.dup(listener.fileno())  # not 3 (pytest's own files may hold it): the launcher moves it there
    argv = [sys.executable, "-c", LAUNCHER, str(fd), PATHPROBE, "run", "--config", str(path), "--web.systemd-socket"]
    try:
        with started(argv, pass_fds=(fd,)):
            listener.close()  # the exporter holds the only listening socket now
            assert b"pathprobe_build_info" in scrape("127.0.0.1", port)
            with pytest.raises(OSError):
                scrape("127.0.0.1", configured)
    finally:
        os.close(fd)
        listener.close()


def test_systemd_socket_without_sockets_is_one_line_and_exit_1(tmp_path: Path) -> None:
    path, _ = exporter_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")}
    proc = run("run", "--config", str(path), "--web.systemd-socket", env=env)
    assert proc.returncode == 1
    assert "no sockets passed (LISTEN_FDS is not set" in one_line(proc)
