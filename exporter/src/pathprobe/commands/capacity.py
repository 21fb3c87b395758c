"""`pathprobe capacity`: a stream sweep (or 30 days of history from Prometheus)
turned into a capacity review."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

from .. import ena, ends, instance_types, prediction
from ..capacity import Review, Row, text_report
from ..config import ClockSettings, Iperf3Settings, Limits, PathClass, Peer, Responders
from ..files import write_atomic
from ..html_report import html_report
from ..limits import ADV_WIN_SCALE_DEFAULT, SEND_SHARE, expected, host_buffer_max, kernel_window_share
from ..probe_settings import EchoSettings, RttSettings, SteadyStateSettings
from ..probes import EchoProber, ProbeFailure, RttProber, Target, ThroughputProber, ThroughputTest
from ..probes.report import ReportSink, RttReport, Summary
from ..strict import default
from ..units import format_seconds, parse_cli_rate, parse_quantity
from .capacity_history import from_prometheus
from .common import (
    add_clock_option,
    add_duration,
    add_length_options,
    bitrate_arg,
    detector,
    empty_review,
    host_arg,
    own_clock_bound,
)

EXIT_REFUSED = 2
BUSY_RETRIES = 5


def add_parser(sub: Any) -> None:
    c = sub.add_parser("capacity", help="capacity review: stream sweep, limit diagnosis, time and cost to move data")
    c.add_argument(
        "target", nargs="?", type=host_arg, help="the peer's address (runs `pathprobe serve` or the exporter)"
    )
    _add_test_options(c)
    c.add_argument("--volume", default="40TB", help="data set to move (e.g. 40TB)")
    c.add_argument("--price-per-gb", type=float, default=0.02, help="transfer price, $/GB")
    c.add_argument(
        "--path-class",
        choices=[p.value for p in PathClass],
        default="inter_region",
        help="the path's class, which decides its limits (default inter_region)",
    )
    c.add_argument("--instance-type", default="", help="this host's EC2 instance type")
    c.add_argument("--peer-instance-type", default="", help="the target's EC2 instance type")
    c.add_argument("--receiver-rmem", help="receiver's tcp_rmem max (default: this host's, read from /proc)")
    c.add_argument("--sender-wmem", help="sender's tcp_wmem max (default: this host's, read from /proc)")
    c.add_argument("--window-share", type=float, help="share of a buffer TCP keeps in flight (default: by kernel)")
    c.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=RATE",
        help="override a limit of the path, as a peer's `limits:` does (repeatable): "
        + ", ".join(LIMIT_NAMES)
        + "; e.g. per_flow=5G",
    )
    c.add_argument("--max-bytes", default="20GB", help="refuse a sweep that may move more, unless --yes")
    c.add_argument("--yes", action="store_true", help="run even above --max-bytes")
    c.add_argument("--port", type=int, default=default(Iperf3Settings, "port"), help="the target's iperf3 port")
    c.add_argument(
        "--report-port",
        type=int,
        default=default(Responders, "rr_port"),
        help="the target's rr port, where its responder reports its end of each test; 0: do not ask",
    )
    c.add_argument(
        "--rr-port", type=int, default=default(Responders, "rr_port"), help="the target's TCP request/response port"
    )
    c.add_argument(
        "--echo-port",
        type=int,
        default=default(Responders, "echo_port"),
        help="the target's UDP echo port (one-way delays)",
    )
    add_clock_option(c, "to judge the one-way delays with the target's")
    c.add_argument("--json", action="store_true", help="the review as JSON, keys with their units")
    c.add_argument("--report", metavar="FILE", help="write a self-contained HTML report here")
    c.add_argument("--plan", metavar="FILE", help="a saved `--predict --json`: show the measurement beside it")
    c.add_argument("--from-prometheus", metavar="URL", help="build the review from stored history instead")
    c.add_argument("--peer", help="with --from-prometheus: the peer's name")
    c.add_argument("--host", dest="source_host", help="with --from-prometheus: the source host (target label)")
    _add_predict_options(c)
    c.set_defaults(func=cmd_capacity)


def _add_test_options(c: Any) -> None:
    """What each test of the sweep is: streams, length, protocol, rate, direction."""
    c.add_argument("--streams", default="1,4,8,16,32,64", help="comma-separated stream counts")
    add_duration(c, "--duration", default=5.0, help_text="per test (default 5s)")
    add_duration(c, "--omit", default=1.0, help_text="slow start left out of each test (default 1s)")
    add_length_options(c, "TCP tests", default(SteadyStateSettings, "enabled"))
    c.add_argument("--protocol", choices=["tcp", "udp"], default="tcp", help="tcp (the default) or udp")
    c.add_argument(
        "--bitrate",
        type=bitrate_arg("--bitrate"),
        default=1e9,
        metavar="RATE",
        help="UDP: total target rate per test in bits/s, as iperf3's -b (default 1G)",
    )
    c.add_argument("--reverse", action="store_true", help="measure target -> this host")


def _add_predict_options(c: Any) -> None:
    p = c.add_argument_group("--predict: a plan from instance types, no target (docs/SOURCES.md for the defaults)")
    p.add_argument("--predict", action="store_true", help="predict the sweep instead of measuring it")
    p.add_argument("--from", dest="from_type", metavar="TYPE", help="the sender's EC2 instance type")
    p.add_argument("--to", dest="to_type", metavar="TYPE", help="the receiver's EC2 instance type")
    add_duration(p, "--rtt", unit="ms", help_text="the path's RTT (e.g. 8ms)")
    p.add_argument(
        "--iperf3-version",
        default=prediction.DEFAULT_IPERF3_VERSION,
        help="the receiver's iperf3 (a thread per stream from 3.16, one per process before: what its CPU carries; "
        "default %(default)s)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="iperf3 processes a test is split over (iperf3.processes; default %(default)s)",
    )
    p.add_argument("--rmem-max", help=f"the receiver's tcp_rmem max (default {prediction.DEFAULT_RMEM_MAX}, Linux's)")
    p.add_argument("--wmem-max", help=f"the sender's tcp_wmem max (default {prediction.DEFAULT_WMEM_MAX}, Linux's)")
    p.add_argument(
        "--kernel",
        default="6.1",
        help="the hosts' kernel release, for the window share's default "
        "(before 6.6: 1 - 2^-tcp_adv_win_scale; 6.6 on: 0.78)",
    )
    p.add_argument(
        "--tcp-adv-win-scale",
        type=int,
        default=ADV_WIN_SCALE_DEFAULT,
        help="the receiver's tcp_adv_win_scale (kernels before 6.6)",
    )
    p.add_argument(
        "--send-share",
        type=float,
        default=SEND_SHARE,
        help="share of tcp_wmem max the sender keeps in flight (payload/truesize)",
    )


def _fail(message: str, code: int = EXIT_REFUSED) -> int:
    print(f"pathprobe capacity: {message}", file=sys.stderr)
    return code


def _sweep(
    args: argparse.Namespace,
    peer: Peer,
    streams: list[int],
    buffers: tuple[int | None, int | None],
    amounts: tuple[float, float, float],
) -> Review | int:
    """The review of a sweep against args.target: its RTT and one-way delays, then its tests, once
    what they may move at most is within --max-bytes (else the exit status of the refusal).
    `buffers`: (receiver rmem, sender wmem); `amounts`: (volume, UDP bitrate, max bytes)."""
    volume, bitrate, max_bytes = amounts
    review = empty_review(args, args.target, buffers, volume)
    review.rtt_seconds = measure_rtt(args.target, args.rr_port, review)
    review.one_way = measure_one_way(args.target, args.echo_port, args.clock_error_bound, review)
    remote = ("--sender-wmem", args.sender_wmem) if args.reverse else ("--receiver-rmem", args.receiver_rmem)
    if args.protocol == "tcp" and not remote[1]:
        review.notes.append(f"the target's buffer is taken to be this host's; pass {remote[0]} if it differs")
    # Before sending anything: what may this sweep move at most?
    worst = sum(_expected(args, peer, s, review, bitrate).bits_per_second for s in streams)
    bound = worst / 8 * (args.duration + args.omit)
    print(
        f"this sweep runs {len(streams)} tests of {args.duration:g}+{args.omit:g} s and may move up to "
        f"{bound / 1e9:.3g} GB (at the expected rates)",
        file=sys.stderr,
    )
    if bound > max_bytes and not args.yes:
        return _fail(
            f"that is over --max-bytes {max_bytes / 1e9:g} GB (inter-region transfer is billed): "
            "pass --yes, or fewer --streams or a shorter --duration"
        )
    review.rows = asyncio.run(sweep(args, streams, bitrate, review.rtt_seconds))
    return review


def cmd_capacity(args: argparse.Namespace) -> int:
    if args.predict:
        return cmd_predict(args)
    try:
        streams = sorted({int(s) for s in args.streams.split(",")})
        volume = parse_quantity(args.volume, "--volume")
        max_bytes = parse_quantity(args.max_bytes, "--max-bytes")
        bitrate = args.bitrate
        rmem = _buffer(args.receiver_rmem, "--receiver-rmem", "rmem")
        wmem = _buffer(args.sender_wmem, "--sender-wmem", "wmem")
        if not streams or min(streams) < 1 or max(streams) > 128:
            raise ValueError("--streams: counts from 1 to 128")
        overrides = _overrides(args.limit)
        plan = prediction.read_plan(Path(args.plan)) if args.plan else None
    except ValueError as exc:
        return _fail(str(exc))
    # The limits read the path's class, the peer's instance type and the overrides (no address).
    peer = Peer(
        name=args.peer or args.target or "peer",
        address="0.0.0.0",
        region="-",
        limits=overrides,
        path_class=PathClass(args.path_class),
        instance_type=args.peer_instance_type,
    )
    if args.from_prometheus:
        if not args.peer:
            return _fail("--from-prometheus needs --peer")
        review = from_prometheus(args, streams, peer, (rmem, wmem), volume)
    else:
        if not args.target:
            return _fail("give a TARGET, or --from-prometheus URL --peer NAME")
        measured = _sweep(args, peer, streams, (rmem, wmem), (volume, bitrate, max_bytes))
        if isinstance(measured, int):
            return measured
        review = measured
    for row in review.rows:
        row.expected = _expected(args, peer, row.streams, review, bitrate)
    if args.report:
        write_atomic(Path(args.report), html_report(review))
    _print_review(review, plan, args.json)
    return 0 if review.measured() else 1


def _print_review(review: Review, plan: dict[int, dict[str, Any]] | None, as_json: bool) -> None:
    """The review, and with --plan each stream count beside what the plan predicted."""
    beside = prediction.against_plan({r.streams: r.bits_per_second for r in review.rows}, plan) if plan else None
    if as_json:
        doc = review.to_json()
        if beside is not None:
            doc["against_plan"] = beside
        print(json.dumps(doc, indent=2))
    else:
        print(text_report(review) + ("\n\n" + prediction.against_plan_text(beside) if beside is not None else ""))


def _predict_inputs(args: argparse.Namespace) -> prediction.Inputs:
    """The plan's inputs; a ValueError names the option at fault."""
    if not args.from_type or not args.to_type or args.rtt is None:
        raise ValueError("--predict needs --from TYPE, --to TYPE and --rtt (e.g. 8ms)")
    rtt = args.rtt
    if not 0 < rtt <= 10:
        raise ValueError(f"--rtt: {format_seconds(rtt)} is not an RTT above 0 and at most 10 s")
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?([-.+~].*)?", args.kernel):
        raise ValueError(f"--kernel: {args.kernel!r} is not a kernel release (e.g. 6.1, 6.8.0-1015-aws)")
    if not -4 <= args.tcp_adv_win_scale <= 4 or args.tcp_adv_win_scale == 0:
        raise ValueError("--tcp-adv-win-scale: from -4 to 4, not 0 (the kernel's range)")
    for opt, share in (("--window-share", args.window_share), ("--send-share", args.send_share)):
        if share is not None and not 0 < share <= 1:
            raise ValueError(f"{opt}: {share:g} is not a share above 0 and at most 1")
    buffers = []
    for opt, text, default_bytes in (
        ("--rmem-max", args.rmem_max, prediction.DEFAULT_RMEM_MAX),
        ("--wmem-max", args.wmem_max, prediction.DEFAULT_WMEM_MAX),
    ):
        size = int(parse_quantity(text, opt)) if text else default_bytes
        if size < 4096:
            raise ValueError(f"{opt}: {size} B is below the kernel's 4096 B minimum")
        buffers.append(size)
    share = args.window_share or kernel_window_share(args.kernel, args.tcp_adv_win_scale)
    if not ends.valid_version(args.iperf3_version):
        raise ValueError(f"--iperf3-version: {args.iperf3_version!r} is not a version (e.g. 3.12, 3.16)")
    if not 1 <= args.processes <= 64:
        raise ValueError("--processes: from 1 to 64")
    inputs = prediction.Inputs(
        args.from_type,
        args.to_type,
        PathClass(args.path_class),
        rtt,
        buffers[0],
        buffers[1],
        share,
        args.send_share,
        _overrides(args.limit),
        args.iperf3_version,
        args.processes,
    )
    unknown = prediction.unknown_types(inputs)
    if unknown:
        raise ValueError(
            f"unknown instance type {', '.join(unknown)} (not in the instance-type table: "
            f"{instance_types.load().cited()}; `pathprobe limits show TYPE` checks a name)"
        )
    return inputs


def cmd_predict(args: argparse.Namespace) -> int:
    """The sweep the model predicts for two instance types: no target, nothing sent."""
    try:
        if args.target or args.from_prometheus:
            raise ValueError("--predict takes no TARGET and no --from-prometheus")
        streams = sorted({int(s) for s in args.streams.split(",")})
        if not streams or min(streams) < 1 or max(streams) > 128:
            raise ValueError("--streams: counts from 1 to 128")
        volume = parse_quantity(args.volume, "--volume") if args.volume else None
        if args.price_per_gb is not None and args.price_per_gb < 0:
            raise ValueError("--price-per-gb: must not be negative")
        inputs = _predict_inputs(args)
    except ValueError as exc:
        return _fail(str(exc))
    rows = prediction.predict(inputs, streams)
    if args.json:
        print(json.dumps(prediction.to_json(inputs, rows, volume, args.price_per_gb), indent=2))
    else:
        print(prediction.text_report(inputs, rows, volume, args.price_per_gb))
    return 0


LIMIT_NAMES = ("per_flow", "instance", "instance_peak", "region_cap", "transit_gateway", "expected")


def _overrides(given: list[str]) -> Limits:
    """The --limit NAME=RATE options as the path's limits."""
    try:
        return Limits(**{f"{name}_bits_per_second": rate for name, rate in map(_limit, given)})
    except ValueError as exc:
        raise ValueError(f"--limit: {exc}") from exc


def _limit(text: str) -> tuple[str, float]:
    name, _, rate = text.partition("=")
    if name not in LIMIT_NAMES or not rate:
        raise ValueError(f"{text!r} is not NAME=RATE with NAME one of {', '.join(LIMIT_NAMES)}")
    return name, parse_cli_rate(rate, f"--limit {name}")


def _buffer(text: str | None, what: str, which: str) -> int | None:
    return int(parse_quantity(text, what)) if text else host_buffer_max(which)


def _expected(args: argparse.Namespace, peer: Peer, streams: int, review: Review, bitrate: float) -> Any:
    return expected(
        peer,
        args.instance_type,
        args.protocol,
        streams,
        review.receiver_rmem_max,
        review.rtt_seconds,
        bitrate,
        sender_wmem_max=review.sender_wmem_max,
        share=review.window_share,
    )


def measure_rtt(target: str, port: int, review: Review) -> float | None:
    """RTT p50 over 20 back-to-back request/response exchanges (None, with a note, if refused)."""
    report = RttReport("tcp", 0.01, 1)
    settings = RttSettings(interval_seconds=0.01, size_bytes=1, timeout_seconds=2.0)
    asyncio.run(RttProber(Target(target, port), settings, ReportSink(report)).run(count=20))
    s = Summary.of(report.rtts)
    if s is None:
        review.notes.append(
            f"no RTT from {target}:{port} ({', '.join(report.failures) or 'no answer'}): "
            "the receive-window bound is not computed"
        )
        return None
    return s.p50


def measure_one_way(target: str, port: int, clock: ClockSettings, review: Review) -> dict[str, Any] | None:
    """One-way delays each way from 50 UDP echoes (half a second), judged by both clocks' error
    bounds (None, with a note, if nothing answered)."""
    report = RttReport(
        "udp",
        0.01,
        default(EchoSettings, "size_bytes"),
        own_bound=own_clock_bound(clock),
        max_error_share=clock.max_error_share,
    )
    settings = EchoSettings(rate_pps=100, timeout_seconds=2.0)
    asyncio.run(EchoProber(Target(target, port), settings, ReportSink(report)).run(count=50))
    if report.received == 0:
        review.notes.append(f"no UDP echo answer from {target}:{port}: the one-way delays are not known")
        return None
    return report.one_way()


async def sweep(args: argparse.Namespace, streams: list[int], bitrate: float, rtt: float | None) -> list[Row]:
    rows = []
    interface = ena.interface("")  # the ENA allowance counters of the default route's interface
    steady = detector(args)
    for n in streams:
        test = ThroughputTest(
            args.protocol,
            n,
            "receive" if args.reverse else "send",
            args.duration,
            args.omit,
            udp_bitrate=bitrate,
            steady_state=steady,
            rtt_hint_seconds=rtt,
            report_port=args.report_port or None,
        )
        for attempt in range(BUSY_RETRIES):
            before = ena.read(interface)
            try:
                r = await ThroughputProber(Target(args.target, args.port), test).measure()
                after = ena.read(interface)
                rows.append(
                    Row(
                        n,
                        r.receiver_bytes_per_second * 8,
                        r.retransmits,
                        r.udp_loss_ratio,
                        allowance_exceeded=ena.rose(before, after) if after is not None else None,
                        rtt_under_load_seconds=r.sender_rtt_seconds,
                        ends_bound=r.bound,
                        remedy=r.remedy,
                    )
                )
                break
            except ProbeFailure as exc:
                if exc.reason == "busy" and attempt < BUSY_RETRIES - 1:
                    await asyncio.sleep(2)
                    continue
                rows.append(Row(n, None, error=f"{exc.reason}: {exc.detail}"))
                break
        print(
            f"  {n} stream(s): {rows[-1].bits_per_second / 1e9:.3f} Gbit/s"
            if rows[-1].bits_per_second
            else f"  {n} stream(s): {rows[-1].error}",
            file=sys.stderr,
        )
    return rows
