"""`pathprobe alerts render`: the recording and alerting rules from the parameters;
`pathprobe alerts prometheus-config`: a Prometheus server's config in one of the layouts."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from ..monitoring import params, prometheus, rules
from ..units import format_prometheus_duration
from .common import EXIT_BAD_INPUT, add_duration, write_output


def add_parser(sub: Any) -> None:
    al = sub.add_parser("alerts", help="Prometheus rules").add_subparsers(required=True, metavar="ACTION")
    ar = al.add_parser("render", help="write the recording and alerting rules from parameters")
    ar.add_argument("--params", help="YAML of parameters (see alerts/README.md); default: the defaults")
    ar.add_argument("--out", help="file to write (atomically); default: standard output")
    ar.set_defaults(func=cmd_render)
    ap = al.add_parser(
        "prometheus-config", help="write prometheus.yml for one server of a layout: single, regional or global"
    )
    ap.add_argument(
        "--layout",
        choices=["single", "regional", "global"],
        default="single",
        help="single: one server scrapes every exporter; regional: one per region, remote-writing "
        "its aggregates to the global one; global: receives them, scrapes nothing (docs/fleet.md; default single)",
    )
    ap.add_argument("--file-sd", help="file_sd file of the exporters this server scrapes (single, regional)")
    ap.add_argument("--rules", action="append", default=[], help="a rule file (repeat)")
    ap.add_argument("--alertmanager", action="append", default=[], help="HOST:PORT of an Alertmanager (repeat)")
    ap.add_argument("--remote-write-url", help="the global Prometheus's /api/v1/write (regional)")
    ap.add_argument(
        "--external-label",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an external label of this server, e.g. prometheus=regional-tokyo (repeat)",
    )
    add_duration(ap, "--interval", default=60.0, help_text="scrape and evaluation interval, e.g. 30s (default 1m)")
    ap.add_argument("--scrape-json", help="JSON added to the pathprobe scrape job (scheme, tls_config, basic_auth)")
    ap.add_argument("--out", help="file to write (atomically); default: standard output")
    ap.set_defaults(func=cmd_prometheus_config)


def cmd_prometheus_config(args: argparse.Namespace) -> int:
    labels = dict(label.partition("=")[::2] for label in args.external_label)
    try:
        scrape = json.loads(args.scrape_json) if args.scrape_json else None
    except json.JSONDecodeError as exc:
        print(f"pathprobe alerts prometheus-config: --scrape-json: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        cfg = prometheus.render(
            args.layout,
            file_sd=args.file_sd,
            rule_files=args.rules,
            alertmanagers=args.alertmanager,
            remote_write_url=args.remote_write_url,
            external_labels=labels,
            interval=format_prometheus_duration(args.interval),
            scrape=scrape,
        )
    except ValueError as exc:
        print(f"pathprobe alerts prometheus-config: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return write_output(yaml.safe_dump(cfg, sort_keys=False), args.out)


def cmd_render(args: argparse.Namespace) -> int:
    return write_output(rules.dump(params.load_params(args.params)), args.out)
