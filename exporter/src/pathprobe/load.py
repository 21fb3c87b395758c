"""Whether a sample was taken under a throughput test's load: RTT and echo samples taken while
this host or the peer may be in a test sit behind that test's queue, and are kept apart as
"loaded". "May be" is the schedule's window for both hosts, and for this host also the time its
own tests really ran (a retried test can run past the window): the turns write those spans
here as each test starts and ends, and the rooms ask `LoadState` for each sample."""

from __future__ import annotations

import collections

from .schedule import Timetable

# After a test, the shapers' and the peer's queues still hold its last window of data.
DRAIN_SECONDS = 1.0


class OwnTests:
    """When this host's own throughput tests ran, with DRAIN_SECONDS after each (the turns
    write it; the load state and the iperf3 admission read it)."""

    def __init__(self) -> None:
        self.running_since: float | None = None
        self.ran: collections.deque[tuple[float, float]] = collections.deque(maxlen=8)

    def started(self, at: float) -> None:
        self.running_since = at

    def ended(self, at: float) -> None:
        if self.running_since is not None:
            self.ran.append((self.running_since, at + DRAIN_SECONDS))
        self.running_since = None

    def running(self) -> bool:
        """Whether one of this host's own tests runs now."""
        return self.running_since is not None

    def covers(self, at: float) -> bool:
        """Whether this host was in one of its own tests at `at` (or just after one)."""
        if self.running_since is not None and at >= self.running_since:
            return True
        return any(start <= at < end for start, end in self.ran)


class LoadState:
    """ "idle" or "loaded" for a peer's sample taken at a time (`of`). A reload hands it the new
    timetable and test length (`use`)."""

    def __init__(self, host: str, timetable: Timetable, test_seconds: float, own: OwnTests) -> None:
        self.host, self.own = host, own
        self.use(timetable, test_seconds)

    def use(self, timetable: Timetable, test_seconds: float) -> None:
        self.timetable, self.test_seconds = timetable, test_seconds

    def of(self, peer: str, now: float) -> str:
        active, busy = self.test_seconds, self.timetable.busy
        if active and (busy(self.host, now, active) or busy(peer, now, active)):
            return "loaded"
        return "loaded" if self.own.covers(now) else "idle"
