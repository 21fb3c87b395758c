"""`pathprobe alerts render`: the recording and alerting rules from the parameters."""

from __future__ import annotations

import argparse
from typing import Any

from ..monitoring import params, rules
from .common import write_output


def add_parser(sub: Any) -> None:
    al = sub.add_parser("alerts", help="Prometheus rules").add_subparsers(required=True, metavar="ACTION")
    ar = al.add_parser("render", help="write the recording and alerting rules from parameters")
    ar.add_argument("--params", help="YAML of parameters (see alerts/README.md); default: the defaults")
    ar.add_argument("--out", help="file to write (atomically); default: standard output")
    ar.set_defaults(func=cmd_render)


def cmd_render(args: argparse.Namespace) -> int:
    return write_output(rules.dump(params.load_params(args.params)), args.out)
