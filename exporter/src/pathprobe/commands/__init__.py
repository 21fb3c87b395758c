"""The `pathprobe` command: one module per verb group, each with `add_parser(subparsers)`.

Verb groups of other distributions (the lab's `lab` and `demo`) come in through the
entry point group `pathprobe.commands`: each entry point names a module with the same
`add_parser`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from importlib import import_module
from importlib.metadata import entry_points
from types import ModuleType

from .. import build, logs
from ..yamlfile import ConfigError
from . import alerts, aws_performance, capacity, evidence, firewall, flows, limits, plan, probe, run, serve
from .common import EXIT_BAD_INPUT, EXIT_PROBE_FAILED, Parser

VERBS: list[ModuleType] = [
    run,
    serve,
    probe,
    flows,
    alerts,
    capacity,
    plan,
    limits,
    firewall,
    evidence,
    aws_performance,
]

# A program ended by SIGPIPE exits so (128 + 13), as `cat` does under `| head`.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE

log = logging.getLogger("pathprobe")


def plugins() -> list[ModuleType]:
    return [import_module(ep.value) for ep in entry_points(group="pathprobe.commands")]


def build_parser() -> argparse.ArgumentParser:
    # Raw: the --version line (version, commit, Python) unwrapped, one line to read or parse.
    p = Parser(
        prog="pathprobe",
        description="Throughput, RTT and loss between regions.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=build.describe())
    sub = p.add_subparsers(required=True, metavar="COMMAND")
    for module in [*VERBS, *plugins()]:
        module.add_parser(sub)
    # Before the command and after it, as users type them (`pathprobe run --log.level debug`):
    # the command's own options give no default, so that one given before it stays.
    for parser in every_parser(p):
        add_log_options(parser, parser is p)
    return p


def add_log_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """--log.level and --log.format, as Prometheus's exporters spell them; --log-level (and
    "warning") as the earlier releases did. Their defaults only on the `top` parser."""
    parser.add_argument(
        "--log.level",
        "--log-level",
        dest="log_level",
        default="info" if top else argparse.SUPPRESS,
        type=lambda level: "warn" if level == "warning" else level,
        choices=logs.LEVELS,
        help="the least severe records logged (default info)",
    )
    parser.add_argument(
        "--log.format",
        dest="log_format",
        default="logfmt" if top else argparse.SUPPRESS,
        choices=logs.FORMATS,
        help="one line per record: key=value pairs (the default), or a JSON object",
    )


def every_parser(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`parser` and every parser of its commands, theirs, and so on."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # an alias is the same parser
                yield from every_parser(child)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (one line: common.Parser), --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    logs.setup(args.log_level, args.log_format)
    try:
        return _command(args)
    except BrokenPipeError:
        # `pathprobe limits show X --json | head`: as the Python docs' note on SIGPIPE says, the rest
        # of the output goes to /dev/null (the interpreter's flush at exit would fail again).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        return _failed(exc)


def _command(args: argparse.Namespace) -> int:
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone shows here, not at exit where nothing catches it
        return code
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def _failed(exc: Exception) -> int:
    """An error no command caught, in one line: a file named (or made) that cannot be used, exit 2;
    anything else is unexpected, exit 1, with the traceback at --log.level debug."""
    if isinstance(exc, OSError) and exc.filename is not None:
        print(f"pathprobe: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    log.debug("unexpected error", exc_info=exc)
    print(f"pathprobe: unexpected error: {type(exc).__name__}: {exc} (--log.level debug shows where)", file=sys.stderr)
    return EXIT_PROBE_FAILED
