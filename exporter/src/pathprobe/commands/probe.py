"""`pathprobe probe throughput|rtt|loss|mtu`: one-shot probes for people, with the exporter's
probers and, by default, the exporter's settings (config.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pydantic import ValidationError

from .. import ends, wire
from ..config import Iperf3Settings, Responders
from ..probe_settings import (
    MTU_BY_PATH_CLASS,
    EchoSettings,
    MtuSettings,
    RttSettings,
    SteadyStateSettings,
    ThroughputSettings,
)
from ..probes import EchoProber, MtuProber, ProbeFailure, RttProber, Target, ThroughputProber, ThroughputTest
from ..probes.iperf3_test import ThroughputResult
from ..probes.report import ReportSink, RttReport, Summary, describe_one_way
from ..strict import default
from ..units import format_bits, format_seconds
from .common import (
    EXIT_BAD_INPUT,
    EXIT_PROBE_FAILED,
    add_clock_option,
    add_duration,
    add_length_options,
    bitrate_arg,
    detector,
    host_arg,
    own_clock_bound,
    packet_rate_arg,
    quantity,
)


def add_parser(sub: Any) -> None:
    probe = sub.add_parser("probe", help="one-shot probes for humans").add_subparsers(required=True, metavar="PROBE")
    for add in (_add_throughput, _add_rtt, _add_loss, _add_mtu):
        add(probe)


def _add_throughput(probe: Any) -> None:
    t = probe.add_parser("throughput", help="iperf3 test against a peer's iperf3 server")
    _target_arguments(t, default(Iperf3Settings, "port"))
    t.add_argument("--streams", "-P", type=int, default=1, help="parallel TCP streams or UDP flows (default 1)")
    duration_s, omit_s = default(ThroughputSettings, "duration_seconds"), default(ThroughputSettings, "omit_seconds")
    add_duration(
        t,
        "--duration",
        "-t",
        default=duration_s,
        help_text=f"how long the test measures, e.g. 10s (default {format_seconds(duration_s)})",
    )
    add_duration(
        t,
        "--omit",
        "-O",
        default=omit_s,
        help_text=f"slow start left out before measuring, e.g. 1s (default {format_seconds(omit_s)})",
    )
    t.add_argument("--protocol", choices=["tcp", "udp"], default="tcp", help="tcp (the default) or udp")
    udp_bitrate = default(ThroughputSettings, "udp_bitrate")
    t.add_argument(
        "--bitrate",
        "-b",
        type=bitrate_arg("--bitrate"),
        default=udp_bitrate,
        metavar="RATE",
        help=f"UDP: the total target rate in bits/s, as iperf3's -b (e.g. 500M; default {format_bits(udp_bitrate)})",
    )
    t.add_argument("--reverse", "-R", action="store_true", help="measure peer -> this host")
    t.add_argument(
        "--congestion", "-C", choices=["cubic", "bbr", "reno"], help="TCP congestion control (default: the host's)"
    )
    t.add_argument("--window", "-w", metavar="SIZE", help="socket buffer size, bytes (e.g. 4Mi)")
    t.add_argument("--iperf3", default=default(Iperf3Settings, "binary"), help="iperf3 binary")
    t.add_argument(
        "--processes",
        type=int,
        default=default(Iperf3Settings, "processes"),
        help="split the streams over up to this many iperf3 processes, one per server the peer reports "
        "(where either end's iperf3 is older than 3.16: one thread for every stream of a process)",
    )
    t.add_argument(
        "--report-port",
        type=int,
        default=default(Responders, "rr_port"),
        help="the peer's rr port, where its responder reports its end of the test (what its iperf3 and "
        "host used); 0: do not ask",
    )
    add_length_options(t, "TCP tests", default(SteadyStateSettings, "enabled"))
    add_duration(
        t,
        "--rtt-hint",
        unit="ms",
        help_text="the path's RTT, e.g. 8ms, for the steady-state window (default: its shortest window)",
    )
    _json_option(t)
    t.set_defaults(func=cmd_throughput)


def _json_option(p: Any) -> None:
    p.add_argument("--json", action="store_true", help="the result as JSON, keys with their units")


def _continuous(probe: Any, name: str, help: str, port: int, count: int) -> Any:  # noqa: A002 - argparse's word
    """The parser of a continuous probe run a few times: its target, port and count."""
    p = probe.add_parser(name, help=help)
    _target_arguments(p, port)
    p.add_argument("--count", "-c", type=int, default=count, help=f"requests to send (default {count})")
    return p


def _target_arguments(p: Any, port: int) -> None:
    p.add_argument(
        "target", type=host_arg, help="the peer's name or address (it runs `pathprobe serve` or the exporter)"
    )
    p.add_argument("--port", type=int, default=port, help=f"the peer's port (default {port})")
    p.add_argument("--source", help="the local address to send from (default: the route's)")


def _target(args: argparse.Namespace) -> Target:
    return Target(args.target, args.port, args.source)


def _add_rtt(probe: Any) -> None:
    r = _continuous(probe, "rtt", "TCP request/response RTT (as netperf TCP_RR)", default(Responders, "rr_port"), 20)
    interval = default(RttSettings, "interval_seconds")
    add_duration(
        r,
        "--interval",
        "-i",
        default=interval,
        unit="ms",
        help_text=f"time between requests, e.g. 50ms (default {format_seconds(interval)})",
    )
    r.add_argument(
        "--size", type=int, default=default(RttSettings, "size_bytes"), help="request and response size, bytes"
    )
    _timeout_option(r, default(RttSettings, "timeout_seconds"), "before a request counts as lost")
    r.add_argument("--flows", type=int, default=default(RttSettings, "flows"), help="connections, used in turn")
    _json_option(r)
    r.set_defaults(func=cmd_rtt)


def _timeout_option(p: Any, seconds: float, what: str) -> None:
    add_duration(
        p,
        "--timeout",
        default=seconds,
        help_text=f"how long to wait {what}, e.g. 2s (default {format_seconds(seconds)})",
    )


def _add_loss(probe: Any) -> None:
    lo = _continuous(
        probe,
        "loss",
        "UDP echo stream: loss by direction, jitter, RTT, failing flows",
        default(Responders, "echo_port"),
        100,
    )
    lo.add_argument(
        "--rate",
        type=packet_rate_arg("--rate"),
        default=50.0,
        metavar="RATE",
        help="packets per second, e.g. 50/s (the default)",
    )
    lo.add_argument(
        "--size",
        type=int,
        default=default(EchoSettings, "size_bytes"),
        help=f"bytes per packet, {wire.ECHO_HEADER.size} to {wire.ECHO_MAX_SIZE}",
    )
    _timeout_option(lo, default(EchoSettings, "timeout_seconds"), "before a packet counts as lost")
    lo.add_argument("--flows", type=int, default=default(EchoSettings, "flows"), help="source ports, used in turn")
    _json_option(lo)
    add_clock_option(lo, "to judge the one-way delays with the responder's")
    lo.set_defaults(func=cmd_loss)


def _add_mtu(probe: Any) -> None:
    m = probe.add_parser("mtu", help="which IP packet sizes the path carries (Don't Fragment set)")
    _target_arguments(m, default(Responders, "echo_port"))
    m.add_argument(
        "--size",
        type=int,
        action="append",
        dest="sizes",
        help="IP packet size (repeatable); default: "
        + ", ".join(f"{k} {v}" for k, v in MTU_BY_PATH_CLASS.items())
        + " by --path-class",
    )
    m.add_argument(
        "--path-class",
        choices=list(MTU_BY_PATH_CLASS),
        default="intra_region",
        help="the path's class, for the default sizes (default intra_region)",
    )
    _timeout_option(m, default(MtuSettings, "timeout_seconds"), "for a packet's answer")
    _json_option(m)
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
    window = quantity(args.window, "--window")  # a size, not a rate: bytes alone are bytes
    test = ThroughputTest(
        protocol=args.protocol,
        streams=args.streams,
        direction="receive" if args.reverse else "send",
        duration_seconds=args.duration,
        omit_seconds=args.omit,
        congestion=args.congestion,
        udp_bitrate=args.bitrate or default(ThroughputSettings, "udp_bitrate"),  # 0: the default, not unlimited
        window_bytes=int(window) if window else None,
        steady_state=detector(args),
        rtt_hint_seconds=args.rtt_hint,
        binary=args.iperf3,
        report_port=args.report_port or None,
        processes=args.processes,
    )
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
    lines += describe_ends(r)
    return "\n".join(lines)


def describe_ends(r: ThroughputResult) -> list[str]:
    """The test's own ends in words: what each used and could use, and what bound the result."""
    lines = []
    for name, end in (("sender", r.sender_end), ("receiver", r.receiver_end)):
        lines.append(f"  {name} end: {ends.describe(end)}")
    drops = r.udp_receiver_drops()
    if drops:
        path_loss = r.udp_path_loss_ratio()
        lines.append(
            f"  the receiver dropped {drops} datagrams for a full socket buffer"
            + (f": path loss {path_loss:.2%}" if path_loss is not None else "")
        )
    lines.append(f"  bound by its own ends: {ends.describe_bound(r.bound, r.remedy)}")
    return lines


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
    settings = _settings(
        RttSettings,
        interval_seconds=args.interval,
        size_bytes=args.size,
        timeout_seconds=args.timeout,
        flows=args.flows,
    )
    report = RttReport("tcp", args.interval, args.size)
    asyncio.run(RttProber(_target(args), settings, ReportSink(report)).run(count=args.count))
    return _finish(args, "rtt", report)


def cmd_loss(args: argparse.Namespace) -> int:
    settings = _settings(
        EchoSettings, rate_pps=args.rate, size_bytes=args.size, timeout_seconds=args.timeout, flows=args.flows
    )
    clock = args.clock_error_bound
    report = RttReport(
        "udp", 1 / args.rate, args.size, own_bound=own_clock_bound(clock), max_error_share=clock.max_error_share
    )
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
