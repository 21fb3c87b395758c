"""Config reloads (SIGHUP, POST /-/reload): one at a time, and off the event loop.

Reading and checking a 10,000-member config and computing its schedule takes seconds; on the
event loop the responders would not answer meanwhile and peers would count this host's RTT
probes and echoes as lost. So the file is read in a thread, the schedule (a sampled 10,000-member
mesh: 2.5 million pairs, long sorts that hold the interpreter's lock, a gigabyte) is computed in a
process of its own that hands back only this host's view of it (a small mesh's, in a thread: a new
interpreter costs more than the schedule), and just the swap runs on the
loop (Exporter.apply). Requests that arrive while a reload runs are answered by one more reload
after it: a burst of SIGHUPs costs two reloads, not one per signal, and each answer comes from a
reload that read the file after it was asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TypeVar

from . import config
from .exporter import Exporter, Prepared, ReloadError, epoch_too_far_ahead, schedule_view
from .yamlfile import ConfigError

log = logging.getLogger(__name__)
T = TypeVar("T")
A = TypeVar("A")
_SPAWN = multiprocessing.get_context("spawn")
# Up to this many members the schedule is computed in a thread: 2.4-2.8 ms of an idle 2-core VM
# (200 members: 13-30 ms, in calls that hold the interpreter's lock from the responders). A child
# process costs a new interpreter's start: reloads of a 6-host lab took 0.4-1.8 s each, and six
# hosts reloading at once beside three other labs on a busy 2-core VM took over 20 s.
SCHEDULE_IN_THREAD_MEMBERS = 100


class Reloads:
    def __init__(
        self,
        exporter: Exporter,
        path: str | Path,
        also: Callable[[], object] | None = None,
        applied: Callable[[], None] = lambda: None,
    ):
        """`also`: read again at each reload besides the config (the web config file), in a thread;
        it logs and counts its own outcome, which leaves the config's untouched. `applied`: told when
        a new config is in force (/metrics renders at once: a peer the reload removed is gone from the
        next scrape, not from one a render interval later)."""
        self.exporter, self.path, self.also, self.applied = exporter, path, also, applied
        self._wanted = asyncio.Event()
        self._next: asyncio.Future[str | None] | None = None  # the answer of the next reload to start

    def request(self) -> asyncio.Future[str | None]:
        """Ask for a reload (on the loop). The future holds None when the config was applied,
        else what is wrong with it."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        self._wanted.set()
        return self._next

    async def run(self) -> None:
        """Reloads as requested, until cancelled."""
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            answer, self._next = self._next, None
            if self.also is not None:
                await in_daemon_thread(self.also)
            problem = await self._reload()
            if answer is not None and not answer.done():
                answer.set_result(problem)

    async def _reload(self) -> str | None:
        started = time.monotonic()
        try:
            prepared = await self._prepare()
        except (ConfigError, ReloadError) as exc:
            problem = str(exc)
        except Exception as exc:  # never let the reloads stop: the next SIGHUP must still work
            log.exception("config reload failed")
            problem = f"{type(exc).__name__}: {exc}"
        else:
            applying = time.monotonic()
            self.exporter.apply(prepared)
            self.exporter.rooms.host.reloaded(ok=True)
            self.applied()
            if (late := epoch_too_far_ahead(prepared.cfg, time.time())) is not None:
                log.warning("%s: %s", self.path, late)
            log.info(
                "config reload: read and prepared in %.2f s off the event loop, applied in %.3f s on it",
                applying - started,
                time.monotonic() - applying,
            )
            await in_daemon_thread(release_memory)
            return None
        self.exporter.rooms.host.reloaded(ok=False)
        log.error("config reload refused: %s", problem)
        return problem

    async def _prepare(self) -> Prepared:
        cfg = await in_daemon_thread(lambda: load_with_peers(self.path))
        self.exporter.check_reloadable(cfg)
        if len(cfg.members) <= SCHEDULE_IN_THREAD_MEMBERS:
            return Prepared(cfg, await in_daemon_thread(lambda: schedule_view(cfg)))
        return Prepared(cfg, await in_child_process(schedule_view, cfg))


def load_with_peers(path: str | Path) -> config.Config:
    cfg = config.load(path, check_files=True)
    # Chosen here, off the event loop: the swap reads them, and a 10,000-member mesh's choice took
    # 0.3 s of a busy 2-core VM, long enough with the rest to time out a peer's RTT probe of this host.
    _ = cfg.probed_peers, cfg.compact_peers
    return cfg


async def in_daemon_thread(work: Callable[[], T]) -> T:
    """`work` in a thread of its own that does not hold up the process's exit (asyncio.to_thread's
    pool would make SIGTERM wait for a long reload to finish)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, exc: BaseException | None) -> None:
        if done.done():
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        try:
            outcome: tuple[T | None, BaseException | None] = (work(), None)
        except BaseException as exc:  # handed to the awaiting coroutine
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=target, name="reload", daemon=True).start()
    return await done


async def in_child_process(work: Callable[[A], T], arg: A) -> T:
    """`work(arg)` in a new Python process (spawned: a fork would copy this one's threads' locks);
    killed if the awaiting task is cancelled."""
    receiving, sending = _SPAWN.Pipe(duplex=False)
    child = _SPAWN.Process(target=_child, args=(work, arg, sending), name="pathprobe-reload", daemon=True)

    def start() -> None:
        child.start()
        sending.close()

    # Started off the event loop: start() pickles `arg` and writes it to the child while the child's
    # interpreter boots (0.7 s for a 10,000-member config on an idle 2-core VM, over a second on a
    # busy one), and on the loop that would hold up the responders' answers: every peer's RTT probe
    # of this host timed out once per large reload.
    starting = asyncio.ensure_future(in_daemon_thread(start))
    try:
        await asyncio.shield(starting)
        ok, value = await in_daemon_thread(receiving.recv)
    except EOFError:
        raise RuntimeError(f"the reload's process ended without an answer (exit code {child.exitcode})") from None
    finally:

        def end() -> None:
            # Killed whether or not it answered: cancelled, the child's end closes and the waiting thread
            # reads EOF; answered, its gigabyte need not be freed object by object.
            if child.is_alive():
                child.kill()
            if child.pid is not None:  # started
                child.join()

        def end_off_loop(_: object = None) -> None:
            # Joined in a thread: waiting for the child's exit on the loop took 0.2 s of a busy 2-core VM.
            threading.Thread(target=end, name="reload-end", daemon=True).start()

        if starting.done():
            end_off_loop()
        else:  # cancelled while it starts: ended once started
            starting.add_done_callback(end_off_loop)
    receiving.close()
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _child(work: Callable[[A], T], arg: A, sending: Connection) -> None:
    try:
        sending.send((True, work(arg)))
    except Exception as exc:
        sending.send((False, exc))


def release_memory() -> None:
    """Give the memory of the replaced config back to the system: Python frees its objects, but
    glibc keeps the freed heap (RSS stayed at 270 MB after reloading from 10,000 members to one).
    No gc.collect() first: the old config has no cycles (refcounting freed it), and a full collection
    holds the interpreter lock while it walks the new one (0.36 s of a busy 2-core VM at 10,000
    members), which the responders wait for."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    libc = ctypes.CDLL(name)
    if hasattr(libc, "malloc_trim"):  # glibc only
        libc.malloc_trim(0)
