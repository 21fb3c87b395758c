"""The daily byte budget survives restarts and rolls over at UTC midnight."""

import errno
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import pytest
import yaml
from loopback_mesh import serve, unused_port, wait_for
from permissions import unreadable

from pathprobe import budget
from pathprobe.budget import Budget
from pathprobe.monitoring import params, rules

DAY = 86400.0
NOON = 20000 * DAY + DAY / 2  # noon UTC of some day


def test_spend_persists_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "budget.json"
    b = Budget(1000, state, clock=lambda: NOON)
    b.spend(600)
    again = Budget(1000, state, clock=lambda: NOON + 60)
    assert again.remaining() == 400
    assert not again.allows(500)
    assert again.allows(400)


def test_a_state_file_deleted_while_running_is_written_again_whole(tmp_path: Path) -> None:
    # The count lives in memory; the file is its copy: deleted (or its directory), the next
    # spend writes today's whole count again, and a restart after that knows it.
    state = tmp_path / "state" / "budget.json"
    b = Budget(1000, state, clock=lambda: NOON)
    b.spend(300)
    state.unlink()
    state.parent.rmdir()
    assert b.remaining() == 700  # nothing lost while the file is gone
    assert b.spend(100)
    assert json.loads(state.read_text()) == {"period": b.period, "used_bytes": 400}
    assert Budget(1000, state, clock=lambda: NOON + 60).remaining() == 600


def test_exhausted_budget_blocks_until_next_period(tmp_path: Path) -> None:
    now = [NOON]
    b = Budget(1000, tmp_path / "b.json", clock=lambda: now[0])
    b.spend(1500)
    assert b.remaining() == 0 and not b.allows(0)
    assert b.period_end() == 20001 * DAY
    now[0] = 20001 * DAY + 1
    assert b.remaining() == 1000


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"null",
        b"[]",
        b'"str"',
        b"\x89PNG\x00\xff",
        b'{"period": "2024-10-04"}',
        b'{"period": "2024-10-04", "used_bytes": 1e400}',
        b'{"period": "2024-10-04", "used_bytes": -5}',
        b'{"period": "2024-10-04", "used_bytes": "600"}',
        b'{"period": "2024-10-04", "used_bytes": true}',
        b'{"period": "2024-10-04", "used_bytes": null}',
        b'{"period": 7, "used_bytes": 10}',
        b'{"period": "yesterday", "used_bytes": 10}',
        b"[" * 100000,
        b" " * 10000,
        b'{"period": "9999-12-31", "used_bytes": 0}',  # its period's end overflowed every render
    ],
)
def test_a_corrupt_state_file_counts_the_day_as_spent(tmp_path: Path, content: bytes) -> None:
    # Regression: these crashed `run` with a traceback (null, [], "str", 1e400) or
    # granted a fresh allowance (garbage, a negative count). Now: the day counts as spent.
    state = tmp_path / "b.json"
    state.write_bytes(content)
    now = [NOON]
    b = Budget(1000, state, clock=lambda: now[0])
    assert b.remaining() == 0 and not b.allows(1)
    assert b.unusable() and b.load_error is not None and str(state) in b.load_error
    assert b.period_end() == 20001 * DAY
    now[0] = 20001 * DAY + 1  # the next UTC day: a fresh allowance, and the file is whole again
    assert b.remaining() == 1000
    assert not b.unusable() and b.load_error is None  # the metric (and its alert) clears with its period
    assert b.spend(10)
    assert json.loads(state.read_text()) == {"period": "2024-10-05", "used_bytes": 10}


@pytest.mark.parametrize("kind", ["directory", "unreadable"])
def test_a_state_file_that_cannot_be_read_counts_the_day_as_spent(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "b.json"
    if kind == "directory":
        state.mkdir()
    else:
        state.write_text('{"period": "2024-10-04", "used_bytes": 1}')
        unreadable(monkeypatch, state)
    b = Budget(1000, state, clock=lambda: NOON)
    assert b.remaining() == 0 and b.load_error is not None


def test_an_old_period_is_a_fresh_day_whatever_its_count(tmp_path: Path) -> None:
    state = tmp_path / "b.json"
    state.write_text('{"period": "2024-10-03", "used_bytes": -1}')
    b = Budget(1000, state, clock=lambda: NOON)
    assert b.remaining() == 1000 and b.load_error is None


def test_a_missing_state_file_starts_from_zero(tmp_path: Path) -> None:
    b = Budget(1000, tmp_path / "none.json", clock=lambda: NOON)
    assert b.remaining() == 1000 and b.load_error is None


def test_a_clock_stepped_back_over_midnight_keeps_the_later_day(tmp_path: Path) -> None:
    # Regression: the budget of the day was reset when the clock went back.
    state = tmp_path / "b.json"
    now = [20001 * DAY + 5]  # 00:00:05 of the next day
    b = Budget(1000, state, clock=lambda: now[0])
    b.spend(700)
    now[0] = 20001 * DAY - 2  # stepped back to 23:59:58 of the day before
    assert b.remaining() == 300
    assert b.period_end() == 20002 * DAY
    # ... and across a restart under the stepped-back clock
    again = Budget(1000, state, clock=lambda: now[0])
    assert again.remaining() == 300 and again.period_end() == 20002 * DAY
    now[0] = 20002 * DAY + 1
    assert again.remaining() == 1000


@pytest.mark.parametrize("kind", ["directory", "read_only_dir", "parent_is_a_file"])
def test_spend_never_raises_when_the_state_cannot_be_written(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: an OSError from the write killed the throughput loop.
    state = tmp_path / "d" / "b.json"
    state.parent.mkdir()
    b = Budget(1000, state, clock=lambda: NOON)  # started fine; the path breaks while running
    if kind == "directory":
        state.mkdir()
    elif kind == "read_only_dir":
        state.parent.chmod(0o500)
        if os.geteuid() == 0:  # root writes into read-only directories: the error it would get
            monkeypatch.setattr(tempfile, "mkstemp", lambda **kw: _raise(PermissionError(13, "Permission denied")))
    else:
        state.parent.rmdir()
        state.parent.write_text("")
    assert b.spend(300) is False
    assert b.spend(300) is False
    assert b.remaining() == 400  # counted in memory all the same
    assert b.save_failures == 2 and b.save_error
    if kind == "directory":
        state.rmdir()
        assert b.spend(100) is True
        assert b.save_error is None
        assert json.loads(state.read_text())["used_bytes"] == 700


def test_spend_survives_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(budget, "write_atomic", full)
    b = Budget(1000, tmp_path / "b.json", clock=lambda: NOON)
    assert b.spend(10) is False and b.save_error == os.strerror(errno.ENOSPC)


def test_state_file_is_written_whole(tmp_path: Path) -> None:
    state = tmp_path / "sub" / "b.json"
    Budget(1000, state, clock=lambda: NOON).spend(10)
    assert json.loads(state.read_text()) == {"period": "2024-10-04", "used_bytes": 10}
    assert not list(state.parent.glob("*.tmp")) and not list(state.parent.glob(".*.tmp"))


def _raise(exc: BaseException) -> NoReturn:
    raise exc


def test_a_real_exporter_exports_what_the_budget_alerts_read(tmp_path: Path) -> None:
    """Real processes on loopback: `pathprobe run` (h0) tests `pathprobe serve` (h1). Its state
    file turns into a directory while it runs: the writes after its tests fail and are counted;
    restarted on a corrupt file, today counts as spent. Both series are the ones the alerts read."""
    read = {
        name
        for rule in rules.render(params.Params())["groups"][-1]["rules"]
        if rule["alert"].startswith("PathprobeBudgetS")
        for name in re.findall(r"pathprobe_\w+", rule["expr"])
    }
    assert read == {"pathprobe_budget_state_unusable", "pathprobe_budget_save_failures_total"}
    h1 = {"rr_port": unused_port(), "echo_port": unused_port(), "iperf3_port": unused_port()}
    state, web = tmp_path / "budget.json", unused_port()
    cfg = tmp_path / "pathprobe.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "host": {"name": "h0", "address": "127.0.0.1", "region": "r1"},
                "peers": [{"name": "h1", "address": "127.0.0.2", "region": "r2", "path_class": "inter_region", **h1}],
                "probes": {
                    "throughput": {
                        "protocols": ["udp"],
                        "streams": [1],
                        "udp_bitrate": "10M",
                        "duration_seconds": 1,
                        "omit_seconds": 0,
                    },
                    "rtt": {"interval_seconds": 0.5},
                    "loss": {"rate_pps": 2},
                    "mtu": {"enabled": False},
                },
                "schedule": {"slot_seconds": 10, "jitter_seconds": 0, "timeout_margin_seconds": 1},
                "responders": {"listen": "127.0.0.1", "rr_port": unused_port(), "echo_port": unused_port()},
                "iperf3": {"port": unused_port()},
                "web": {"listen": f"127.0.0.1:{web}"},
                "budget": {"state_file": str(state)},
            }
        )
    )
    server = serve("127.0.0.2", h1)
    run = [sys.executable, "-m", "pathprobe", "run", "--config", str(cfg)]
    errs = []
    try:
        proc = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(web, "first scrape", lambda got: ("pathprobe_budget_state_unusable", frozenset()) in got)
            state.mkdir()  # after the start read no file: the writes after the next tests fail
            got = wait_for(
                web,
                "a failed write of the state file counted",
                lambda got: got.get(("pathprobe_budget_save_failures_total", frozenset()), 0) >= 1,
                seconds=60,
            )
            assert got["pathprobe_budget_state_unusable", frozenset()] == 0
        finally:
            proc.send_signal(signal.SIGTERM)
            errs.append(proc.communicate(timeout=15)[1])
        assert "cannot be written" in errs[0], errs[0][-3000:]
        state.rmdir()
        state.write_text("{not json")
        proc = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            got = wait_for(
                web,
                "the unusable state file",
                lambda got: got.get(("pathprobe_budget_state_unusable", frozenset())) == 1,
            )
            assert got["pathprobe_budget_remaining_bytes", frozenset()] == 0
            assert got["pathprobe_budget_save_failures_total", frozenset()] == 0
        finally:
            proc.send_signal(signal.SIGTERM)
            errs.append(proc.communicate(timeout=15)[1])
        assert "cannot be used" in errs[1], errs[1][-3000:]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=15)
    assert not [e for e in errs if "Traceback" in e], errs
