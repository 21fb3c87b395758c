"""`pathprobe probe throughput|rtt|loss|mtu`: one-shot probes for people, with the exporter's
probers and, by default, the exporter's settings (config.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pydantic import ValidationError

from .. import wire
from ..config import (
    MTU_BY_PATH_CLASS,
    Iperf3Settings,
    LossSettings,
    MtuSettings,
    Responders,
    RttSettings,
    SteadyStateSettings,
    ThroughputSettings,
    default,
)
from ..probes import EchoProber, MtuProber, ProbeFailure, RttProber, Target, ThroughputProber, ThroughputTest
from ..probes.report import ReportSink, RttReport, Summary, describe_one_way
from ..probes.throughput import ThroughputResult
from ..units import format_bits, format_seconds
from .common import (
    EXIT_BAD_INPUT,
    EXIT_PROBE_FAILED,
    add_clock_option,
    add_length_options,
    detector,
    own_clock_bound,
    quantity,
)


def add_parser(sub: Any) -> None:
    probe = sub.add_parser("probe", help="one-shot probes for humans").add_subparsers(required=True, metavar="PROBE")
    for add in (_add_throughput, _add_rtt, _add_loss, _add_mtu):
        add(probe)


def _add_throughput(probe: Any) -> None:
    t = probe.add_parser("throughput", help="iperf3 test against a peer's iperf3 server")
    _target_arguments(t, default(Iperf3Settings, "port"))
    t.add_argument("--streams", "-P", type=int, default=1)
    t.add_argument("--duration", "-t", type=float, default=default(ThroughputSettings, "duration_seconds"))
    t.add_argument("--omit", "-O", type=float, default=default(ThroughputSettings, "omit_seconds"))
    t.add_argument("--protocol", choices=["tcp", "udp"], default="tcp")
    t.add_argument("--bitrate", "-b", default=str(default(ThroughputSettings, "udp_bitrate")),
                   help="UDP total target rate, bits/s (e.g. 500M)")  # fmt: skip
    t.add_argument("--reverse", "-R", action="store_true", help="measure peer -> this host")
    t.add_argument("--congestion", "-C", choices=["cubic", "bbr", "reno"])
    t.add_argument("--window", "-w", help="socket buffer size, bytes (e.g. 4Mi)")
    t.add_argument("--iperf3", default=default(Iperf3Settings, "binary"), help="iperf3 binary")
    add_length_options(t, "TCP tests", default(SteadyStateSettings, "enabled"))
    t.add_argument(
        "--rtt-hint",
        type=float,
        metavar="SECONDS",
        help="the path's RTT, for the steady-state window (default: its shortest window)",
    )
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_throughput)


def _continuous(probe: Any, name: str, help: str, port: int, count: int) -> Any:  # noqa: A002 - argparse's word
    """The parser of a continuous probe run a few times: its target, port and count."""
    p = probe.add_parser(name, help=help)
    _target_arguments(p, port)
    p.add_argument("--count", "-c", type=int, default=count)
    return p


def _target_arguments(p: Any, port: int) -> None:
    p.add_argument("target")
    p.add_argument("--port", type=int, default=port)
    p.add_argument("--source", help="the local address to send from (default: the route's)")


def _target(args: argparse.Namespace) -> Target:
    return Target(args.target, args.port, args.source)


def _add_rtt(probe: Any) -> None:
    r = _continuous(probe, "rtt", "TCP request/response RTT (as netperf TCP_RR)", default(Responders, "rr_port"), 20)
    r.add_argument("--interval", "-i", type=float, default=default(RttSettings, "interval_seconds"),
                   help="seconds between requests")  # fmt: skip
    r.add_argument("--size", type=int, default=default(RttSettings, "size_bytes"), help="request and response size")
    r.add_argument("--timeout", type=float, default=default(RttSettings, "timeout_seconds"))
    r.add_argument("--flows", type=int, default=default(RttSettings, "flows"), help="connections, used in turn")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_rtt)


def _add_loss(probe: Any) -> None:
    lo = _continuous(probe, "loss", "UDP echo stream: loss by direction, jitter, RTT, failing flows",
                     default(Responders, "echo_port"), 100)  # fmt: skip
    lo.add_argument("--rate", type=float, default=50, help="packets per second")
    lo.add_argument("--size", type=int, default=default(LossSettings, "size_bytes"),
                    help=f"bytes per packet, {wire.ECHO_HEADER.size} to {wire.ECHO_MAX_SIZE}")  # fmt: skip
    lo.add_argument("--timeout", type=float, default=default(LossSettings, "timeout_seconds"),
                    help="seconds before a packet counts as lost")  # fmt: skip
    lo.add_argument("--flows", type=int, default=default(LossSettings, "flows"), help="source ports, used in turn")
    lo.add_argument("--json", action="store_true")
    add_clock_option(lo, "to judge the one-way delays with the responder's")
    lo.set_defaults(func=cmd_loss)


def _add_mtu(probe: Any) -> None:
    m = probe.add_parser("mtu", help="which IP packet sizes the path carries (Don't Fragment set)")
    _target_arguments(m, default(Responders, "echo_port"))
    m.add_argument("--size", type=int, action="append", dest="sizes",
                   help="IP packet size (repeatable); default: " + ", ".join(
                       f"{k} {v}" for k, v in MTU_BY_PATH_CLASS.items()) + " by --path-class")  # fmt: skip
    m.add_argument("--path-class", choices=list(MTU_BY_PATH_CLASS), default="intra_region")
    m.add_argument("--timeout", type=float, default=default(MtuSettings, "timeout_seconds"))
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_mtu)


def _settings(model: Any, **fields: Any) -> Any:
    """The probe's settings model from the command line: a bad value is a clear error (exit 2)."""
    try:
        return model(**fields)
    except ValidationError as exc:
        for e in exc.errors():
            print(f"pathprobe probe: --{'.'.join(map(str, e['loc'])).split('_')[0]}: {e['msg']}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from exc


def _fail(probe: str, target: str, exc: ProbeFailure) -> int:
    print(f"pathprobe: {probe} probe to {target} failed: {exc.reason}: {exc.detail}", file=sys.stderr)
    return EXIT_PROBE_FAILED


def cmd_throughput(args: argparse.Namespace) -> int:
    window = quantity(args.window, "--window")
    test = ThroughputTest(
        protocol=args.protocol, streams=args.streams,
        direction="receive" if args.reverse else "send", duration_seconds=args.duration,
        omit_seconds=args.omit, congestion=args.congestion,
        udp_bitrate=quantity(args.bitrate, "--bitrate") or default(ThroughputSettings, "udp_bitrate"),
        window_bytes=int(window) if window else None,
        steady_state=detector(args), rtt_hint_seconds=args.rtt_hint,
        binary=args.iperf3,
    )  # fmt: skip
    try:
        result = asyncio.run(ThroughputProber(_target(args), test).measure())
    except ProbeFailure as exc:
        return _fail("throughput", args.target, exc)
    print(json.dumps(result.to_json(), indent=2) if args.json else describe_throughput(args.target, result))
    return 0


def describe_throughput(target: str, r: ThroughputResult) -> str:
    way = "->" if r.direction == "send" else "<-"
    lines = [
        f"throughput this host {way} {target}: {r.protocol.upper()}, {r.streams} stream(s), "
        f"{r.duration_seconds:g} s (+{r.omit_seconds:g} s omitted)"
        + ("" if r.converged is None else ", stopped at a steady rate" if r.converged else ", never settled"),
        f"  receiver {format_bits(r.receiver_bytes_per_second * 8)}, "
        f"sender {format_bits(r.sender_bytes_per_second * 8)}",
    ]
    if r.retransmits is not None:
        lines.append(f"  retransmits {r.retransmits}")
    if r.udp_loss_ratio is not None:
        lines.append(
            f"  UDP lost {r.udp_lost}/{r.udp_packets} ({r.udp_loss_ratio:.2%}), "
            f"jitter {format_seconds(r.jitter_seconds or 0)}"
        )
    return "\n".join(lines)


def _finish(args: argparse.Namespace, probe: str, report: RttReport) -> int:
    print(json.dumps(report.to_json(), indent=2) if args.json else describe_rtt(args.target, report))
    if report.received == 0:
        reason = max(report.failures, key=lambda k: report.failures[k]) if report.failures else "timeout"
        print(
            f"pathprobe: {probe} probe to {args.target} failed: {reason}: no answer to {report.sent} request(s)",
            file=sys.stderr,
        )
        return EXIT_PROBE_FAILED
    return 0


def cmd_rtt(args: argparse.Namespace) -> int:
    settings = _settings(RttSettings, interval_seconds=args.interval, size_bytes=args.size,
                         timeout_seconds=args.timeout, flows=args.flows)  # fmt: skip
    report = RttReport("tcp", args.interval, args.size)
    asyncio.run(RttProber(_target(args), settings, ReportSink(report)).run(count=args.count))
    return _finish(args, "rtt", report)


def cmd_loss(args: argparse.Namespace) -> int:
    settings = _settings(LossSettings, rate_pps=args.rate, size_bytes=args.size,
                         timeout_seconds=args.timeout, flows=args.flows)  # fmt: skip
    clock = args.clock_error_bound
    report = RttReport("udp", 1 / args.rate, args.size, own_bound=own_clock_bound(clock),
                       max_error_share=clock.max_error_share)  # fmt: skip
    asyncio.run(EchoProber(_target(args), settings, ReportSink(report)).run(count=args.count))
    return _finish(args, "loss", report)


def cmd_mtu(args: argparse.Namespace) -> int:
    settings = _settings(MtuSettings, timeout_seconds=args.timeout, sizes=args.sizes)
    settings = settings.model_copy(update={"sizes": settings.sizes_for(args.path_class)})
    seen: list[dict[str, Any]] = []

    class Sink:
        def mtu(self, size: int, carried: bool, reason: str | None) -> None:
            seen.append({"size_bytes": size, "carried": carried, "reason": reason})

    asyncio.run(MtuProber(_target(args), settings, Sink()).run(rounds=1))
    if args.json:
        print(json.dumps(seen, indent=2))
    else:
        for s in seen:
            print(f"{s['size_bytes']:>6} bytes: " + ("carried" if s["carried"] else f"not carried ({s['reason']})"))
    return 0 if all(s["carried"] for s in seen) else EXIT_PROBE_FAILED


def describe_rtt(target: str, r: RttReport) -> str:
    kind = "TCP request/response" if r.protocol == "tcp" else "UDP echo"
    lines = [
        f"{kind} to {target}: {r.sent} sent, {r.received} answered, {r.lost} lost ({r.lost / r.sent:.2%})"
        if r.sent
        else f"{kind} to {target}: nothing sent"
    ]
    s = Summary.of(r.rtts)
    if s:
        f = format_seconds
        lines.append(
            f"  rtt min {f(s.min)} p50 {f(s.p50)} mean {f(s.mean)} p99 {f(s.p99)} max {f(s.max)} "
            f"stddev {f(s.stddev)}  (interval {f(r.interval_seconds)}, {r.size_bytes} B)"
        )
    if r.protocol == "udp":
        lines.append(
            f"  lost on the way there {r.lost_forward}, on the way back {r.lost_reverse}; "
            f"RTT variation {format_seconds(r.jitter_seconds)}, duplicates {r.duplicates}, "
            f"reordered {r.reordered}, late {r.late}"
        )
        lines.append("  " + describe_one_way(r.one_way()))
    if r.flows_failing:
        lines.append(f"  {r.flows_failing} flow(s) (source ports) failing: part of the path is broken (ECMP)")
    if r.failures:
        lines.append("  failures: " + ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items())))
    return "\n".join(lines)
