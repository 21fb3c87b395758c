"""`pathprobe plan`: the slot length, rotation time and tests per day that a host's daily byte
budget allows, from the config the exporter runs (plan.py)."""

from __future__ import annotations

import argparse
from typing import Any

from .. import config
from ..plan import Cadence, plan
from .common import add_length_options


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="the slot length and rotation time that keep a host's throughput tests within its daily byte budget",
        description="Reads a config as the exporter does and prints, for its host: the tests of one rotation and "
        "what they move (at the model's expected peak rates), then the cadence as configured and the cadence "
        "within budget.daily_bytes. The schedule is shared: set the mesh's schedule.slot_seconds to the largest "
        "of its hosts' plans.",
    )
    p.add_argument("--config", required=True, help="the exporter's config file")
    add_length_options(p, "the planned TCP tests", None)
    p.set_defaults(func=cmd_plan)


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:g} s"


def _row(name: str, c: Cadence) -> str:
    return (
        f"| {name} | {c.slot_seconds:g} s | {_duration(c.rotation_seconds)} | {c.tests_per_peer_per_day:,.1f} | "
        f"{c.bytes_per_day / 1e9:,.1f} GB | ${c.cost_per_day:,.2f} |"
    )


def cmd_plan(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)  # a ConfigError lists the problems, exit 2
    p = plan(cfg, args.steady_state)
    peers = len({t.peer for t in p.tests})
    print(
        f"{p.host}: {len(p.tests)} tests per rotation with {peers} peers, {p.bytes_per_rotation / 1e9:,.2f} GB "
        f"(at the expected peak rates); {p.rounds} rounds per rotation; "
        f"budget {p.daily_bytes / 1e9:g} GB a day\n"
    )
    print("| tests | peer | path class | rate | seconds | GB |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for t in p.tests:
        test = f"{t.test.protocol} x{t.test.streams} {t.test.direction}"
        print(
            f"| {test} | {t.peer} | {t.path_class.value} | {t.bits_per_second / 1e9:g} Gbit/s | {t.seconds:g} | "
            f"{t.bytes / 1e9:.3f} |"
        )
    print("\n| cadence | slot | rotation | tests per peer per day | bytes per day | cost per day |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    configured, fits = p.cadence(cfg.schedule.slot_seconds), p.within_budget()
    print(_row("configured", configured))
    print(_row(f"within {p.daily_bytes / 1e9:g} GB a day", fits))
    if p.daily_bytes <= 0:
        print("\nA budget of 0 bytes allows no test: budget.daily_bytes must be set for throughput tests to run.")
    elif configured.bytes_per_day > p.daily_bytes:
        spent = _duration(86400 * p.daily_bytes / configured.bytes_per_day)
        print(
            f"\nThe configured slot spends the budget after {spent} of each day; tests then stop until "
            f"midnight UTC. Set schedule.slot_seconds: {fits.slot_seconds:g}."
        )
    return 0
