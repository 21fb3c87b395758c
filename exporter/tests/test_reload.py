"""A real `pathprobe run` reloads its config on SIGHUP and POST /-/reload: a new member list
takes effect, a bad one is refused with its file:line and counted, and the exporter keeps
running on the old one."""

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from loopback_mesh import peers_shown, request, samples, unused_port, wait_for


class Exporter:
    def __init__(self, tmp_path: Path):
        self.path = tmp_path / "pathprobe.yaml"
        self.web = unused_port()
        self.base = {
            "host": {"name": "a", "address": "127.0.0.1", "region": "r1"},
            "peers": [{"name": "b", "address": "127.0.0.2", "region": "r2", "path_class": "inter_region"}],
            "probes": {"throughput": {"enabled": False}, "rtt": {"interval_seconds": 0.5}, "loss": {"rate_pps": 2}},
            "responders": {"listen": "127.0.0.1", "rr_port": unused_port(), "echo_port": unused_port()},
            "iperf3": {"port": unused_port()},
            "web": {"listen": f"127.0.0.1:{self.web}", "enable_lifecycle": True},
            "budget": {"state_file": str(tmp_path / "budget.json")},
        }

    def write(self, changes: dict) -> None:
        self.path.write_text(yaml.safe_dump(self.base | changes, sort_keys=False))


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[Exporter, subprocess.Popen[str]]]:
    ex = Exporter(tmp_path)
    ex.write({})
    proc = subprocess.Popen(
        [sys.executable, "-m", "pathprobe", "run", "--config", str(ex.path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(ex.web, "first scrape", lambda got: peers_shown(got) == {"b"})
        yield ex, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err[-2000:]
        assert "Traceback" not in err, err[-3000:]


def test_sighup_applies_a_new_member_list_and_drops_the_removed_peer(
    exporter: tuple[Exporter, subprocess.Popen[str]],
) -> None:
    ex, proc = exporter
    c = {"name": "c", "address": "127.0.0.3", "region": "r2", "path_class": "inter_region"}
    ex.write({"peers": [c]})
    proc.send_signal(signal.SIGHUP)
    got = wait_for(ex.web, "peer c instead of b", lambda got: peers_shown(got) == {"c"})
    assert got["pathprobe_config_reloads_total", frozenset({("result", "success")})] == 1
    assert got["pathprobe_config_last_reload_successful", frozenset()] == 1
    # c is probed (its RTT probes fail: nothing answers on 127.0.0.3), b's series are gone
    wait_for(
        ex.web,
        "c's RTT probes counted",
        lambda got: any(
            n == "pathprobe_probe_runs_total" and ("peer", "c") in ls and ("probe", "rtt") in ls and v > 0
            for (n, ls), v in got.items()
        ),
    )
    assert not [ls for _, ls in samples(ex.web) if ("peer", "b") in ls]
    assert proc.poll() is None


def test_a_bad_config_is_refused_with_its_place_counted_and_the_old_one_kept(
    exporter: tuple[Exporter, subprocess.Popen[str]],
) -> None:
    ex, proc = exporter
    ex.write({"probes": {"rtt": {"interval_seconds": -1}}})
    status, body = request(ex.web, "POST", "/-/reload")
    assert status == 500 and "probes.rtt.interval_seconds" in body and f"{ex.path}:" in body, body
    ex.write({"web": {"listen": f"127.0.0.1:{unused_port()}", "enable_lifecycle": True}})
    status, body = request(ex.web, "POST", "/-/reload")
    assert status == 500 and "web changed: only a restart applies them" in body, body
    got = wait_for(
        ex.web,
        "two failed reloads",
        lambda got: got.get(("pathprobe_config_reloads_total", frozenset({("result", "failure")}))) == 2,
    )
    assert got["pathprobe_config_last_reload_successful", frozenset()] == 0
    assert peers_shown(got) == {"b"}
    assert request(ex.web, "GET", "/-/reload")[0] == 405
    ex.write({})  # the good config again: the next reload succeeds
    assert request(ex.web, "POST", "/-/reload") == (200, "config reloaded\n")
    assert proc.poll() is None


def test_the_reload_endpoint_is_off_unless_enabled(tmp_path: Path) -> None:
    ex = Exporter(tmp_path)
    ex.write({"web": {"listen": f"127.0.0.1:{ex.web}"}})
    proc = subprocess.Popen(
        [sys.executable, "-m", "pathprobe", "run", "--config", str(ex.path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(ex.web, "first scrape", lambda got: peers_shown(got) == {"b"})
        assert request(ex.web, "POST", "/-/reload")[0] == 403
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)


def test_an_epoch_ten_years_ahead_is_logged_at_start_and_reload_and_the_exporter_runs_on(tmp_path: Path) -> None:
    # check-config refuses it; an exporter started or reloaded without check-config warns, and
    # its RTT, loss and responders run on (only the throughput schedule waits for the epoch).
    ex = Exporter(tmp_path)
    epoch = time.time() + 10 * 365 * 86400
    ex.write({"mesh": {"epoch": epoch}})
    proc = subprocess.Popen(
        [sys.executable, "-m", "pathprobe", "run", "--config", str(ex.path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(ex.web, "first scrape", lambda got: peers_shown(got) == {"b"})
        proc.send_signal(signal.SIGHUP)
        wait_for(
            ex.web,
            "the reload",
            lambda got: got.get(("pathprobe_config_reloads_total", frozenset({("result", "success")}))) == 1,
        )
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    warnings = [line for line in err.splitlines() if "level=warn source=pathprobe" in line and "mesh.epoch" in line]
    assert len(warnings) == 2, err[-3000:]  # at start, at the reload
    assert all(f"{ex.path}: mesh.epoch: {at} is 3650 days ahead of this host's clock" in w for w in warnings), warnings
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]


def catches_sighup(pid: int) -> bool:
    """Whether process `pid` has a SIGHUP handler (bit 1 of SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & 1 << (signal.SIGHUP - 1))
    return False


def test_a_sighup_while_the_exporter_starts_is_kept_for_then(tmp_path: Path) -> None:
    """SIGHUP's default action ends a process: one sent in the exporter's first moments (a config
    management tool reloading right after starting it) used to kill it."""
    ex = Exporter(tmp_path)
    ex.write({})
    proc = subprocess.Popen(
        [sys.executable, "-m", "pathprobe", "run", "--config", str(ex.path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not catches_sighup(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        with pytest.raises(OSError):  # still starting: /metrics does not answer yet
            request(ex.web, "GET", "/metrics")
        proc.send_signal(signal.SIGHUP)
        wait_for(
            ex.web,
            "the reload the early SIGHUP asked for",
            lambda got: got.get(("pathprobe_config_reloads_total", frozenset({("result", "success")}))) == 1,
        )
        assert proc.poll() is None and peers_shown(samples(ex.web)) == {"b"}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]


def test_a_reload_shows_on_metrics_as_it_applies_not_at_the_next_render(tmp_path: Path) -> None:
    """With renders 15 s apart (web.refresh_seconds at its most), a reload that swaps a peer shows on
    the next scrape after it applies: the snapshot is rendered again then, not at its timer."""
    ex = Exporter(tmp_path)
    ex.base["web"] = {**ex.base["web"], "refresh_seconds": 15}
    ex.write({})
    proc = subprocess.Popen([sys.executable, "-m", "pathprobe", "run", "--config", str(ex.path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(ex.web, "first scrape", lambda got: peers_shown(got) == {"b"})
        rendered = time.monotonic()  # that scrape rendered; the timer's next render is 15 s on
        ex.write({"peers": [{"name": "c", "address": "127.0.0.3", "region": "r2", "path_class": "inter_region"}]})
        proc.send_signal(signal.SIGHUP)
        wait_for(ex.web, "peer c instead of b", lambda got: peers_shown(got) == {"c"}, seconds=15)
        assert time.monotonic() - rendered < 12  # the reload's own time, well before the timer's render
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]
