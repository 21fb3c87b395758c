"""CPU time compared within one run: a guard against a cost that explodes (a regex that
backtracks, an alias bomb) holds on a slow machine and a fast one alike, where a fixed
number of seconds holds on one of them."""

import time
from collections.abc import Callable


def cpu_seconds(run: Callable[[], object], reps: int = 3) -> float:
    """The least of `reps` runs' CPU time in this process (the least: the run with the fewest
    interruptions; CPU time: a shared machine's preemption is not the code's cost)."""
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best
