"""The evidence of every throughput test: its whole record (the settings, iperf3's per-interval
rates with each stream's retransmits, cwnd and RTT, both ends' CPU, what bound the test, what it
should have reached and the limit that says so, the ENA counters around it) kept on the host as
one JSON file per test. Bounded by count and bytes, the oldest go first; each file is written
atomically (files.write_atomic: temporary file, fsync, rename), so a restart finds every record
whole and reads them back. A record that does not parse is skipped, counted and removed; a full
disk is counted and the test's metrics go on. /tests serves the store (web/evidence.py),
`pathprobe evidence` bundles it for a support case."""

from __future__ import annotations

import errno
import json
import logging
import math
import re
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .files import write_atomic

if TYPE_CHECKING:
    from .probes import Reason, ThroughputResult
    from .probes.throughput import ThroughputSink

log = logging.getLogger(__name__)

# A record's id: its test's start (UTC, milliseconds) and a random tail, so that ids sort by time
# and two hosts' ids never collide. /tests/<id> accepts only this shape (no path in an id).
ID = re.compile(r"^[0-9]{8}T[0-9]{6}\.[0-9]{3}Z-[0-9a-f]{6}$")
SUFFIX = ".json"
# Why a record was not kept or not read: pathprobe_evidence_errors_total's `reason`.
ERRORS = ("no_space", "io_error", "too_large", "corrupt")


def new_id(started: float) -> str:
    whole = int(started)
    millis = int((started - whole) * 1000)
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(whole))}.{millis:03d}Z-{secrets.token_hex(3)}"


class StoreError(Exception):
    """A record the store could not keep; `reason` is one of ERRORS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Summary:
    """One record as /tests lists it."""

    id: str
    peer: str
    time: float  # the test's start (Unix seconds)
    protocol: str
    streams: int
    direction: str
    result: str  # "ran", or why the test gave no result (a probe failure's reason)
    bits_per_second: float | None  # the receiver's rate (None: no result)
    bound: str  # what of its own ends bound it (ends.judge), "" without a result
    limit: str  # the expected value's binding limit (limits.py), "" where none was rated
    size_bytes: int

    @classmethod
    def of(cls, record: dict[str, Any], size: int) -> Summary:
        """The summary of a parsed record; KeyError, TypeError or ValueError for one not of this shape."""
        result = record.get("result") or {}
        rate = result.get("receiver_bytes_per_second")
        return cls(
            id=str(record["id"]),
            peer=str(record["peer"]),
            time=float(record["started"]),
            protocol=str(record["protocol"]),
            streams=int(record["streams"]),
            direction=str(record["direction"]),
            result=str(record["outcome"]),
            bits_per_second=None if rate is None else float(rate) * 8,
            bound=str(result.get("bound", "")),
            limit=str((record.get("expected") or {}).get("limit", "")),
            size_bytes=size,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "peer": self.peer,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time)),
            "protocol": self.protocol,
            "streams": self.streams,
            "direction": self.direction,
            "result": self.result,
            "bits_per_second": self.bits_per_second,
            "bound": self.bound,
            "limit": self.limit,
        }


class EvidenceStore:
    """The directory of records, at most `max_tests` of them and `max_bytes` together. Written by
    the turns (in a thread off the event loop), read by the web workers and `pathprobe evidence`:
    the index is kept under a lock."""

    def __init__(self, directory: Path, max_tests: int, max_bytes: int):
        self.directory, self.max_tests, self.max_bytes = directory, max_tests, max_bytes
        self._lock = threading.Lock()
        self._index: dict[str, Summary] = {}  # by id, oldest first
        self.errors: Counter[str] = Counter()
        self.evicted = 0
        self.problem: str | None = None  # why the store cannot be used at all (its directory)
        self.readonly = False

    def open(self, readonly: bool = False) -> EvidenceStore:
        """Make the directory and read back what it holds (oldest first), removing temporary files
        of a write cut short and records that do not parse; never raises (`problem` says why not).
        `readonly` (`pathprobe evidence` beside a running exporter): nothing made, removed or evicted."""
        self.readonly = readonly
        try:
            if not readonly:
                self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
            names = sorted(p.name for p in self.directory.iterdir())
        except OSError as exc:
            self.problem = f"{self.directory}: {exc.strerror or exc}"
            what = "unreadable" if readonly else "unusable, tests are not kept"
            log.warning("evidence store %s: %s", what, self.problem)
            return self
        found = {}
        for name in names:
            path = self.directory / name
            if name.startswith(".") and name.endswith(".tmp"):
                if not readonly:
                    _remove(path)  # a write cut short (files.write_atomic's temporary file)
            elif name.endswith(SUFFIX) and ID.match(name.removesuffix(SUFFIX)):
                summary = self._read_summary(path)
                if summary is not None:
                    found[summary.id] = summary
        with self._lock:
            self._index = found
            if not readonly:
                self._evict()
        return self

    def _read_summary(self, path: Path) -> Summary | None:
        try:
            raw = path.read_bytes()
            summary = Summary.of(json.loads(raw), len(raw))
            if summary.id != path.name.removesuffix(SUFFIX):
                raise ValueError(f"its id is {summary.id!r}")
        except OSError as exc:
            self._count("io_error")
            log.warning("evidence record %s not read: %s", path, exc)
            return None
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            self._count("corrupt")
            log.warning("evidence record %s is corrupt (%s)%s", path, exc, "" if self.readonly else ": removed")
            if not self.readonly:
                _remove(path)
            return None
        return summary

    def _count(self, reason: str) -> None:
        with self._lock:
            self.errors[reason] += 1

    def add(self, record: dict[str, Any]) -> Summary:
        """Keep `record` (it has an "id": new_id()), then remove the oldest beyond the bounds;
        StoreError (counted) where it cannot be kept."""
        if self.problem is not None:
            raise self._failed("io_error", self.problem)
        raw = json.dumps(record, separators=(",", ":"), allow_nan=False).encode()
        if len(raw) > self.max_bytes:
            raise self._failed("too_large", f"a record of {len(raw)} bytes is over evidence.max_bytes")
        summary = Summary.of(record, len(raw))
        try:
            write_atomic(self.directory / f"{summary.id}{SUFFIX}", raw, mode=0o640)
        except OSError as exc:
            reason = "no_space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "io_error"
            raise self._failed(reason, f"{self.directory}: {exc.strerror or exc}") from exc
        with self._lock:
            self._index[summary.id] = summary
            self._evict()
        return summary

    def _failed(self, reason: str, detail: str) -> StoreError:
        self._count(reason)
        return StoreError(reason, detail)

    def _evict(self) -> None:
        """The oldest records out until both bounds hold (the lock held)."""
        total = sum(s.size_bytes for s in self._index.values())
        for old in sorted(self._index):
            if len(self._index) <= self.max_tests and total <= self.max_bytes:
                break
            total -= self._index.pop(old).size_bytes
            _remove(self.directory / f"{old}{SUFFIX}")
            self.evicted += 1

    def summaries(self, since: float | None = None, peer: str | None = None) -> list[Summary]:
        """The records kept, newest first; only those of tests started at `since` or later, of `peer`."""
        with self._lock:
            kept = list(self._index.values())
        chosen = [s for s in kept if (since is None or s.time >= since) and (peer is None or s.peer == peer)]
        return sorted(chosen, key=lambda s: s.id, reverse=True)

    def get(self, test_id: str) -> dict[str, Any] | None:
        """The whole record of `test_id`, or None where there is none (or it no longer parses: counted)."""
        with self._lock:
            if test_id not in self._index:
                return None
        path = self.directory / f"{test_id}{SUFFIX}"
        try:
            record = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None  # evicted meanwhile
        except OSError:
            self._count("io_error")
            return None
        except (ValueError, RecursionError):
            self._count("corrupt")
            return None
        return cast("dict[str, Any]", record) if isinstance(record, dict) else None

    def stats(self) -> tuple[int, int]:
        """(records, bytes) kept now."""
        with self._lock:
            return len(self._index), sum(s.size_bytes for s in self._index.values())

    def last_by_test(self) -> dict[tuple[str, str, str, str], str]:
        """The newest record's id of each test (peer, protocol, streams, direction): after a restart,
        the last test's id on /metrics is the one kept before it."""
        last: dict[tuple[str, str, str, str], str] = {}
        with self._lock:
            for s in sorted(self._index.values(), key=lambda s: s.id):
                last[s.peer, s.protocol, str(s.streams), s.direction] = s.id
        return last


class Witness:
    """A test's sink (probes.throughput.ThroughputSink) that hands its outcome on and keeps the
    failure's detail for the record."""

    def __init__(self, sink: ThroughputSink):
        self.sink, self.detail = sink, ""

    def result(self, result: ThroughputResult) -> None:
        self.sink.result(result)

    def failure(self, reason: Reason, detail: str) -> None:
        self.detail = detail
        self.sink.failure(reason, detail)


# Fields of the test's settings (probes.ThroughputTest) left out of a record: what iperf3 runs
# with locally, not what the test was.
PRIVATE_SETTINGS = ("password_file", "binary", "margin_seconds", "kill_at")


def record(  # noqa: PLR0913 - what one test's record holds
    *,
    test_id: str,
    host: str,
    key: tuple[str, str, str, str],
    started: float,
    ended: float,
    outcome: str,
    detail: str = "",
    settings: dict[str, Any],
    result: dict[str, Any] | None = None,
    expected: dict[str, Any] | None = None,
    ena: dict[str, Any] | None = None,
    rtt_median_seconds: float | None = None,
) -> dict[str, Any]:
    """One test's record, as the store keeps it (JSON-ready: paths as strings, non-finite figures None)."""
    peer, protocol, streams, direction = key
    plain: dict[str, Any] = _plain(
        {
            "id": test_id,
            "host": host,
            "peer": peer,
            "protocol": protocol,
            "streams": int(streams),
            "direction": direction,
            "started": started,
            "ended": ended,
            "outcome": outcome,
            "failure": detail or None,
            "settings": {k: v for k, v in settings.items() if k not in PRIVATE_SETTINGS},
            "result": result,
            "expected": expected,
            "ena": ena,
            "rtt_median_seconds": rtt_median_seconds,
        }
    )
    return plain


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("evidence: cannot remove %s: %s", path, exc)
