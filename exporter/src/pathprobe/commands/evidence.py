"""`pathprobe evidence`: a bundle for a postmortem or a support case (a .tar.gz): the records of
the tests against a peer since a time (evidence.py's store, read without touching it), the RTT
and loss figures of the path over that time (from Prometheus, with --prometheus), this host's ENA
counters now, AWS's own latency for the Region pair (with --aws: aws_performance.py), and a
MANIFEST.json that says what is in it and what is not, and why."""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from .. import aws_performance, config, ena, promql
from ..evidence import EvidenceStore
from ..files import write_atomic
from .common import EXIT_BAD_INPUT, add_duration

# The path's RTT and loss over the bundle's time, as the recording rules (alerts/) keep them.
PATH_SERIES = {
    "rtt_p50_seconds": 'path:pathprobe_rtt_seconds:p50_5m{{peer="{peer}"}}',
    "rtt_p99_seconds": 'path:pathprobe_rtt_seconds:p99_5m{{peer="{peer}"}}',
    "udp_loss_ratio": 'path:pathprobe_udp_loss_ratio:rate5m{{peer="{peer}"}}',
}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "evidence",
        help="a bundle (.tar.gz) of the tests against a peer, the path's RTT and loss, the ENA counters and "
        "AWS's own latency, for a postmortem or an AWS support case",
        description="Reads the evidence store of the exporter's config (evidence.directory) without changing it, "
        "and writes the records of the tests since --since (against --peer) with MANIFEST.json into --out.",
    )
    p.add_argument("--config", required=True, help="the exporter's config file")
    add_duration(p, "--since", default=7200.0, help_text="how far back (90m, 2h, 1d; default 2h)")
    p.add_argument("--peer", help="only the tests against this peer (its name in the config)")
    p.add_argument("--out", required=True, type=Path, help="the bundle to write (.tar.gz), atomically")
    p.add_argument("--prometheus", help="the Prometheus URL for the path's RTT and loss over the bundle's time")
    p.add_argument("--aws", action="store_true", help="AWS's own latency for the peer's Region pair (boto3)")
    p.set_defaults(func=cmd_evidence)


def cmd_evidence(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    if args.peer is not None and args.peer not in {p.name for p in cfg.peers}:
        print(f"pathprobe evidence: --peer {args.peer!r} is not a peer of {args.config}", file=sys.stderr)
        return EXIT_BAD_INPUT
    until = time.time()
    start = until - args.since
    directory = cfg.evidence.path(cfg.budget, cfg.host.name)
    store = EvidenceStore(directory, cfg.evidence.max_tests, cfg.evidence.max_bytes).open(readonly=True)
    files: dict[str, Any] = {}
    missing: dict[str, str] = {}
    if store.problem is not None:
        missing["tests"] = store.problem
    for summary in store.summaries(since=start, peer=args.peer):
        record = store.get(summary.id)
        if record is not None:
            files[f"tests/{summary.id}.json"] = record
    counters = ena.read(ena.interface(cfg.host.interface))
    files["ena.json"] = {"interface": ena.interface(cfg.host.interface), "read_at": until, "counters": counters}
    if counters is None:
        missing["ena"] = "no ENA counters here (not an ENA interface, or no ethtool): each test's record has its own"
    _path_figures(args, (start, until), files, missing)
    if args.aws:
        _aws_baseline(cfg, args.peer, (start, until), files, missing)
    peer_part = f" against {args.peer}" if args.peer else ""
    manifest = {
        "host": cfg.host.name,
        "region": cfg.host.region,
        "peer": args.peer,
        "from": _iso(start),
        "until": _iso(until),
        "tests": sum(1 for name in files if name.startswith("tests/")),
        "files": sorted(files),
        "missing": missing,
    }
    write_atomic(args.out, _tar({"MANIFEST.json": manifest, **files}), mode=0o640)
    print(f"pathprobe evidence: {manifest['tests']} tests{peer_part} since {manifest['from']} in {args.out}")
    for part, why in missing.items():
        print(f"  not included: {part}: {why}", file=sys.stderr)
    return 0


def _path_figures(
    args: argparse.Namespace, span: tuple[float, float], files: dict[str, Any], missing: dict[str, str]
) -> None:
    if args.prometheus is None:
        missing["rtt_loss"] = "no --prometheus: each test's record has the RTT median before it (rtt_median_seconds)"
        return
    if args.peer is None:
        missing["rtt_loss"] = "no --peer: the path's series are bundled for one peer"
        return
    step = max(60.0, (span[1] - span[0]) / 500)
    try:
        files["rtt_loss.json"] = {
            name: promql.query_range(args.prometheus, expr.format(peer=args.peer), span, step)
            for name, expr in PATH_SERIES.items()
        }
    except (OSError, ValueError, KeyError) as exc:
        missing["rtt_loss"] = f"{args.prometheus}: {exc}"


def _aws_baseline(
    cfg: config.Config, peer: str | None, span: tuple[float, float], files: dict[str, Any], missing: dict[str, str]
) -> None:
    regions = sorted({p.region for p in cfg.peers if peer is None or p.name == peer} - {cfg.host.region})
    if not regions:
        missing["aws_baseline"] = "no peer in another Region: AWS publishes the figure per Region pair"
        return
    pairs = [(cfg.host.region, r) for r in regions]
    try:
        files["aws_baseline.json"] = aws_performance.baseline(cfg.host.region, pairs, *span)
    except aws_performance.AwsError as exc:
        missing["aws_baseline"] = f"{exc.reason}: {exc}"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _tar(members: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, content in members.items():
            raw = json.dumps(content, indent=1).encode()
            info = tarfile.TarInfo(f"evidence/{name}")
            info.size, info.mtime, info.mode = len(raw), int(time.time()), 0o640
            tar.addfile(info, io.BytesIO(raw))
    return out.getvalue()
