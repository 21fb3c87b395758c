"""Time that moves only when the code under test waits: the schedule's turns, reloads and epochs
run in virtual time, so a test of them claims seconds of the schedule, not seconds of this
machine, and has no wall-clock margin to lose on a busy one."""

import asyncio
import heapq
import itertools
from collections.abc import Callable


class VirtualTime:
    """A wall clock (`time`) and the async wait (`sleep`) that ends by it: pass both to
    `Exporter(cfg, clock=..., sleep=...)`, then `drive` the tasks. Time moves only when every
    task driven waits on this clock: to the earliest end of those waits, so tasks that wait
    together (several exporters' turns) see one timeline, as on real hosts."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start
        self._waits: list[tuple[float, int, asyncio.Future[None]]] = []  # (ends at, order, waiter)
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waits, (self.now + max(0.0, seconds), next(self._order), waiter))
        await waiter

    def _waiting(self) -> int:
        return sum(1 for _, _, w in self._waits if not w.done())

    def _advance(self) -> None:
        """Move to the earliest end of a wait and end every wait due then."""
        while self._waits and self._waits[0][2].done():  # a task cancelled while it waited
            heapq.heappop(self._waits)
        self.now = max(self.now, self._waits[0][0])
        while self._waits and self._waits[0][0] <= self.now:
            waiter = heapq.heappop(self._waits)[2]
            if not waiter.done():
                waiter.set_result(None)

    async def drive(self, tasks: list[asyncio.Task[None]], done: Callable[[], bool], real_seconds: float = 120) -> None:
        """Run until `done()`: while any task runs (or waits on something else, e.g. a thread), the
        loop runs it; once every live one of `tasks` (a list the tasks may add to) waits on this
        clock, time moves on. `real_seconds` bounds the run against a hang in this machine's time, not
        its speed: a rolling change's 20 simulated minutes took more than 20 s at nice 19 beside three labs."""
        async with asyncio.timeout(real_seconds):
            while not done():
                for task in tasks:
                    if task.done() and not task.cancelled() and (error := task.exception()) is not None:
                        raise error
                live = sum(1 for task in tasks if not task.done())
                assert live, "every task ended before the condition held"
                if self._waiting() >= live:
                    self._advance()
                await asyncio.sleep(0)
