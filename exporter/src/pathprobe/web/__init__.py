"""/metrics over HTTP(S): `snapshot` (the registry rendered in the background, served as it
was last rendered), `app` (the WSGI app: routes, basic auth, reload, readiness) and `server` (the
asyncio HTTP(S) server in a thread of its own, its connections capped and timed out)."""

from .app import make_app
from .server import ConnectionLimits, MetricsServer, raise_fd_limit, serve
from .snapshot import MAX_AGE_SECONDS, RENDER_LEAD, RENDER_MARGIN_SECONDS, Scrapers, Snapshot, Stats

__all__ = [
    "MAX_AGE_SECONDS",
    "RENDER_LEAD",
    "RENDER_MARGIN_SECONDS",
    "ConnectionLimits",
    "MetricsServer",
    "Scrapers",
    "Snapshot",
    "Stats",
    "make_app",
    "raise_fd_limit",
    "serve",
]
