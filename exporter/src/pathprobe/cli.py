"""The `pathprobe` command."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import os
import signal
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import yaml

from . import __version__, capacity_cli, config, lab_cli, responders, wire
from .allow import AllowList
from .collector import registry
from .exporter import Exporter
from .monitoring import params, rules
from .probes import EchoProber, ProbeFailure, RttProber, Target, ThroughputProber, ThroughputResult, ThroughputTest
from .probes.report import ReportSink, RttReport, Summary
from .units import format_bits, format_seconds, parse_quantity
from .web import serve
from .yamlfile import ConfigError

log = logging.getLogger("pathprobe")

EXIT_PROBE_FAILED = 1
EXIT_BAD_INPUT = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pathprobe", description=__doc__)
    p.add_argument("--version", action="version", version=f"pathprobe {__version__}")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run the responders only (iperf3 server, TCP RR, UDP echo)")
    s.add_argument("--listen", default="0.0.0.0", type=ipaddress.ip_address)
    s.add_argument(
        "--allow",
        action="append",
        default=[],
        type=_network,
        metavar="CIDR",
        help="source networks to answer (repeatable); default: loopback only",
    )
    s.add_argument("--rr-port", type=int, default=9470)
    s.add_argument("--echo-port", type=int, default=9470)
    s.add_argument("--iperf3-port", type=int, default=5201)
    s.add_argument("--iperf3", default="iperf3", help="iperf3 binary")
    s.add_argument("--rr-max-connections-per-source", type=int, default=4)
    s.set_defaults(func=cmd_serve)

    probe = sub.add_parser("probe", help="one-shot probes for humans").add_subparsers(required=True, metavar="PROBE")
    t = probe.add_parser("throughput", help="iperf3 test against a peer's iperf3 server")
    t.add_argument("target")
    t.add_argument("--port", type=int, default=5201)
    t.add_argument("--streams", "-P", type=int, default=1)
    t.add_argument("--duration", "-t", type=float, default=5)
    t.add_argument("--omit", "-O", type=float, default=1)
    t.add_argument("--protocol", choices=["tcp", "udp"], default="tcp")
    t.add_argument("--bitrate", "-b", default="100M", help="UDP total target rate, bits/s (e.g. 500M)")
    t.add_argument("--reverse", "-R", action="store_true", help="measure peer -> this host")
    t.add_argument("--congestion", "-C", choices=["cubic", "bbr", "reno"])
    t.add_argument("--window", "-w", help="socket buffer size, bytes (e.g. 4Mi)")
    t.add_argument("--iperf3", default="iperf3", help="iperf3 binary")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_probe_throughput)

    r = probe.add_parser("rtt", help="TCP request/response RTT (as netperf TCP_RR)")
    r.add_argument("target")
    r.add_argument("--port", type=int, default=9470)
    r.add_argument("--count", "-c", type=int, default=20)
    r.add_argument("--interval", "-i", type=float, default=0.1, help="seconds between requests")
    r.add_argument("--size", type=int, default=1, help="request and response size, bytes")
    r.add_argument("--timeout", type=float, default=1.0)
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_probe_rtt)

    lo = probe.add_parser("loss", help="UDP echo stream: loss, jitter, RTT, duplicates, reordering")
    lo.add_argument("target")
    lo.add_argument("--port", type=int, default=9470)
    lo.add_argument("--count", "-c", type=int, default=100)
    lo.add_argument("--rate", type=float, default=50, help="packets per second")
    lo.add_argument("--size", type=_echo_size, default=64, help=f"bytes per packet, {wire.ECHO_HEADER.size} to 1400")
    lo.add_argument("--timeout", type=float, default=2.0, help="seconds before a packet counts as lost")
    lo.add_argument("--json", action="store_true")
    lo.set_defaults(func=cmd_probe_loss)

    c = sub.add_parser("check-config", help="validate a config file (exit 2 listing every error)")
    c.add_argument("file")
    c.set_defaults(func=cmd_check_config)

    run = sub.add_parser("run", help="the exporter: responders, scheduled probes, /metrics")
    run.add_argument("--config", required=True)
    run.set_defaults(func=cmd_run)

    al = sub.add_parser("alerts", help="Prometheus rules").add_subparsers(required=True, metavar="ACTION")
    ar = al.add_parser("render", help="write the recording and alerting rules from parameters")
    ar.add_argument("--params", help="YAML of alerts parameters (see alerts/README.md); default: the defaults")
    ar.add_argument("--out", help="file to write (atomically); default: standard output")
    ar.set_defaults(func=cmd_alerts_render)

    aw = al.add_parser("webhook-routing", help="alertmanager.yml with every receiver a webhook (lab, laptop)")
    aw.add_argument("--url", required=True, help="the webhook receiver's URL")
    aw.add_argument("--config", default="alerts/alertmanager.yml", help="the production Alertmanager config")
    aw.add_argument("--out", help="file to write (atomically); default: standard output")
    aw.set_defaults(func=cmd_alerts_webhook_routing)

    lab_cli.add_parsers(sub)
    capacity_cli.add_parser(sub)
    return p


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a network: {text!r}") from exc


def _echo_size(text: str) -> int:
    size = int(text)
    if not wire.ECHO_HEADER.size <= size <= 1400:
        raise argparse.ArgumentTypeError(f"{size} is outside {wire.ECHO_HEADER.size}..1400 bytes")
    return size


def _quantity(text: str | None, what: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_quantity(text, what)
    except ValueError as exc:
        raise SystemExit(f"pathprobe: {exc}") from exc


async def _until_signalled(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


# --- serve -------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    allow = AllowList(args.allow or ["127.0.0.0/8", "::1/128"])
    settings = config.Responders(
        listen=args.listen,
        rr_port=args.rr_port,
        echo_port=args.echo_port,
        rr_max_connections_per_source=args.rr_max_connections_per_source,
    )
    iperf_settings = config.Iperf3Settings(binary=args.iperf3, port=args.iperf3_port)

    async def serve() -> None:
        stop = asyncio.Event()
        await _until_signalled(stop)
        counts: Counter[tuple[str, str]] = Counter()
        running = await responders.start(settings, iperf_settings, allow, lambda r, res: counts.update([(r, res)]))
        print(
            f"pathprobe serve: iperf3 :{args.iperf3_port}, tcp rr :{args.rr_port}, udp echo :{args.echo_port}; "
            f"answering {allow}",
            flush=True,
        )
        await stop.wait()
        await running.close()
        print(
            "requests by outcome: " + (", ".join(f"{r} {res}={n}" for (r, res), n in sorted(counts.items())) or "none")
        )

    try:
        asyncio.run(serve())
    except responders.ResponderError as exc:
        print(f"pathprobe: {exc}", file=sys.stderr)
        return EXIT_PROBE_FAILED
    return 0


# --- one-shot probes ---------------------------------------------------------
def _fail(probe: str, target: str, exc: ProbeFailure) -> int:
    print(f"pathprobe: {probe} probe to {target} failed: {exc.reason}: {exc.detail}", file=sys.stderr)
    return EXIT_PROBE_FAILED


def cmd_probe_throughput(args: argparse.Namespace) -> int:
    window = _quantity(args.window, "--window")
    test = ThroughputTest(
        address=args.target, port=args.port, protocol=args.protocol, streams=args.streams,
        direction="receive" if args.reverse else "send", duration_seconds=args.duration,
        omit_seconds=args.omit, congestion=args.congestion,
        udp_bitrate=_quantity(args.bitrate, "--bitrate") or 100e6,
        window_bytes=int(window) if window else None,
    )  # fmt: skip
    try:
        result = asyncio.run(ThroughputProber(args.iperf3).run(test))
    except ProbeFailure as exc:
        return _fail("throughput", args.target, exc)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(describe_throughput(args.target, result))
    return 0


def describe_throughput(target: str, r: ThroughputResult) -> str:
    way = "->" if r.direction == "send" else "<-"
    lines = [
        f"throughput this host {way} {target}: {r.protocol.upper()}, {r.streams} stream(s), "
        f"{r.duration_seconds:g} s (+{r.omit_seconds:g} s omitted)",
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


def _finish_rtt(args: argparse.Namespace, probe: str, report: RttReport) -> int:
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(describe_rtt(args.target, report))
    if report.received == 0:
        reason = max(report.failures, key=lambda k: report.failures[k]) if report.failures else "timeout"
        print(
            f"pathprobe: {probe} probe to {args.target} failed: {reason}: no answer to {report.sent} request(s)",
            file=sys.stderr,
        )
        return EXIT_PROBE_FAILED
    return 0


def cmd_probe_rtt(args: argparse.Namespace) -> int:
    report = RttReport("tcp", args.interval, args.size)
    settings = config.RttSettings(interval_seconds=args.interval, size_bytes=args.size, timeout_seconds=args.timeout)
    client = RttProber(Target(args.target, args.port), settings, ReportSink(report))
    asyncio.run(client.run(count=args.count))
    return _finish_rtt(args, "rtt", report)


def cmd_probe_loss(args: argparse.Namespace) -> int:
    report = RttReport("udp", 1 / args.rate, args.size)
    settings = config.LossSettings(rate_pps=args.rate, size_bytes=args.size, timeout_seconds=args.timeout)
    asyncio.run(EchoProber(Target(args.target, args.port), settings, ReportSink(report)).run(count=args.count))
    return _finish_rtt(args, "loss", report)


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
            f"  jitter {format_seconds(r.jitter_seconds)}, duplicates {r.duplicates}, "
            f"reordered {r.reordered}, late {r.late}"
        )
    if r.failures:
        lines.append("  failures: " + ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items())))
    return "\n".join(lines)


# --- config and exporter -----------------------------------------------------
def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = config.load(args.file)
    print(f"{args.file}: ok ({cfg.host.name}, {len(cfg.peers)} peers)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    exporter = Exporter(cfg)
    server = serve(cfg.web, registry(exporter.collector))
    log.info("pathprobe %s for %s: metrics on %s", __version__, cfg.host.name, cfg.web.listen)

    async def run() -> None:
        stop = asyncio.Event()
        await _until_signalled(stop)
        await exporter.run(stop)

    try:
        asyncio.run(run())
    except responders.ResponderError as exc:
        print(f"pathprobe: {exc}", file=sys.stderr)
        return EXIT_PROBE_FAILED
    finally:
        server.shutdown()
    return 0


def cmd_alerts_render(args: argparse.Namespace) -> int:
    return _write(rules.dump(params.load_params(args.params)), args.out)


def cmd_alerts_webhook_routing(args: argparse.Namespace) -> int:
    cfg = rules.webhook_routing(Path(args.config).read_text(), args.url)
    return _write(rules.WEBHOOK_HEADER.format(url=args.url) + yaml.safe_dump(cfg, sort_keys=False), args.out)


def _write(text: str, out: str | None) -> int:
    """To a file, atomically (all or nothing), or to standard output."""
    if out:
        path = Path(out)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
