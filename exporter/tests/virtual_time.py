"""Time that moves only when the code under test waits: the schedule's turns run in virtual time,
so a test of turns and clock steps claims seconds of the schedule, not seconds of this machine."""

import asyncio


class VirtualTime:
    """A wall clock (`time`) and the async wait (`sleep`) that moves it: a wait of s seconds ends at
    once, s seconds later by this clock. Pass both to `Exporter(cfg, clock=..., sleep=...)`."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)  # the other tasks (the test's own) run between waits
