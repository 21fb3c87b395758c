"""`pathprobe limits`: the instance-type table from AWS's own data (`import`) and what
the model uses for a type (`show`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from .. import instance_types, limits
from .common import EXIT_BAD_INPUT, EXIT_PROBE_FAILED

EXIT_API_FAILED = EXIT_PROBE_FAILED


def add_parser(sub: Any) -> None:
    p = sub.add_parser("limits", help="expected limits: the instance-type table from AWS's data, and what a type gets")
    verbs = p.add_subparsers(required=True, metavar="VERB")

    i = verbs.add_parser(
        "import",
        help="write the instance-type table from a DescribeInstanceTypes response (files, moto's snapshot or the API)",
        description="Read DescribeInstanceTypes output (`aws ec2 describe-instance-types > FILE`, one or several "
        "pages or files, gzip or not; or moto's snapshot, a dict keyed by type) and write the table atomically. "
        "Bad input names the file, the type and the field, exits 2 and leaves the previous table as it was.",
    )
    i.add_argument("files", nargs="*", type=Path, metavar="FILE", help="DescribeInstanceTypes output")
    i.add_argument("--moto", action="store_true", help="read the snapshot in the installed moto package")
    i.add_argument("--live", action="store_true", help="call DescribeInstanceTypes with boto3 (pathprobe[aws])")
    i.add_argument("--region", help="with --live: the region to ask (default: boto3's, e.g. AWS_REGION)")
    i.add_argument("--endpoint-url", help="with --live: the EC2 endpoint (e.g. a VPC endpoint)")
    i.add_argument(
        "--as-of",
        type=dt.date.fromisoformat,
        metavar="YYYY-MM-DD",
        help="the date of the data (default: today for --live, else the input file's modification date)",
    )
    i.add_argument("--source", help="describe where the data came from (default: from the input)")
    i.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"where to write (default: the table pathprobe uses, {instance_types.packaged_path()})",
    )
    i.set_defaults(func=cmd_import)

    s = verbs.add_parser("show", help="the figures the model uses for an instance type, each with source and date")
    s.add_argument("instance_type", metavar="TYPE", help="an EC2 instance type, e.g. c6gn.xlarge")
    s.add_argument("--json", action="store_true", help="JSON; keys carry units (baseline_bits_per_second, ...)")
    s.add_argument("--table", type=Path, help="an instance-type table to read (default: the packaged one)")
    s.set_defaults(func=cmd_show)


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> int:
    print(f"pathprobe limits: {message}", file=sys.stderr)
    return code


def cmd_import(args: argparse.Namespace) -> int:
    given = sum([bool(args.files), args.moto, args.live])
    if given != 1:
        return _fail("give FILE..., or --moto, or --live (one of them)")
    if (args.region or args.endpoint_url) and not args.live:
        return _fail("--region and --endpoint-url go with --live")
    today = dt.datetime.now(dt.UTC).date()
    try:
        if args.live:
            pages = instance_types.fetch_live(args.region, args.endpoint_url)
            where = f"DescribeInstanceTypes ({args.region or 'default region'})"
            types = instance_types.parse((f"{where} page {n}", page) for n, page in enumerate(pages))
            source = args.source or f"EC2 DescribeInstanceTypes, live API, region {args.region or 'default'}"
            as_of = args.as_of or today
        else:
            if args.moto:
                path, version = instance_types.moto_snapshot()
                paths = [path]
                default_source = (
                    f"the DescribeInstanceTypes snapshot in moto {version} (PyPI), moto/ec2/resources/{path.name}"
                )
            else:
                paths = args.files
                default_source = "EC2 DescribeInstanceTypes output: " + ", ".join(p.name for p in paths)
            types = instance_types.from_files(paths)
            source = args.source or default_source
            as_of = args.as_of or max(dt.datetime.fromtimestamp(p.stat().st_mtime, dt.UTC).date() for p in paths)
    except instance_types.ApiError as exc:
        return _fail(str(exc), EXIT_API_FAILED)
    except instance_types.InstanceDataError as exc:
        return _fail(str(exc))
    table = instance_types.Table(source=source, as_of=as_of, generated=today, types=types)
    out = args.out or instance_types.packaged_path()
    try:
        instance_types.write(table, out)
    except OSError as exc:
        return _fail(f"{out}: cannot write: {exc.strerror or exc}")
    burst = sum(1 for t in types.values() if t.burst)
    print(
        f"{out}: {len(types)} instance types ({burst} with a burst above the baseline), data of {as_of}, from {source}"
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    try:
        types = instance_types.read(args.table) if args.table else instance_types.load()
    except instance_types.InstanceDataError as exc:
        return _fail(str(exc))
    try:
        d = limits.describe(args.instance_type, types=types)
    except KeyError:
        return _fail(f"unknown instance type {args.instance_type} (not in the instance-type table: {types.cited()})")
    if args.json:
        print(json.dumps(d, indent=2, ensure_ascii=False))
    else:
        print(text(d))
    return 0


def _gbps(bits: float) -> str:
    return f"{bits / 1e9:g} Gbit/s"


def text(d: dict[str, Any]) -> str:
    cards = d["network_cards"]
    head = (
        f"{d['instance_type']}: {d['default_vcpus']} vCPUs, {len(cards)} network card(s), "
        f"ENA {d['ena_support'] or 'unknown'}, marketed as {d['network_performance'] or '-'!r}"
    )
    lines = [head]
    if len(cards) > 1:
        lines.append(
            f"  {len(cards)} cards, {_gbps(d['total_baseline_bits_per_second'])} baseline / "
            f"{_gbps(d['total_peak_bits_per_second'])} peak in total; one ENI (so every flow pathprobe sends) "
            f"is on one card: the model uses card {d['default_network_card']}'s figures"
        )
    if not d["burst"]:
        lines.append("  fixed bandwidth: baseline = peak")
    labels = {
        "baseline_bits_per_second": "baseline",
        "peak_bits_per_second": "peak (burst)",
        "inter_region_cap_floor_bits_per_second": "inter-region cap (floor)",
        "inter_region_cap_peak_bits_per_second": "inter-region cap (peak)",
        "transit_gateway_bits_per_second": "transit gateway",
    }
    for key, f in d["figures"].items():
        label = labels.get(key) or key.removesuffix("_bits_per_second").replace("_", " ")
        lines.append(f"  {label:<26} {_gbps(f['bits_per_second']):>14}  {f.get('note', '')}")
        lines.append(f"  {'':<26} {'':>14}  source: {f['source']} (date: {f['date']})")
    return "\n".join(lines)
