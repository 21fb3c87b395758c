"""SIGHUPs that came before `pathprobe run` took the signal over: remembered by the entry point
(launch.py) before it imports anything else, taken by the run command once its loop runs. Apart
from both, so that neither imports the other."""

from __future__ import annotations

import signal

_sighups: list[int] = []


def remember() -> None:
    """From now on a SIGHUP is only remembered (its default action would end the process)."""
    signal.signal(signal.SIGHUP, lambda signum, _frame: _sighups.append(signum))


def pending() -> bool:
    """Whether a SIGHUP came before the exporter's own handler took over (and forget it)."""
    came = bool(_sighups)
    _sighups.clear()
    return came
