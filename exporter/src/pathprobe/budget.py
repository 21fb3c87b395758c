"""Daily byte budget for throughput tests, kept on disk across restarts.

Inter-region transfer is billed per GB: a restart must not hand out a fresh
allowance, so the spend of the current UTC day is written (atomically) after
every test. The rules, all on the side of spending less:

- No state file (first start, or deleted): the period starts from zero.
- A state file that cannot be read or makes no sense (not JSON, not an object, no
  valid date, `used_bytes` not a whole number from 0 up: null, "str", 1e400, -5; a
  directory; permission denied) counts the current period as fully spent: no test
  runs until the next UTC day. Logged as a warning and kept in `load_error` (for a
  metric and its alert) until that period ends. A file whose date is an earlier day
  is simply an old period: fresh allowance, whatever its byte count.
- Periods never go back: a clock stepped back (over midnight, or a file written by a
  clock that was ahead) keeps the latest period seen, with its spend, until the clock
  reaches its end. (A clock once set far into the future therefore holds the budget
  of that day until then; delete the state file to start over.)
- The state file cannot be written (read-only directory, path is a directory, disk
  full): `spend()` never raises. It keeps counting in memory (so the running
  exporter still stops at the limit), logs a warning, returns False, counts
  `save_failures` and keeps the reason in `save_error` (cleared by the next
  successful write).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .files import write_atomic

log = logging.getLogger(__name__)

# A state file is a few dozen bytes; more is not ours.
MAX_STATE_BYTES = 4096


class StateError(ValueError):
    """The state file's content makes no sense; `period` is its date when that part was readable."""

    def __init__(self, problem: str, period: dt.date | None = None):
        super().__init__(problem)
        self.period = period


class Budget:
    def __init__(self, limit_bytes: int, state_file: Path, clock: Callable[[], float] = time.time):
        self.limit = limit_bytes
        self.state_file = state_file
        self.clock = clock
        self._period = self._today()
        self._used = 0
        # Why the state file could not be used at start, while the period it made count as spent lasts.
        self.load_error: str | None = None
        # Writes of the state file that failed, and the reason of the last one (None once one succeeds).
        self.save_failures = 0
        self.save_error: str | None = None
        self._load()

    def _today(self) -> dt.date:
        return dt.datetime.fromtimestamp(self.clock(), dt.UTC).date()

    @property
    def period(self) -> str:
        return self._period.isoformat()

    @property
    def used(self) -> int:
        return self._used

    def period_end(self) -> float:
        day = self._period + dt.timedelta(days=1)
        return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()

    def _load(self) -> None:
        try:
            with open(self.state_file, "rb") as f:
                raw = f.read(MAX_STATE_BYTES + 1)
            period, used = _parse(raw)
        except FileNotFoundError:
            return
        except StateError as exc:
            if exc.period is not None and exc.period < self._period:
                log.info("budget state %s is for %s (%s); a new period starts", self.state_file, exc.period, exc)
            else:
                self._refuse(str(exc), exc.period)
            return
        except (OSError, ValueError) as exc:  # ValueError: a path the system refuses (a NUL in it)
            self._refuse(getattr(exc, "strerror", None) or str(exc), None)
            return
        if period > self._period + dt.timedelta(days=1):  # beyond any clock skew: not a state this host wrote
            self._refuse(f"period {period} is more than a day after today ({self.period}) by this clock", None)
            return
        if period > self._period:
            log.warning(
                "budget state %s is for %s, after today (%s) by this clock: keeping %s",
                self.state_file,
                period,
                self.period,
                period,
            )
        if period >= self._period:
            self._period, self._used = period, used

    def _refuse(self, reason: str, period: dt.date | None) -> None:
        """The state file cannot be used: the current period (or the file's, when later) counts as fully spent."""
        if period is not None and period > self._period:
            self._period = period
        self._used = max(self.limit, 0)
        self.load_error = f"{self.state_file}: {reason}"
        log.warning(
            "budget state %s cannot be used (%s): counting %s as fully spent; throughput tests resume "
            "at the next UTC day. Fix or remove the file to start counting from zero now.",
            self.state_file,
            reason,
            self.period,
        )

    def _roll(self) -> None:
        today = self._today()
        if today > self._period:  # never back: a clock stepped back keeps the later period
            self._period, self._used = today, 0
            if self.load_error is not None:  # its period is over: the file no longer holds tests back
                log.info("budget period %s starts: the unusable state file no longer holds tests back", self.period)
                self.load_error = None

    def remaining(self) -> int:
        self._roll()
        return max(0, self.limit - self._used)

    def unusable(self) -> bool:
        """Whether an unusable state file still holds the current period as spent."""
        self._roll()
        return self.load_error is not None

    def allows(self, estimate_bytes: float) -> bool:
        return self.remaining() >= max(1.0, estimate_bytes)

    def spend(self, nbytes: int) -> bool:
        """Count `nbytes` and write the state file. Never raises for the file: False when
        the write failed (counted in `save_failures`, reason in `save_error`)."""
        self._roll()
        self._used += max(0, int(nbytes))
        return self._save()

    def _save(self) -> bool:
        state = json.dumps({"period": self.period, "used_bytes": self._used})
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.state_file, state)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
            self.save_failures += 1
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            if self.save_error != reason:  # once per new reason, not after every test
                log.warning(
                    "budget state %s cannot be written (%s); counting in memory: a restart would "
                    "not know today's %d bytes",
                    self.state_file,
                    reason,
                    self._used,
                )
            self.save_error = reason
            return False
        if self.save_error is not None:
            log.info("budget state %s written again", self.state_file)
        self.save_error = None
        return True


def _parse(raw: bytes) -> tuple[dt.date, int]:
    """(period, used bytes) of a state file, or StateError saying what is wrong."""
    if len(raw) > MAX_STATE_BYTES:
        raise StateError(f"larger than {MAX_STATE_BYTES} bytes")
    try:
        state: Any = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise StateError(f"not JSON: {exc}") from None
    if not isinstance(state, dict):
        raise StateError(f"not a JSON object but {type(state).__name__}")
    try:
        period = dt.date.fromisoformat(state["period"])
    except (KeyError, TypeError, ValueError):
        raise StateError(f"period {state.get('period')!r:.40} is not a date like 2024-10-04") from None
    used = state.get("used_bytes")
    if isinstance(used, float) and math.isfinite(used) and used.is_integer():
        used = int(used)
    if isinstance(used, bool) or not isinstance(used, int) or used < 0:
        raise StateError(f"used_bytes {used!r:.40} is not a whole number of bytes >= 0", period)
    return period, used
