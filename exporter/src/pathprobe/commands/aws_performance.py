"""`pathprobe aws-performance`: AWS's own p50 round trip between the Regions (and the AZ IDs) of
the fleet's members, once (a table, or --json), or as a scheduled import served on --serve for
Prometheus to scrape (aws_performance.py)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from .. import aws_performance, config
from ..units import format_seconds
from .common import EXIT_PROBE_FAILED, add_duration


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "aws-performance",
        help="AWS's own p50 round trip between the fleet's Regions and AZs (Network Manager's Infrastructure "
        "Performance), once or as a scheduled import for Prometheus",
        description="Reads the members of an exporter's config (host and peers: their Regions, and their zones "
        "where given as AZ IDs such as apne1-az4) and asks EC2's GetAwsNetworkPerformanceData for AWS's p50 of "
        "every ordered pair. Needs boto3 (the `aws` extra) and ec2:GetAwsNetworkPerformanceData.",
    )
    p.add_argument("--config", required=True, help="an exporter's config file (its host and peers)")
    p.add_argument("--json", action="store_true", help="the newest point of each pair as JSON")
    p.add_argument("--serve", metavar="ADDRESS:PORT", help="import on a schedule and serve /metrics on this address")
    add_duration(p, "--interval", default=300.0, help_text="between imports with --serve (default 5m, at least 1m)")
    p.set_defaults(func=cmd_aws_performance)


def cmd_aws_performance(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    pairs = aws_performance.pairs_of([(cfg.host.region, cfg.host.zone), *((p.region, p.zone) for p in cfg.peers)])
    if not pairs:
        print("pathprobe aws-performance: the members share one Region and give no AZ IDs: no pair", file=sys.stderr)
        return EXIT_PROBE_FAILED
    if args.serve:
        return _serve(pairs, args.serve, max(60.0, args.interval))
    importer = aws_performance.Importer(pairs)
    result = importer.run_once()
    if result != "ok":
        print(f"pathprobe aws-performance: {result}: {importer.last_error}", file=sys.stderr)
        return EXIT_PROBE_FAILED
    newest = sorted(importer.newest.values(), key=lambda p: (p.pair.scope, p.pair.source, p.pair.destination))
    if args.json:
        print(json.dumps([aws_performance.to_json(p) for p in newest], indent=1))
        return 0
    for point in newest:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(point.end))
        print(f"{point.pair.source} -> {point.pair.destination}: p50 {format_seconds(point.seconds)} (to {at})")
    return 0


def _serve(pairs: list[aws_performance.Pair], address: str, interval: float) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    host, _, port = address.rpartition(":")
    registry = CollectorRegistry(auto_describe=False)
    importer = aws_performance.Importer(pairs)
    registry.register(importer)
    start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0", registry=registry)
    stop = threading.Event()
    while not stop.is_set():  # until SIGTERM ends the process
        result = importer.run_once()
        if result != "ok":
            print(f"pathprobe aws-performance: import failed: {result}: {importer.last_error}", file=sys.stderr)
        stop.wait(interval - time.time() % interval)  # on the interval's grid, as AWS's periods are
    return 0
