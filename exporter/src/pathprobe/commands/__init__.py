"""The `pathprobe` command: one module per verb group, each with `add_parser(subparsers)`.

Verb groups of other distributions (the lab's `lab` and `demo`) come in through the
entry point group `pathprobe.commands`: each entry point names a module with the same
`add_parser`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module
from importlib.metadata import entry_points
from types import ModuleType

from .. import __version__, logs
from ..yamlfile import ConfigError
from . import alerts, capacity, firewall, limits, plan, probe, run, serve
from .common import EXIT_BAD_INPUT

VERBS: list[ModuleType] = [run, serve, probe, alerts, capacity, plan, limits, firewall]


def plugins() -> list[ModuleType]:
    return [import_module(ep.value) for ep in entry_points(group="pathprobe.commands")]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pathprobe", description="Throughput, RTT and loss between regions.")
    p.add_argument("--version", action="version", version=f"pathprobe {__version__}")
    # As Prometheus's exporters; --log-level (and "warning") as the earlier releases spelled them.
    p.add_argument("--log.level", "--log-level", dest="log_level", default="info",
                   type=lambda level: "warn" if level == "warning" else level, choices=logs.LEVELS,
                   help="the least severe records logged")  # fmt: skip
    p.add_argument("--log.format", dest="log_format", default="logfmt", choices=logs.FORMATS,
                   help="one line per record: key=value pairs, or a JSON object")  # fmt: skip
    sub = p.add_subparsers(required=True, metavar="COMMAND")
    for module in [*VERBS, *plugins()]:
        module.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.setup(args.log_level, args.log_format)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
