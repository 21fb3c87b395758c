"""`pathprobe lab ...` and `pathprobe demo`."""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import yaml

from pathprobe.commands.common import duration_arg, write_output
from pathprobe.units import parse_cli_rate, parse_ratio

from . import alerting, demo, net, shaping, topology
from .caps import HostCaps, host_caps
from .state import LabError, State, ns
from .topology import PathSpec


def add_parser(sub: Any) -> None:
    lab = sub.add_parser("lab", help="several regions on one machine (network namespaces)")
    cmds = lab.add_subparsers(required=True, metavar="ACTION")
    _add_hosts(cmds)
    _add_paths(cmds)
    _add_files(cmds)
    _add_demo(sub)


def _add_hosts(cmds: Any) -> None:
    u = cmds.add_parser("up", help="build the lab's hosts and paths")
    u.add_argument("--topology", help="topology YAML (default: Tokyo, Osaka, Singapore)")
    u.set_defaults(func=cmd_up)

    d = cmds.add_parser("down", help="remove every namespace, rule and process of the lab")
    d.set_defaults(func=cmd_down)

    s = cmds.add_parser("status", help="hosts, paths and processes")
    s.add_argument("--json", action="store_true", help="the status as JSON")
    s.set_defaults(func=cmd_status)

    e = cmds.add_parser("exec", help="run a command inside a lab host: lab exec HOST -- CMD...")
    e.add_argument("host", help="the lab host's name")
    e.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments, after --")
    e.set_defaults(func=cmd_exec)


def _add_paths(cmds: Any) -> None:
    i = cmds.add_parser("impair", help="change one directed path live (SRC -> DST)")
    _path_arguments(i)
    i.add_argument("--rate", metavar="RATE|none", help="bits/s, e.g. 100M; 'none' removes the limit")
    i.add_argument("--delay", type=duration_arg("--delay", "ms"), metavar="DURATION", help="one-way delay, e.g. 40ms")
    i.add_argument("--loss", help="e.g. 2%%")
    i.set_defaults(func=cmd_impair)

    r = cmds.add_parser("restore", help="put a path back as the topology has it")
    _path_arguments(r)
    r.set_defaults(func=cmd_restore)

    f = cmds.add_parser("per-flow-cap", help="change an AWS host's per-flow cap live (caps.py)")
    f.add_argument("host", help="the lab host's name")
    f.add_argument(
        "rate",
        metavar="RATE|restore",
        help="lab bits/s, e.g. 150M; 'restore' for the table's figure at the lab's scale",
    )
    f.set_defaults(func=cmd_per_flow_cap)


def _path_arguments(p: Any) -> None:
    p.add_argument("src", help="the sending host's name")
    p.add_argument("dst", help="the receiving host's name")


def _add_files(cmds: Any) -> None:
    w = cmds.add_parser("webhook-routing", help="alertmanager.yml with every receiver a webhook (lab, laptop)")
    w.add_argument("--url", required=True, help="the webhook receiver's URL")
    w.add_argument("--config", required=True, type=Path, help="the production Alertmanager config")
    w.add_argument("--out", help="file to write (atomically); default: standard output")
    w.set_defaults(func=cmd_webhook_routing)

    c = cmds.add_parser("check-topology", help="validate a topology file")
    c.add_argument("file", help="the topology YAML")
    c.set_defaults(func=cmd_check_topology)


def _add_demo(sub: Any) -> None:
    al = sub.add_parser("alert-log", help="an Alertmanager webhook receiver that logs alerts to a file")
    al.add_argument("--listen", default="127.0.0.1:19099", help="HOST:PORT")
    al.add_argument("--file", required=True, help="append each notification here, one JSON object a line")
    al.set_defaults(func=cmd_alert_log)

    d = sub.add_parser("demo", help="lab + exporters + Prometheus + Alertmanager, with a live table")
    d.add_argument("--topology", help="topology YAML (default: Tokyo, Osaka, Singapore)")
    d.add_argument("--prometheus-port", type=int, default=19090, help="Prometheus's port (default %(default)s)")
    d.add_argument("--alertmanager-port", type=int, default=19093, help="Alertmanager's port (default %(default)s)")
    d.add_argument(
        "--slot-seconds",
        type=float,
        default=demo.SLOT_SECONDS,
        help="the exporters' schedule.slot_seconds (default %(default)s)",
    )
    d.add_argument(
        "--duration",
        type=duration_arg("--duration"),
        default=0.0,
        metavar="DURATION",
        help="stop after this long, e.g. 10m (default 0: until Ctrl-C)",
    )
    d.add_argument(
        "--workdir", default="/var/tmp/pathprobe-demo", help="configs, data and logs go here (default %(default)s)"
    )
    d.add_argument(
        "--alertmanager-routing",
        type=Path,
        metavar="FILE",
        help="production alertmanager.yml whose routing the demo keeps (receivers become the alert log)",
    )

    d.set_defaults(func=cmd_demo)


def _state() -> State:
    state = State.load()
    if state is None:
        raise SystemExit("pathprobe: no lab is up (run `pathprobe lab up`)")
    return state


def _run(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except LabError as exc:
        raise SystemExit(f"pathprobe lab: {exc}") from exc


def cmd_up(args: argparse.Namespace) -> int:
    topo = topology.load(args.topology)
    _run(net.up, topo)
    print_status(net.status())
    return 0


def cmd_check_topology(args: argparse.Namespace) -> int:
    print(f"{args.file}: ok ({len(topology.load(args.file).hosts)} hosts)")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    for line in net.down():
        print(line)
    print("lab is down")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    st = net.status()
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        print_status(st)
    return 0 if st["up"] else 1


def print_status(st: dict[str, Any]) -> None:
    if not st["up"]:
        left = st.get("namespaces_left_over")
        print("lab is down" + (f"; left over: {', '.join(left)} (run `pathprobe lab down`)" if left else ""))
        return
    print(f"lab is up (scale: AWS Gbps = lab Gbit/s x {st['scale']:g})")
    for h in st["hosts"]:
        print(
            f"  {h['name']:14} {h['address']:14} {h['region']:16} {h['zone']:18}"
            f"{'' if h['present'] else ' NAMESPACE MISSING'}"
        )
        if h.get("caps"):
            c = h["caps"]
            print(f"    {h['instance_type']}: {HostCaps(**{k: v for k, v in c.items() if k != 'qdiscs'}).describe()}")
    print("  paths:")
    for p in st["paths"]:
        print(f"    {p['src']:>14} -> {p['dst']:14} {PathSpec(**_spec_fields(p)).describe()}  [{p['path_class']}]")
    for proc in st["processes"]:
        print(f"  {proc['what']}: pid {proc['pid']} {'alive' if proc['alive'] else 'DEAD'}")


def _spec_fields(p: dict[str, Any]) -> dict[str, Any]:
    return {k: p[k] for k in ("rate", "one_way_delay", "loss", "path_class")}


def cmd_exec(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("pathprobe lab exec: give a command after --")
    _state().index(args.host)
    os.execvp("ip", ["ip", "netns", "exec", ns(args.host), *command])
    return 0  # not reached


def cmd_impair(args: argparse.Namespace) -> int:
    state = _state()
    current = state.spec(args.src, args.dst) if f"{args.src}>{args.dst}" in state.paths else None
    if current is None:
        raise SystemExit(f"pathprobe lab: no path {args.src} -> {args.dst}")
    try:
        rate = current.rate
        if args.rate is not None:
            rate = None if args.rate == "none" else parse_cli_rate(args.rate, "--rate")
        delay = args.delay if args.delay is not None else current.one_way_delay
        loss = parse_ratio(args.loss, "--loss") if args.loss is not None else current.loss
    except ValueError as exc:
        raise SystemExit(f"pathprobe lab impair: {exc}") from exc
    spec = PathSpec(rate, delay, loss, current.path_class)
    _run(shaping.set_path, state, args.src, args.dst, spec)
    print(f"{args.src} -> {args.dst}: {spec.describe()}")
    return 0


def cmd_per_flow_cap(args: argparse.Namespace) -> int:
    state = _state()
    host = state.topo().hosts[_run(state.index, args.host) - 1]
    if not host.instance_type:
        raise SystemExit(f"pathprobe lab per-flow-cap: {args.host} names no instance type, so it has no AWS caps")
    try:
        rate = None if args.rate == "restore" else parse_cli_rate(args.rate, "RATE")
    except ValueError as exc:
        raise SystemExit(f"pathprobe lab per-flow-cap: {exc}") from exc
    _run(shaping.set_host_cap, state, args.host, "per_flow_cap", rate)
    caps = host_caps(state.topo(), state.topo().hosts[state.index(args.host) - 1])
    print(f"{args.host}: {caps.describe() if caps else ''}")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    spec = _run(shaping.restore, _state(), args.src, args.dst)
    print(f"{args.src} -> {args.dst}: {spec.describe()} (as in the topology)")
    return 0


def cmd_alert_log(args: argparse.Namespace) -> int:
    host, _, port = args.listen.rpartition(":")
    server = demo.start_webhook(Path(args.file), int(port), host or "0.0.0.0")
    print(f"logging alerts to {args.file} from http://{args.listen}/", flush=True)
    signal.sigwait({signal.SIGINT, signal.SIGTERM})
    server.shutdown()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    return demo.run(args)


def cmd_webhook_routing(args: argparse.Namespace) -> int:
    routing = alerting.webhook_routing(args.config.read_text(), args.url)
    return write_output(
        alerting.WEBHOOK_HEADER.format(url=args.url) + yaml.safe_dump(routing, sort_keys=False), args.out
    )
