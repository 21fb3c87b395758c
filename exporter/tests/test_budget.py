"""The daily byte budget survives restarts and rolls over at UTC midnight."""

import json
from pathlib import Path

from pathprobe.budget import Budget

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


def test_exhausted_budget_blocks_until_next_period(tmp_path: Path) -> None:
    now = [NOON]
    b = Budget(1000, tmp_path / "b.json", clock=lambda: now[0])
    b.spend(1500)
    assert b.remaining() == 0 and not b.allows(0)
    assert b.period_end() == 20001 * DAY
    now[0] = 20001 * DAY + 1
    assert b.remaining() == 1000


def test_corrupt_state_is_not_fatal(tmp_path: Path) -> None:
    state = tmp_path / "b.json"
    state.write_text("{not json")
    assert Budget(1000, state, clock=lambda: NOON).remaining() == 1000


def test_state_file_is_written_whole(tmp_path: Path) -> None:
    state = tmp_path / "sub" / "b.json"
    Budget(1000, state, clock=lambda: NOON).spend(10)
    assert json.loads(state.read_text()) == {"period": "2024-10-04", "used_bytes": 10}
    assert not list(state.parent.glob("*.tmp"))
