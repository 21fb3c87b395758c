"""The continuous probers' one timer per event loop (`Pacer`): their sends on a shared grid of
PACE_SECONDS steps, and the answers they await read on the same passes."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import select
import socket
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

# The continuous probes' sends wake on a shared grid of this step: the sends of every peer that
# fall due within one step go out in one pass of the event loop (one epoll_wait) instead of one
# pass each. bench/exporter_bench.py --cost: 250 wake-ups a second at phases spread over the
# interval (as after reloads and back-offs) cost 1.2-2.4% of a core one by one, 0.5-0.6% on the grid.
PACE_SECONDS = 0.05
# At most this many datagrams a socket read on the grid in a pass: a flood on one cannot hold the loop.
READ_ROUNDS_MOST = 64


class LateSink(Protocol):
    """Where the pacer says how late each pass ran after its time (metrics.host.HostRoom)."""

    def pass_late(self, seconds: float) -> None: ...


async def sleep_until(due: float, interval: float) -> None:
    """Sleep until the event loop's time `due`, rounded up to the next PACE_SECONDS step, for
    a probe sent every `interval` seconds; a probe sent more often than the step is not rounded
    (two of its packets would leave at once)."""
    loop = asyncio.get_running_loop()
    if interval >= PACE_SECONDS:
        due = math.ceil(due / PACE_SECONDS) * PACE_SECONDS
    await asyncio.sleep(max(0.0, due - loop.time()))


@dataclass(slots=True)
class _Sender:
    interval: float
    send: Callable[[], None]
    count: int | None  # sends to make; None: until cancelled
    done: asyncio.Future[None]
    due: float  # the event loop's time of its next send, before rounding to the grid
    sent: int = field(default=0)


class Pacer:
    """One timer for the sends of every continuous prober of an event loop: each sender's
    `send()` is called every `interval` seconds on the PACE_SECONDS grid (as sleep_until
    rounds), and the sends of every sender due in a step are made in one timer callback. A task
    per sender woke for each send (a task step and a future each): bench/exporter_bench.py --cost
    compares the two. The answers to those sends are read on the same passes (read_on_grid)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: list[tuple[float, int, _Sender]] = []  # a heap: (when due on the grid, order, sender)
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._readable: select.epoll | None = None  # the sockets read on the grid, once there are any
        self._readers: dict[int, Callable[[], None]] = {}  # their file descriptors -> what reads each
        self._awaited = 0  # reads on the grid that something waits for: the passes go on while any does
        self.late: LateSink | None = None  # told each pass's lateness: the event loop's, measured for free

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> Pacer:
        """The loop's pacer."""
        pacer = _PACERS.get(loop)
        if pacer is None:
            pacer = _PACERS[loop] = cls(loop)
        return pacer

    def repeat(self, interval: float, send: Callable[[], None], count: int | None = None) -> asyncio.Future[None]:
        """Call `send` now and then every `interval` seconds, `count` times (None: until the
        future returned is cancelled). The future is done after the last send, or with the
        exception `send` raised. After a stall the sends catch up by at most 1 s, one per pass
        of the event loop, never in a burst."""
        sender = _Sender(interval, send, count, self._loop.create_future(), self._loop.time())
        if count == 0:
            sender.done.set_result(None)
        else:
            self._enqueue(sender)
            self._arm()
        return sender.done

    def _enqueue(self, sender: _Sender) -> None:
        when = sender.due
        if sender.interval >= PACE_SECONDS:  # a sender more often than the step is not rounded (as sleep_until)
            when = math.ceil(when / PACE_SECONDS) * PACE_SECONDS
        heapq.heappush(self._queue, (when, next(self._order), sender))

    def _arm(self) -> None:
        """The timer at the first sender due, or at the next step of the grid while a read is awaited."""
        first = self._queue[0][0] if self._queue else math.inf
        if self._awaited:
            first = min(first, (math.floor(self._loop.time() / PACE_SECONDS) + 1) * PACE_SECONDS)
        if first == math.inf:
            return
        if self._timer is not None:
            if self._timer.when() <= first:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(first, self._fire)

    def read_on_grid(self, sock: socket.socket, read: Callable[[], None]) -> None:
        """Call `read` on each pass of the grid, before its sends, while `sock` has a datagram or an
        error to read, until stop_reading(sock): the answers of a mesh's paths (each its own length)
        come back apart, and a wake-up of the loop for each cost more than the answer's handling
        (bench/exporter_bench.py --cost). Only for reads that carry their kernel's arrival stamp (a
        datagram, a stream's answer), so that the wait for the pass is in no measurement; a read
        that something waits for keeps a pass on every step meanwhile (awaiting)."""
        if self._readable is None:
            self._readable = select.epoll()
        self._readable.register(sock.fileno(), select.EPOLLIN)  # EPOLLERR always
        self._readers[sock.fileno()] = read

    @contextlib.contextmanager
    def awaiting(self) -> Iterator[None]:
        """While in this block, a pass on every step of the grid: something waits for a read on it
        (a request's answer), and the senders' passes alone may be a second apart, or none."""
        self._awaited += 1
        self._arm()
        try:
            yield
        finally:
            self._awaited -= 1

    def stop_reading(self, sock: socket.socket) -> None:
        """No more reads of `sock` (before it is closed: its number is then another socket's)."""
        if self._readers.pop(sock.fileno(), None) is not None and self._readable is not None:
            self._readable.unregister(sock.fileno())

    def read_ready(self) -> None:
        """Each socket of read_on_grid that has something to read, read now: a `read` takes one
        datagram (a socket rarely holds two), and those still ready are read again, in rounds."""
        if self._readable is None:
            return
        for _ in range(READ_ROUNDS_MOST):
            ready = self._readable.poll(0)
            if not ready:
                return
            for fd, _ in ready:
                read = self._readers.get(fd)
                if read is None:
                    continue
                try:
                    read()
                except Exception as exc:  # a prober's bug: logged as the loop logs a reader's; the others read on
                    self._loop.call_exception_handler({"message": "reading on the grid", "exception": exc})

    def _fire(self) -> None:
        assert self._timer is not None
        fired_at, self._timer = self._timer.when(), None
        if self.late is not None:
            self.late.pass_late(max(0.0, self._loop.time() - fired_at))
        self.read_ready()  # the answers first: what timed out is expired by the sends below
        now = self._loop.time()
        until, again = max(now, fired_at), []
        while self._queue and self._queue[0][0] <= until:
            sender = heapq.heappop(self._queue)[2]
            if sender.done.done():  # cancelled: its prober stopped
                continue
            try:
                sender.send()
            except Exception as exc:  # a prober's bug: its run() raises it
                sender.done.set_exception(exc)
                continue
            sender.sent += 1
            if sender.count is not None and sender.sent >= sender.count:
                sender.done.set_result(None)
                continue
            sender.due = max(sender.due + sender.interval, now - 1.0)
            again.append(sender)  # after this pass: one catch-up send per pass
        for sender in again:
            self._enqueue(sender)
        self._arm()


_PACERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pacer] = weakref.WeakKeyDictionary()
