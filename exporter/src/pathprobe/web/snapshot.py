"""/metrics over HTTP(S), optionally with basic auth, served from a snapshot.

Rendering the registry costs time in proportion to peers (about 0.5 s for 500
peers with prometheus_client), and a scrape must never wait on that. So a
background thread renders a snapshot for as long as scrapes keep coming, and a
scrape returns the latest snapshot at once. Only the very first scrape renders in
the request. Prometheus scrapes at a fixed interval, so each render is timed just
ahead of the next scrape expected (Scrapers): a scraper that keeps its interval
reads a snapshot a few render times old, and a render is made per scrape, not per
`refresh` (at a 15 s scrape interval, a third of the renders). Renders are at least
`refresh` seconds apart (`web.refresh_seconds`; more when rendering is slow, so that it never
takes more than 5% of a core) and at most MAX_AGE_SECONDS; with no scraper keeping an
interval, they come every `refresh`.
What a scrape reads says how old it is (pathprobe_scrape_snapshot_age_seconds), and
every result carries its own timestamp metric. A render that raises is logged and
counted (pathprobe_scrape_render_errors_total) and the last good snapshot is served on,
its age growing, until the next render succeeds: /metrics never answers 500 for what
the exporter holds.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections import Counter

from prometheus_client import CollectorRegistry

from ..webconfig import WebConfigSource
from . import formats

log = logging.getLogger(__package__)  # one logger for /metrics: pathprobe.web


REFUSED_REASONS = (
    "busy",
    "source_limit",
    "deadline",
    "timeout",
    "tls_handshake",
    "unauthorized",
    "header_too_large",
    "bad_request",
    "rate_limited",
)


class Stats:
    """Connections refused or cut short, by reason (REFUSED_REASONS); shared by the server and the app."""

    def __init__(self, web_config: WebConfigSource | None = None) -> None:
        self._lock = threading.Lock()
        self.refused: Counter[str] = Counter()
        self.web_config = web_config

    def refuse(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] += 1

    def exposition(self) -> bytes:
        with self._lock:
            counts = dict(self.refused)
        lines = [
            "# HELP pathprobe_web_refused_total Connections to /metrics refused or cut short, by reason.",
            "# TYPE pathprobe_web_refused_total counter",
            *(f'pathprobe_web_refused_total{{reason="{r}"}} {counts.get(r, 0)}' for r in REFUSED_REASONS),
            *(self.web_config.exposition() if self.web_config is not None else []),
        ]
        return ("\n".join(lines) + "\n").encode()


# A render falls due this many render times, and this much more, before the next scrape expected.
RENDER_LEAD, RENDER_MARGIN_SECONDS = 2, 0.1
# The oldest a snapshot gets while scrapes come (unless rendering is slow): half the 30 s after
# which PathprobeMetricsSnapshotStale fires (monitoring params: snapshot_stale_seconds).
MAX_AGE_SECONDS = 15.0


class Scrapers:
    """When each scraper (by source address) is expected next: Prometheus scrapes a target at a
    fixed interval (its scrape_interval, 1m by default), so its next scrape comes one interval
    after its last."""

    def __init__(self, kept: int = 16) -> None:
        self.kept = kept
        self._seen: dict[str, tuple[float, float | None]] = {}  # source -> (last scrape, the interval before it)

    def scraped(self, source: str, now: float) -> None:
        before = self._seen.pop(source, None)
        self._seen[source] = (now, now - before[0] if before else None)
        if len(self._seen) > self.kept:
            del self._seen[next(iter(self._seen))]  # the one unheard of longest

    def next_expected(self, now: float, shortest: float = 0.0) -> float | None:
        """The earliest next scrape of a scraper keeping an interval of at least `shortest` (its last
        scrape less than two intervals ago); None when none does. Past `now` when a scrape is due and late."""
        expected = [
            last + interval
            for last, interval in self._seen.values()
            if interval and interval >= shortest and now - last < 2 * interval
        ]
        return min(expected, default=None)


class Snapshot:
    def __init__(
        self, registry: CollectorRegistry, refresh: float = 5.0, idle_after: float = 300.0, stats: Stats | None = None
    ):
        self.registry = registry
        self.stats = stats
        self.refresh, self.idle_after = refresh, idle_after
        self._lock = threading.Lock()
        self._bodies: dict[str, tuple[bytes, bytes]] = {}  # content type -> body, gzipped (formats.encode)
        # The formats asked for, by content type, the least recently first: their encoder, when last asked.
        self._formats: dict[str, tuple[formats.Encoder, float]] = {}
        self._taken = time.monotonic()  # before the first render: its age counts from the start
        self._render_seconds = 0.0  # the last render's wall-clock time: how far ahead of a scrape to start one
        self._render_cpu_seconds = 0.0  # its CPU time: how far apart renders must be to take at most 5% of a core
        self._tried = self._taken  # when the last render began, whether or not it succeeded
        self._rendered_for: float | None = None  # the expected scrape the thread's last render was timed for
        self._last_scrape = 0.0
        self._scrapers = Scrapers()
        self._scraped = threading.Event()
        self._news = threading.Event()  # a scrape (or close) since the render thread last timed its render
        self._renew = threading.Event()  # what /metrics shows changed (a reload): a render at once
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.render_errors = 0
        self._failing = 0  # renders failed in a row

    def render(self) -> None:
        """A new snapshot; on an error, the last one stays (never raises)."""
        start, cpu_start = time.monotonic(), time.thread_time()
        self._tried = start
        with self._lock:  # a format nobody asked for since `idle_after` is rendered no more
            self._formats = {t: f for t, f in self._formats.items() if start - f[1] < self.idle_after}
            encoders = {t: encoder for t, (encoder, _) in self._formats.items()} or formats.default()
        try:
            bodies = formats.encode(self.registry, encoders)
        except Exception:
            self._failed()
            return
        with self._lock:
            self._bodies, self._taken = bodies, time.monotonic()
            self._render_seconds = self._taken - start
            self._render_cpu_seconds = time.thread_time() - cpu_start
            self._failing = 0

    def _failed(self) -> None:
        with self._lock:
            self.render_errors += 1
            self._failing += 1
            failing = self._failing
        if failing == 1:  # the traceback once; then a line per failure until a render succeeds
            log.exception("rendering /metrics failed: serving the last snapshot, retrying in %g s", self.refresh)
        else:
            log.error("rendering /metrics failed again (%d in a row): serving the last snapshot", failing)

    def next_render(self, now: float) -> float:
        """When the next render falls due: just ahead of the next scrape expected (RENDER_LEAD
        render times before it), so that a scraper keeping its interval reads a snapshot that
        fresh, and every render is read; but no sooner than `refresh` after the last one began (nor
        than 20 times its CPU time: at most 5% of a core; its wall-clock time on a busy host, when the
        render thread waits for a CPU, would hold the next render off for nothing), and no later than
        MAX_AGE_SECONDS after it (a scrape that comes early, or another client, reads no older
        snapshot). With no scraper keeping an interval (the first scrapes, or a client now and then):
        every `refresh`."""
        return self._timing(now)[0]

    def _timing(self, now: float) -> tuple[float, float | None]:
        """next_render's time, and the expected scrape it is timed for (None: not timed for one)."""
        with self._lock:
            floor = self._tried + max(self.refresh, 20 * self._render_cpu_seconds)
            # A scraper more often than `refresh` gets a render per `refresh` (as it always did), not timed for it.
            expected = self._scrapers.next_expected(now, shortest=self.refresh)
            lead = RENDER_LEAD * self._render_seconds + RENDER_MARGIN_SECONDS
        # Rendered for it already (timed for it, or begun within its lead): again only if it is
        # `refresh` late. "Timed for it" counts on its own because the lead moves with each render's
        # time: a render timed with a longer lead than its own time gives would otherwise look early.
        if expected is None:
            due, timed_for = floor, None
        elif self._rendered_for == expected or self._tried >= expected - lead:
            due, timed_for = max(floor, expected + self.refresh), None
        else:
            due, timed_for = max(floor, expected - lead), expected
        capped = max(floor, self._tried + MAX_AGE_SECONDS)
        return (due, timed_for) if due <= capped else (capped, None)

    def renew(self) -> None:
        """A render as soon as the render thread can make one, whatever its timing: a reload changed
        what /metrics shows (peers added or gone), and a scrape must not read the old for seconds.
        Before the first scrape there is nothing to renew: it renders itself."""
        self._renew.set()
        self._news.set()

    def _refresh_loop(self) -> None:
        while not self._closed.is_set():
            self._scraped.wait()
            self._news.clear()
            if self._closed.is_set():
                return
            if self._renew.is_set():
                self._renew.clear()
                self.render()
                continue
            due, timed_for = self._timing(time.monotonic())
            if self._news.wait(max(0.0, due - time.monotonic())):
                continue  # a scrape came meanwhile: the render is timed again (or the snapshot closed)
            self.render()
            self._rendered_for = timed_for
            if time.monotonic() - self._last_scrape > self.idle_after:
                self._scraped.clear()  # nobody scrapes: stop rendering until someone does

    def close(self) -> None:
        """Stop the background renders (a process's last snapshot is never closed: it exits)."""
        self._closed.set()
        self._scraped.set()
        self._news.set()

    def get(self, gzipped: bool = False, source: str = "") -> bytes:
        """The latest snapshot in the text format (`serve`)."""
        return self.serve("", gzipped, source)[0]

    def serve(self, accept: str = "", gzipped: bool = False, source: str = "") -> tuple[bytes, str]:
        """The latest snapshot, plus its age, in the format the Accept header asks for, and its
        content type; gzip members concatenate, so the trailer is a member of its own.
        `source`: the scraper's address, whose interval times the renders."""
        encoder, content_type = formats.choose_encoder(accept)
        self._last_scrape = time.monotonic()
        with self._lock:
            self._scrapers.scraped(source, self._last_scrape)
            # The first scrape in a format renders itself (and the others asked for): the very first
            # scrape, and the first in OpenMetrics; the render thread keeps them all.
            first = content_type not in self._formats
            self._formats.pop(content_type, None)
            self._formats[content_type] = encoder, self._last_scrape
            if len(self._formats) > formats.MAX_FORMATS:
                del self._formats[next(iter(self._formats))]
            if self._thread is None:
                self._thread = threading.Thread(target=self._refresh_loop, name="render", daemon=True)
                self._thread.start()
        if first:
            self.render()
        self._scraped.set()
        self._news.set()
        with self._lock:
            trailer = _trailer(time.monotonic() - self._taken, self._render_seconds, self.render_errors)
        if self.stats is not None:
            trailer += self.stats.exposition()
        trailer = formats.trailer(encoder, content_type, trailer)
        with self._lock:
            body, zipped = self._bodies.get(content_type, (b"", b""))
        if gzipped:
            return zipped + gzip.compress(trailer, compresslevel=1), content_type
        return body + trailer, content_type


def _trailer(age: float, render_seconds: float, render_errors: int) -> bytes:
    return (
        "# HELP pathprobe_scrape_snapshot_age_seconds Age of the metrics snapshot this scrape returned.\n"
        "# TYPE pathprobe_scrape_snapshot_age_seconds gauge\n"
        f"pathprobe_scrape_snapshot_age_seconds {age:.6f}\n"
        "# HELP pathprobe_scrape_render_seconds Time taken to render that snapshot.\n"
        "# TYPE pathprobe_scrape_render_seconds gauge\n"
        f"pathprobe_scrape_render_seconds {render_seconds:.6f}\n"
        "# HELP pathprobe_scrape_render_errors_total Renders of the snapshot that failed (logged); the last good "
        "snapshot is served until one succeeds.\n"
        "# TYPE pathprobe_scrape_render_errors_total counter\n"
        f"pathprobe_scrape_render_errors_total {render_errors}\n"
    ).encode()
