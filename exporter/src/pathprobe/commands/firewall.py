"""`pathprobe firewall`: the nftables table that keeps everyone but the peers off the iperf3 port."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import config, firewall
from .common import EXIT_PROBE_FAILED


def add_parser(sub: Any) -> None:
    f = sub.add_parser(
        "firewall",
        help="print or apply the nftables table admitting only the config's peers to the iperf3 port",
        description="Without --apply or --remove: print the ruleset. The systemd unit applies it before the "
        "exporter starts (as root) and removes it after it stops.",
    )
    f.add_argument("--config", required=True, metavar="FILE", help="the exporter's config file (its peers)")
    what = f.add_mutually_exclusive_group()
    what.add_argument("--apply", action="store_true", help="load the table (replacing an earlier one)")
    what.add_argument("--remove", action="store_true", help="delete the table")
    f.set_defaults(func=cmd_firewall)


def cmd_firewall(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    try:
        if args.apply:
            firewall.apply(cfg)
        elif args.remove:
            firewall.remove()
        else:
            print(firewall.ruleset(cfg), end="")
    except firewall.FirewallError as exc:
        print(f"pathprobe firewall: {exc}", file=sys.stderr)
        return EXIT_PROBE_FAILED
    return 0
