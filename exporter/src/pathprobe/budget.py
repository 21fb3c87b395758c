"""Daily byte budget for throughput tests, kept on disk across restarts.

Inter-region transfer is billed per GB: a restart must not hand out a fresh
allowance, so the spend of the current UTC day is written (atomically) after
every test.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


class Budget:
    def __init__(self, limit_bytes: int, state_file: Path, clock: Callable[[], float] = time.time):
        self.limit = limit_bytes
        self.state_file = state_file
        self.clock = clock
        self._period = self._current_period()
        self._used = 0
        self._load()

    def _current_period(self) -> str:
        return dt.datetime.fromtimestamp(self.clock(), dt.UTC).date().isoformat()

    def period_end(self) -> float:
        day = dt.date.fromisoformat(self._period) + dt.timedelta(days=1)
        return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()

    def _load(self) -> None:
        try:
            state = json.loads(self.state_file.read_text())
            if state.get("period") == self._period:
                self._used = int(state["used_bytes"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("budget state %s unreadable (%s); counting this period from zero", self.state_file, exc)

    def _roll(self) -> None:
        period = self._current_period()
        if period != self._period:
            self._period, self._used = period, 0

    def remaining(self) -> int:
        self._roll()
        return max(0, self.limit - self._used)

    def allows(self, estimate_bytes: float) -> bool:
        return self.remaining() >= max(1.0, estimate_bytes)

    def spend(self, nbytes: int) -> None:
        self._roll()
        self._used += nbytes
        self._save()

    def _save(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(self.state_file.suffix + ".tmp")
        tmp.write_text(json.dumps({"period": self._period, "used_bytes": self._used}))
        os.replace(tmp, self.state_file)
