"""`pathprobe run` (the exporter) and `pathprobe check-config`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from .. import __version__, config, responders
from ..collector import registry
from ..exporter import Exporter
from ..web import serve
from .common import EXIT_PROBE_FAILED, stop_on_signals

log = logging.getLogger("pathprobe")


def add_parser(sub: Any) -> None:
    c = sub.add_parser("check-config", help="validate a config file (exit 2 listing every error)")
    c.add_argument("file")
    c.set_defaults(func=cmd_check_config)
    r = sub.add_parser("run", help="the exporter: responders, scheduled probes, /metrics")
    r.add_argument("--config", required=True)
    r.set_defaults(func=cmd_run)


def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = config.load(args.file)
    print(f"{args.file}: ok ({cfg.host.name}, {len(cfg.peers)} peers)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    exporter = Exporter(cfg)
    server = serve(cfg.web, registry(exporter.collector))
    log.info("pathprobe %s for %s: metrics on %s", __version__, cfg.host.name, cfg.web.listen)

    async def run() -> None:
        stop = asyncio.Event()
        await stop_on_signals(stop)
        await exporter.run(stop)

    try:
        asyncio.run(run())
    except responders.ResponderError as exc:
        print(f"pathprobe: {exc}", file=sys.stderr)
        return EXIT_PROBE_FAILED
    finally:
        server.shutdown()
    return 0
