"""The clock error bound: chronyd's tracking line, ClockBound's segment (its documented layouts,
written here as the daemon writes them) and the stated figure."""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from pathprobe import clock
from pathprobe.config import ClockSettings

# `chronyc -c tracking` (chrony 4.3): reference, stratum, ref time, system time offset, last and RMS
# offset, frequency, residual, skew, root delay, root dispersion, update interval, leap status.
TRACKING = (
    "A9FEA97B,169.254.169.123,4,1764090000.123456789,-0.000012345,-0.000001234,0.000023456,"
    "-1.234,-0.001,0.012,0.000300000,0.000456789,64.5,Normal\n"
)


def test_chrony_tracking_gives_offset_plus_dispersion_plus_half_the_delay() -> None:
    assert clock.chrony_tracking(TRACKING) == pytest.approx(0.000012345 + 0.000456789 + 0.000150)
    assert clock.chrony_tracking(TRACKING.replace("Normal", "Not synchronised")) is None
    assert clock.chrony_tracking("506 Cannot talk to daemon\n") is None


BOUND_NS, DRIFT_PPB = 50_000, 15_000


def segment(
    *, version: int = 2, generation: int = 4, as_of: float = 100.0, void_after: float = 200.0, status: int = 1
) -> bytes:
    """A ClockBound segment as docs/PROTOCOL.md lays it out (native byte order)."""

    def timespec(t: float) -> tuple[int, int]:
        return int(t), round((t - int(t)) * 1e9)

    head = struct.pack("=8sIHH", clock.CLOCKBOUND_MAGIC, 128, version, generation)
    times = struct.pack("=qqqqq", *timespec(as_of), *timespec(void_after), BOUND_NS)
    tail = struct.pack("=QIiB", 7, DRIFT_PPB, status, 0) if version == 2 else struct.pack("=IIi", DRIFT_PPB, 0, status)
    return (head + times + tail).ljust(128, b"\0")


def test_a_clockbound_segment_grows_by_its_drift_until_void() -> None:
    # 50 us at as-of; 10 s later 15,000 ppb have added 150 us.
    assert clock.clockbound(segment(), 110.0) == pytest.approx(50e-6 + 10 * 15_000e-9)
    assert clock.clockbound(segment(version=1), 110.0) == pytest.approx(50e-6 + 10 * 15_000e-9)
    assert clock.clockbound(segment(), 200.5) is None  # void after
    assert clock.clockbound(segment(status=2), 110.0) is None  # free running
    assert clock.clockbound(segment(generation=5), 110.0) is None  # being written
    assert clock.clockbound(segment()[:40], 110.0) is None
    assert clock.clockbound(b"X" + segment()[1:], 110.0) is None


def test_the_holder_reads_the_segment_or_the_stated_figure(tmp_path: Path) -> None:
    now = time.clock_gettime(clock.CLOCK_MONOTONIC_COARSE)
    shm = tmp_path / "shm0"
    shm.write_bytes(segment(as_of=now, void_after=now + 100))
    auto = clock.ClockErrorBound(ClockSettings(clockbound_path=shm, chronyc="no-such-chronyc"))
    asyncio.run(auto.refresh())
    assert auto.source == "clockbound" and auto.seconds == pytest.approx(50e-6, abs=20e-6)
    shm.unlink()
    asyncio.run(auto.refresh())  # neither ClockBound nor chronyd: unknown
    assert (auto.seconds, auto.source) == (None, "")
    stated = clock.ClockErrorBound(ClockSettings(source="stated", error_bound_seconds=1e-5))
    assert (stated.seconds, stated.source) == (1e-5, "stated")


def test_a_stated_source_needs_its_figure_and_only_it_takes_one() -> None:
    with pytest.raises(ValidationError, match="error_bound_seconds is set with source: stated, and only then"):
        ClockSettings(source="stated")
    with pytest.raises(ValidationError, match="error_bound_seconds is set with source: stated, and only then"):
        ClockSettings(error_bound_seconds=1e-3)
