"""The continuous probes' shared timer (probes.pacer.Pacer), on a real event loop."""

import asyncio
import itertools
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from pathprobe import stamps
from pathprobe.probes.pacer import PACE_SECONDS, Pacer


def passes(loop: asyncio.AbstractEventLoop) -> Callable[[], int]:
    """The number of passes the loop has made since (a callback that schedules itself again)."""
    count = 0

    def tick() -> None:
        nonlocal count
        count += 1
        loop.call_soon(tick)

    loop.call_soon(tick)
    return lambda: count


def test_a_counted_sender_sends_that_many_on_the_grid_then_its_future_is_done() -> None:
    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        pacer, sent = Pacer.of(loop), [0]
        done = pacer.repeat(PACE_SECONDS * 2, lambda: sent.__setitem__(0, sent[0] + 1), count=4)
        first_due = pacer._queue[0][0]  # now, rounded up to the grid
        await done
        return sent[0], first_due

    sent, first_due = asyncio.run(main())
    assert sent == 4
    assert math.isclose(first_due / PACE_SECONDS, round(first_due / PACE_SECONDS), abs_tol=1e-6)


def test_senders_due_in_one_step_are_sent_by_one_timer_callback() -> None:
    """Twenty senders started at one instant: their sends share the loop's passes (one callback
    sends all that are due), where a task each would wake twenty times."""

    async def main() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        pacer, now = Pacer.of(loop), passes(loop)
        sent_in: list[list[int]] = [[] for _ in range(20)]
        # One instant for the twenty starts: started microseconds apart on the real clock, a few fall
        # into the next step of the grid when a step's edge passes between them (as it did in a CI run).
        started_at = loop.time()
        loop.time = lambda: started_at  # type: ignore[method-assign]
        try:
            senders = [pacer.repeat(0.2, lambda i=i: sent_in[i].append(now()), count=3) for i in range(20)]  # type: ignore[misc]
        finally:
            del loop.time  # the class's clock again
        await asyncio.gather(*senders)
        return sent_in

    sent_in = asyncio.run(main())
    assert all(len(s) == 3 for s in sent_in)
    # One pass of the loop per round of sends, not twenty.
    assert len({p for sender in sent_in for p in sender}) == 3


def test_a_cancelled_sender_stops_and_the_others_go_on() -> None:
    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        pacer = Pacer.of(loop)
        counts = [0, 0]

        def bump(i: int) -> None:
            counts[i] += 1

        stopped = pacer.repeat(PACE_SECONDS, lambda: bump(0))
        going = pacer.repeat(PACE_SECONDS, lambda: bump(1), count=10)
        while counts[0] < 2:
            await asyncio.sleep(PACE_SECONDS)
        stopped.cancel()
        at_cancel = counts[0]
        await going
        return counts[0] - at_cancel, counts[1]

    after_cancel, others = asyncio.run(main())
    assert after_cancel == 0
    assert others == 10


def test_a_send_that_raises_ends_its_sender_with_the_error_only() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        pacer = Pacer.of(loop)
        sent = []

        def broken() -> None:
            raise RuntimeError("a prober's bug")

        failing = pacer.repeat(PACE_SECONDS, broken)
        healthy = pacer.repeat(PACE_SECONDS, lambda: sent.append(1), count=5)
        with pytest.raises(RuntimeError, match="a prober's bug"):
            await failing
        await healthy
        return len(sent)

    assert asyncio.run(main()) == 5


def test_after_a_stall_a_sender_catches_up_one_send_per_pass() -> None:
    """A blocked loop (0.5 s) behind a sender of 100 a second: its missed sends follow one per
    pass of the loop, never several in one callback."""

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        now, sent_in = passes(loop), []
        done = Pacer.of(loop).repeat(0.01, lambda: sent_in.append(now()), count=60)
        await asyncio.sleep(0.05)
        time.sleep(0.5)  # the stall: the loop is blocked
        await done
        return len(sent_in), max(sent_in.count(p) for p in set(sent_in))

    sends, most_in_one_pass = asyncio.run(main())
    assert sends == 60
    assert most_in_one_pass == 1


def test_a_loop_has_one_pacer() -> None:
    async def main() -> bool:
        loop = asyncio.get_running_loop()
        return Pacer.of(loop) is Pacer.of(loop)

    assert asyncio.run(main())
    assert asyncio.run(main())  # and a new loop a new one (the old one's is forgotten with it)


def test_datagrams_are_read_on_the_senders_passes_not_as_each_arrives() -> None:
    """Twenty datagrams arriving 7 ms apart (as a mesh's answers come back, each path its own length)
    while a sender sends every 0.1 s: all are read, each on one of the sender's passes (none on a pass
    of its own), after the kernel stamped its arrival."""
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer,
    ):
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        stamps.enable(sock)

        def answers() -> None:
            for i in range(20):
                time.sleep(0.007)
                peer.sendto(bytes([i]), sock.getsockname())

        async def main() -> tuple[list[int], int, list[tuple[int, int, int]]]:
            loop = asyncio.get_running_loop()
            pacer, now = Pacer.of(loop), passes(loop)
            sent_in: list[int] = []
            read: list[tuple[int, int, int]] = []  # (pass, arrival stamp, read time), ns

            def take() -> None:
                _, ancdata, _, _ = sock.recvmsg(16, stamps.CMSG_SPACE)
                arrived = stamps.kernel_time(ancdata)
                assert arrived is not None
                read.append((now(), arrived, time.time_ns()))

            pacer.read_on_grid(sock, take)
            answering = threading.Thread(target=answers)
            answering.start()
            await pacer.repeat(0.1, lambda: sent_in.append(now()), count=5)
            await asyncio.to_thread(answering.join)
            last = now()
            pacer.read_ready()  # what came after the last send (a slow machine's)
            pacer.stop_reading(sock)
            return sent_in, last, read

        sent_in, last, read = asyncio.run(main())
    assert len(read) == 20
    read_in = [p for p, _, _ in read]
    assert set(read_in) <= {*sent_in, last}, (sent_in, last, read_in)
    assert all(arrived <= taken for _, arrived, taken in read)


def test_a_reader_that_raises_is_logged_and_the_other_sockets_are_read() -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as bad,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as good,
    ):
        for sock in (bad, good):
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
            sock.sendto(b"x", sock.getsockname())

        async def main() -> tuple[list[bytes], list[dict[str, Any]]]:
            loop = asyncio.get_running_loop()
            logged: list[dict[str, Any]] = []
            loop.set_exception_handler(lambda _, context: logged.append(context))
            pacer, got = Pacer.of(loop), []

            def broken() -> None:
                bad.recv(16)
                raise RuntimeError("a prober's bug")

            pacer.read_on_grid(bad, broken)
            pacer.read_on_grid(good, lambda: got.append(good.recv(16)))
            await pacer.repeat(PACE_SECONDS, lambda: None, count=2)
            pacer.stop_reading(bad)
            pacer.stop_reading(good)
            return got, logged

        got, logged = asyncio.run(main())
    assert got == [b"x"]
    assert [str(c["exception"]) for c in logged] == ["a prober's bug"]


def test_an_awaited_read_is_made_on_the_next_step_with_no_sender_and_then_no_pass_is_made() -> None:
    """A request's answer awaited on the grid (an RTT probe's): with no sender to make passes, one
    is made on every step of the grid while it is awaited, and the answer is read in one; once
    nothing is awaited, none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)

        async def main() -> tuple[list[tuple[float, float]], float | None, int]:
            loop = asyncio.get_running_loop()
            pacer, read = Pacer.of(loop), loop.create_future()
            fire, passes_at = pacer._fire, []  # each pass's time on the grid, and when it ran

            def counted() -> None:
                assert pacer._timer is not None
                passes_at.append((pacer._timer.when(), loop.time()))
                fire()

            def reader() -> None:
                sock.recv(16)
                read.set_result(passes_at[-1][0] if passes_at else None)  # the pass it was read in

            pacer._fire = counted  # type: ignore[method-assign]
            pacer.read_on_grid(sock, reader)
            loop.call_later(0.12, sock.sendto, b"x", sock.getsockname())
            async with asyncio.timeout(30):  # no pass at all: a hang otherwise
                with pacer.awaiting():
                    read_in = await read
            passes_then = len(passes_at)
            await asyncio.sleep(4 * PACE_SECONDS)
            pacer.stop_reading(sock)
            return passes_at[:passes_then], read_in, len(passes_at) - passes_then

        passes_at, read_in, passes_after = asyncio.run(main())
    assert read_in == passes_at[-1][0]  # read in the last pass of the wait
    assert all(math.isclose(t / PACE_SECONDS, round(t / PACE_SECONDS), abs_tol=1e-6) for t, _ in passes_at)
    # One a step while it was awaited: each pass on the first step after the one before ran (a pass that
    # ran late, at nice 19 beside three labs, leaves out the steps it missed, and no more).
    for (when, ran), (following, _) in itertools.pairwise(passes_at):
        assert following <= max(when, ran) + PACE_SECONDS + 1e-6, passes_at
    assert passes_at[-1][0] - passes_at[0][0] >= 0.12 - 2 * PACE_SECONDS  # the wait's passes until the answer
    assert passes_after <= 1  # the pass armed as the wait ended, at most
