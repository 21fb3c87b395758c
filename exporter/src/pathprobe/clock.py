"""This host's clock error bound: how far its wall clock may be from true time, as the time
service states it. One-way delays subtract two hosts' clocks, so each is only as good as
the two bounds added (probes/echo.py); no clock model of our own beyond what they state.

Where it comes from (`clock.source`):
- ClockBound's shared memory segment (aws/clock-bound, docs/PROTOCOL.md, versions 1 and 2):
  the bound chronyd's tracking gives, grown by the maximum drift since it was computed, and
  void after the time the daemon gives or when the clock is not synchronized;
- chronyd's tracking (`chronyc -c tracking`): |system time offset| + root dispersion + root
  delay / 2, the same formula ClockBound uses (its README, "Calculations");
- a stated figure (`clock.error_bound_seconds`): a lab whose hosts share one kernel clock,
  or a clock disciplined by something else that states its bound.
`auto` takes ClockBound where its segment exists, else chronyd. None: no bound known, and
then no one-way delay is reported.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import shutil
import struct
import time
from pathlib import Path

from .config import ClockSettings

log = logging.getLogger(__name__)

CLOCKBOUND_MAGIC = bytes([0x41, 0x4D, 0x5A, 0x4E, 0x43, 0x42, 0x02, 0x00])
_CB_HEADER = struct.Struct("=8sIHH")  # magic, segment size, version, generation
_CB_TIMES = struct.Struct("=qqqqq")  # as-of (s, ns), void-after (s, ns), bound (ns); from byte 16
# Then, version 2: disruption marker (u64), max drift (u32, ppb), clock status (i32);
# version 1: max drift (u32, ppb), reserved (u32), clock status (i32).
_CB_TAIL = {2: (struct.Struct("=QIi"), 1, 2), 1: (struct.Struct("=IIi"), 0, 2)}  # struct, drift index, status index
CLOCKBOUND_SYNCHRONIZED = 1
CLOCK_MONOTONIC_COARSE = 6  # Linux (linux/time.h): the clock ClockBound's timestamps are on; not in Python's time


def clockbound(data: bytes, now_monotonic_coarse: float) -> float | None:
    """The bound (seconds) in a ClockBound segment at this CLOCK_MONOTONIC_COARSE time; None
    when it is void, the clock not synchronized, or the segment not one we read."""
    if len(data) < _CB_HEADER.size + _CB_TIMES.size:
        return None
    magic, _, version, generation = _CB_HEADER.unpack_from(data)
    if magic != CLOCKBOUND_MAGIC or version not in _CB_TAIL or generation % 2:
        return None  # odd: the daemon is writing it
    tail, drift_at, status_at = _CB_TAIL[version]
    if len(data) < _CB_HEADER.size + _CB_TIMES.size + tail.size:
        return None
    as_of_s, as_of_ns, void_s, void_ns, bound_ns = _CB_TIMES.unpack_from(data, _CB_HEADER.size)
    fields = tail.unpack_from(data, _CB_HEADER.size + _CB_TIMES.size)
    as_of, void_after = as_of_s + as_of_ns / 1e9, void_s + void_ns / 1e9
    if fields[status_at] != CLOCKBOUND_SYNCHRONIZED or now_monotonic_coarse > void_after:
        return None
    return float(bound_ns / 1e9 + max(0.0, now_monotonic_coarse - as_of) * fields[drift_at] / 1e9)


def read_clockbound(path: Path) -> float | None:
    """The bound now from the segment at `path` (the daemon rewrites it in place: read until two
    reads agree on an even generation)."""
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as segment:
            for _ in range(10):
                data = bytes(segment[:128])
                if data[:16] == bytes(segment[:16]):  # the generation did not move while read
                    return clockbound(data, time.clock_gettime(CLOCK_MONOTONIC_COARSE))
    except (OSError, ValueError):
        return None
    return None


def chrony_tracking(csv_line: str) -> float | None:
    """The bound from `chronyc -c tracking`'s line: |system time offset| + root dispersion +
    root delay / 2; None when chronyd is not synchronized or the line is not its."""
    fields = csv_line.strip().split(",")
    if len(fields) < 14 or fields[13] == "Not synchronised":
        return None
    try:
        offset, root_delay, root_dispersion = float(fields[4]), float(fields[10]), float(fields[11])
    except ValueError:
        return None
    return abs(offset) + root_dispersion + root_delay / 2


def one_way_untrusted(
    error: float | None, clocks_apart: float, negative: bool, medians: list[float], max_error_share: float
) -> str:
    """Why one-way delays are not worth reading, or "" when they are (metrics/owd.py says each
    reason): `error` both ends' bounds added (None: an end states none); `clocks_apart` how far the
    echoes put the clocks apart at least; `negative` a delay came out below zero; `medians` each
    direction's median delay."""
    if error is None:
        return "no_bound"
    if clocks_apart > error or negative:
        return "clocks_disagree"
    if medians and error > max_error_share * min(medians):
        return "bound_too_wide"
    return ""


class ClockErrorBound:
    """This host's current bound (`seconds`, None when unknown) and where it came from, kept
    fresh by `run()` every clock.refresh_seconds; the echo responder sends it with every
    answer and the echo prober reads it for its own end."""

    def __init__(self, settings: ClockSettings):
        self.settings = settings
        self.seconds: float | None = settings.error_bound_seconds if settings.source == "stated" else None
        self.source = "stated" if settings.source == "stated" else ""

    async def refresh(self) -> None:
        s = self.settings
        if s.source == "stated":
            self.seconds, self.source = s.error_bound_seconds, "stated"
            return
        if s.source in ("auto", "clockbound") and s.clockbound_path.exists():
            self.seconds, self.source = read_clockbound(s.clockbound_path), "clockbound"
            return
        if s.source in ("auto", "chrony") and shutil.which(s.chronyc):
            self.seconds, self.source = await self._chrony(), "chrony"
            return
        self.seconds, self.source = None, ""

    async def _chrony(self) -> float | None:
        try:
            proc = await asyncio.create_subprocess_exec(
                self.settings.chronyc,
                "-c",
                "tracking",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=5)
        except (OSError, TimeoutError):
            return None
        return chrony_tracking(out.decode(errors="replace"))

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # a bad read leaves the bound unknown, never the exporter down
                log.exception("reading the clock error bound failed")
                self.seconds = None
            await asyncio.sleep(self.settings.refresh_seconds)
