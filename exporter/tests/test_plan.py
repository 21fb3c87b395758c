"""`pathprobe plan`: the cadence a daily byte budget allows, from a config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pathprobe.config import Config
from pathprobe.plan import SECONDS_PER_DAY, STEADY_STATE_SECONDS, plan

# Per-path expected rates given outright (limits.expected_bits_per_second), so that the bytes are known.
GBIT = 1e9


def config(**extra: Any) -> dict[str, Any]:
    peers = [
        {
            "name": "b",
            "address": "198.18.2.2",
            "region": "ap-northeast-1",
            "path_class": "intra_region",
            "limits": {"expected_bits_per_second": 2 * GBIT},
        },
        {
            "name": "c",
            "address": "198.18.3.2",
            "region": "ap-northeast-3",
            "path_class": "inter_region",
            "limits": {"expected_bits_per_second": 1 * GBIT},
        },
    ]
    return {
        "host": {"name": "a", "address": "198.18.1.2", "region": "ap-northeast-1"},
        "peers": peers,
        "budget": {"daily_bytes": "50GB", "price_per_gb": {"inter_region": 0.02}},
        **extra,
    }


def test_the_budget_sets_the_slot() -> None:
    p = plan(Config.model_validate(config()), steady_state=False)
    # Three members: a round-robin of three rounds (one bye each); the default tests, TCP x1 and x8,
    # at fixed length, 1 + 5 s each: per rotation 2 x 6 s at 2 Gbit/s and 2 x 6 s at 1 Gbit/s.
    assert p.rounds == 3
    assert len(p.tests) == 4 and {t.seconds for t in p.tests} == {6.0}
    assert p.bytes_per_rotation == pytest.approx(2 * 6 * (2 + 1) * GBIT / 8)  # 4.5 GB
    fits = p.within_budget()
    assert fits.bytes_per_day <= 50e9 < p.cadence(fits.slot_seconds - 1).bytes_per_day
    assert fits.rotation_seconds == 3 * fits.slot_seconds
    # 50 GB a day of 4.5 GB rotations: 11.1 rotations, each test of each peer as often.
    assert fits.tests_per_peer_per_day == pytest.approx(2 * SECONDS_PER_DAY / fits.rotation_seconds)
    # Only the inter-region tests are priced: a third of the bytes at $0.02 per GB.
    assert fits.cost_per_day == pytest.approx(fits.bytes_per_day / 3 / 1e9 * 0.02)
    configured = p.cadence(120)
    assert configured.bytes_per_day == pytest.approx(4.5e9 * SECONDS_PER_DAY / 360)  # 1,080 GB: 21x the budget


def test_steady_state_tests_are_planned_at_their_measured_length_udp_at_full_length() -> None:
    cfg = Config.model_validate(config(probes={"throughput": {"protocols": ["tcp", "udp"], "streams": [1]}}))
    fixed, steady = plan(cfg, steady_state=False), plan(cfg, steady_state=True)
    assert {(t.test.protocol, t.seconds) for t in fixed.tests} == {("tcp", 6.0), ("udp", 6.0)}
    assert {(t.test.protocol, t.seconds) for t in steady.tests} == {("tcp", STEADY_STATE_SECONDS), ("udp", 6.0)}
    assert steady.within_budget().slot_seconds < fixed.within_budget().slot_seconds
    # As the config says when neither is asked for: steady state by default, fixed length if it says so.
    assert {t.seconds for t in plan(Config.model_validate(config())).tests} == {STEADY_STATE_SECONDS}
    off = Config.model_validate(config(probes={"throughput": {"steady_state": {"enabled": False}}}))
    assert {t.seconds for t in plan(off).tests} == {6.0}
    assert {t.seconds for t in plan(off, steady_state=True).tests} == {STEADY_STATE_SECONDS}


def test_a_large_budget_leaves_the_slot_its_tests_need_and_none_fits_no_test() -> None:
    cfg = Config.model_validate(config(budget={"daily_bytes": "10PB"}))
    assert plan(cfg).within_budget().slot_seconds == 2 * cfg.half_slot_need()
    nothing = plan(Config.model_validate(config(budget={"daily_bytes": 0}))).within_budget()
    assert nothing.slot_seconds == float("inf") and nothing.tests_per_peer_per_day == 0


def test_the_command_prints_the_cadence_and_says_what_to_set(tmp_path: Path) -> None:
    path = tmp_path / "pathprobe.yaml"
    path.write_text(yaml.safe_dump(config()))
    out = subprocess.run(
        [sys.executable, "-m", "pathprobe", "plan", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    fits = plan(Config.model_validate(config())).within_budget()
    assert "| configured | 120 s | 6.0 min |" in out.stdout
    assert f"| within 50 GB a day | {fits.slot_seconds:g} s |" in out.stdout
    assert f"Set schedule.slot_seconds: {fits.slot_seconds:g}." in out.stdout
    path.write_text(yaml.safe_dump({**config(), "budget": {"daily_bytes": "lots"}}))
    bad = subprocess.run(
        [sys.executable, "-m", "pathprobe", "plan", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "budget.daily_bytes" in bad.stderr and "Traceback" not in bad.stderr
