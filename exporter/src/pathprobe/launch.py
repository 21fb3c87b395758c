"""The `pathprobe` command's entry point. `pathprobe run` reloads its config on SIGHUP, and
SIGHUP's default action ends a process: one sent while the exporter starts (the imports alone
take 0.25 s, a large config seconds) would kill it. So before importing anything else, a
SIGHUP to `pathprobe run` is only remembered; the exporter reloads once its loop runs."""

from __future__ import annotations

import sys

from . import sighup

# The command's options that take a value as the next argument (commands/__init__.py).
_VALUED = ("--log.level", "--log-level", "--log.format")


def verb(argv: list[str]) -> str | None:
    """The verb of `pathprobe [OPTIONS] VERB ...`: its first argument that is no option or option's value."""
    args = iter(argv)
    for arg in args:
        if arg in _VALUED:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def main() -> int:
    if verb(sys.argv[1:]) == "run":
        sighup.remember()
    from .commands import main as command  # after the handler, on purpose

    return command()
