"""The culprit rules in the lab, through real exporters, Prometheus and Alertmanager: six faults
one after the other on a mesh of three regions (two zones in Tokyo, a Transit Gateway attachment
at tokyo-c1), each held until its page, the per-path alerts behind it and its steady state (a
loss window and the per-path alerts' `for`), and restored before the next. Prints, per fault:
what Alertmanager holds as not inhibited (the pages), the culprits Prometheus named at any time
during it, how many per-path alerts fired behind the culprit, the webhook's firing
notifications, the time from the fault to the first page and from the restore to silence.

Run as root: .venv/bin/python bench/culprit_drill.py   (about 35 minutes; it builds its own lab,
tearing down any running one: do not run it beside the tests)
Target: the right culprit alone in every case (alerts/runbook.md#culprits says how it is named),
one page (or a page and the region's channel for a critical one), within two rotations of the schedule.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import yaml

from pathprobe import promql
from pathprobe.monitoring import common
from pathprobe.monitoring.culprits import BAD, CULPRIT, CULPRIT_ALERTS, path_signals
from pathprobe.monitoring.params import Params
from pathprobe_lab import demo, net, shaping
from pathprobe_lab.configs import exporter_config, lab_alert_params, rotation_seconds
from pathprobe_lab.state import State, in_ns, ns, spawn
from pathprobe_lab.topology import PathSpec, Topology

REPO = Path(__file__).parents[1]
SLOT = 16.0  # one one-stream test of 1 + 3 s per half-slot, with the 3 s margin and 1 s of jitter
PROM_PORT, AM_PORT, WEBHOOK_PORT = 19490, 19493, 19498
TGW_CAP = 400e6  # tokyo-c1's attachment in lab bits/s: below the 500 Mbit/s per-flow cap, so that it binds
TOPOLOGY = Topology.model_validate(
    yaml.safe_load(f"""
scale: 10
hosts:
  - {{name: tokyo-a1, region: ap-northeast-1, zone: ap-northeast-1a, instance_type: c6gn.xlarge}}
  - {{name: tokyo-a2, region: ap-northeast-1, zone: ap-northeast-1a, instance_type: c6gn.xlarge}}
  - {{name: tokyo-c1, region: ap-northeast-1, zone: ap-northeast-1c, instance_type: c6gn.xlarge,
     transit_gateway_cap: {TGW_CAP:.0f}}}
  - {{name: osaka-a1, region: ap-northeast-3, zone: ap-northeast-3a, instance_type: c6gn.xlarge}}
  - {{name: osaka-a2, region: ap-northeast-3, zone: ap-northeast-3a, instance_type: c6gn.xlarge}}
  - {{name: singapore-a1, region: ap-southeast-1, zone: ap-southeast-1a, instance_type: c6gn.xlarge}}
paths:
  - {{between: [ap-northeast-1, ap-northeast-1], one_way_delay: 0.25ms}}
  - {{between: [ap-northeast-3, ap-northeast-3], one_way_delay: 0.25ms}}
  - {{between: [ap-northeast-1, ap-northeast-3], one_way_delay: 4ms}}
  - {{between: [ap-northeast-1, ap-southeast-1], one_way_delay: 10ms}}
  - {{between: [ap-northeast-3, ap-southeast-1], one_way_delay: 10ms}}
  - {{between: [tokyo-c1, ap-northeast-3], one_way_delay: 4ms, path_class: transit_gateway}}
  - {{between: [tokyo-c1, ap-southeast-1], one_way_delay: 10ms, path_class: transit_gateway}}
""")
)
HOSTS = [h.name for h in TOPOLOGY.hosts]
REGION = {h.name: h.region for h in TOPOLOGY.hosts}
ZONE = {h.name: h.zone for h in TOPOLOGY.hosts}
PROBES = {"throughput": {"streams": [1], "duration_seconds": 3, "omit_seconds": 1}}


def expected_bits(prom: str, src: str, dst: str) -> float:
    found = promql.query(prom, f'pathprobe_throughput_expected_bytes_per_second{{host="{src}", peer="{dst}"}}')
    return 8 * float(found[0]["value"][1])


def set_paths(paths: list[tuple[str, str]], spec_of: Callable[[str, str, PathSpec], PathSpec]) -> Callable[[], None]:
    """Each path's shaping changed by spec_of(src, dst, current); returns the restore."""
    state = State.load()
    assert state is not None
    for src, dst in paths:
        shaping.set_path(state, src, dst, spec_of(src, dst, state.spec(src, dst)))

    def restore() -> None:
        for src, dst in paths:
            shaping.restore(State.load(), src, dst)  # type: ignore[arg-type]

    return restore


def shape(prom: str, paths: list[tuple[str, str]], share: float) -> Callable[[], None]:
    """Each path's rate to `share` of its expected."""
    return set_paths(
        paths,
        lambda src, dst, s: PathSpec(share * expected_bits(prom, src, dst), s.one_way_delay, s.loss, s.path_class),
    )


def lossy(paths: list[tuple[str, str]], loss: float) -> Callable[[], None]:
    return set_paths(paths, lambda _src, _dst, s: PathSpec(s.rate, s.one_way_delay, loss, s.path_class))


def attachment_cap(host: str, rate: float) -> Callable[[], None]:
    shaping.set_host_cap(State.load(), host, "transit_gateway_cap", rate)  # type: ignore[arg-type]
    return lambda: shaping.set_host_cap(State.load(), host, "transit_gateway_cap", TGW_CAP)  # type: ignore[arg-type]


def pairs(where: Callable[[str, str], bool]) -> list[tuple[str, str]]:
    return [(a, b) for a in HOSTS for b in HOSTS if a != b and where(a, b)]


# How to cause a fault (given Prometheus's URL): returns its restore.
Cause = Callable[[str], Callable[[], None]]
# (fault, the alert Alertmanager should hold alone (its warning form), how to cause it)
FAULTS: list[tuple[str, str, Cause]] = [
    (
        "(a) tokyo-a1's egress at a fifth",
        "PathprobeHostDegraded host=tokyo-a1 side=egress",
        lambda prom: shape(prom, pairs(lambda a, b: a == "tokyo-a1"), 0.2),
    ),
    (
        "(b) tokyo-a1's ingress at a fifth",
        "PathprobeHostDegraded host=tokyo-a1 side=ingress",
        lambda prom: shape(prom, pairs(lambda a, b: b == "tokyo-a1"), 0.2),
    ),
    (
        "(c) Tokyo -> Osaka at half",
        "PathprobeRegionPairDegraded ap-northeast-1 -> ap-northeast-3",
        lambda prom: shape(
            prom, pairs(lambda a, b: REGION[a] == "ap-northeast-1" and REGION[b] == "ap-northeast-3"), 0.5
        ),
    ),
    (
        "(d) zone ap-northeast-1a at 3% loss",
        "PathprobeZoneDegraded zone=ap-northeast-1a",
        lambda prom: lossy(pairs(lambda a, b: "ap-northeast-1a" in (ZONE[a], ZONE[b])), 0.03),
    ),
    (
        "(e) tokyo-c1's Transit Gateway attachment at half",
        "PathprobeTransitGatewayAttachmentDegraded attachment=tgw-attach-tokyo-c1 side=egress",
        lambda prom: attachment_cap("tokyo-c1", TGW_CAP / 2),
    ),
    (
        "(f) tokyo-a2 -> osaka-a1 alone at a fifth",
        "PathprobeThroughputFarBelowExpected tokyo-a2 -> osaka-a1",
        lambda prom: shape(prom, [("tokyo-a2", "osaka-a1")], 0.2),
    ),
]


def warning_form(alert: str) -> str:
    return alert.replace("Failing ", "Degraded ", 1)


def describe(labels: dict[str, str]) -> str:
    """An alert as the table shows it: its name and its culprit (or path)."""
    scope = labels.get("scope", "")
    name = labels["alertname"]
    if scope == "host":
        return f"{name} host={labels['host']}" + (f" side={labels['side']}" if "side" in labels else "")
    if scope == "zone":
        return f"{name} zone={labels['zone']}"
    if scope == "region_pair":
        return f"{name} {labels['region']} -> {labels['peer_region']}"
    if scope == "transit_gateway":
        return f"{name} attachment={labels['attachment']} side={labels['side']}"
    return f"{name} {labels.get('host', '')} -> {labels.get('peer', '')}"


def held(am: str) -> set[str]:
    """The firing alerts Alertmanager holds as neither inhibited nor silenced."""
    url = f"{am}/api/v2/alerts?active=true&inhibited=false&silenced=false"
    with urllib.request.urlopen(url, timeout=10) as r:
        return {describe(a["labels"]) for a in json.loads(r.read())}


def culprits(prom: str) -> set[str]:
    found = promql.query(prom, 'ALERTS{alertstate="firing", scope!~"path|mesh"}')
    return {describe(a["metric"]) for a in found}


def strays(prom: str, signals: dict[str, str], want: str) -> dict[str, str]:
    """The culprits the rules name now (pending ones too) other than `want`, each with what makes its
    paths bad: for a host, each bad path and its bad signals (path_signals)."""
    found = {}
    for c in promql.query(prom, CULPRIT):
        labels = c["metric"]
        name = describe(labels | {"alertname": CULPRIT_ALERTS[labels["scope"]]})
        if name == warning_form(want):
            continue
        why = ""
        if labels["scope"] == "host":
            end = "host" if labels["side"] == "egress" else "peer"
            bad = [
                f"{r['metric']['host']} -> {r['metric']['peer']} {signal} {float(r['value'][1]):g}"
                for signal, expr in signals.items()
                for r in promql.query(prom, f"({expr}) > 0")
                if r["metric"].get(end) == labels["host"]
            ]
            why = ": " + ", ".join(sorted(bad))
        found[name] = why
    return found


def per_path_firing(prom: str) -> int:
    found = promql.query(prom, 'count(ALERTS{alertstate="firing", scope="path"})')
    return int(float(found[0]["value"][1])) if found else 0


def firing_notifications(log: Path, seen: int) -> list[tuple[str, float]]:
    """Each firing alert of the notifications after the first `seen`, with when it started firing
    (Unix time, from Alertmanager's startsAt)."""
    return [
        (describe(a["labels"]), started(a["startsAt"]))
        for line in log.read_text().splitlines()[seen:]
        for a in json.loads(line)["alerts"]
        if a["status"] == "firing"
    ]


def started(rfc3339: str) -> float:
    """Alertmanager's time stamp (nanoseconds, "Z") as Unix time."""
    whole, _, fraction = rfc3339.removesuffix("Z").partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp() + float(f"0.{fraction or 0}")


def quiet(prom: str, am: str, before: set[str]) -> bool:
    """Nothing held but what the healthy mesh held, nothing named, no per-path alert but those."""
    return held(am) <= before and not culprits(prom) and per_path_firing(prom) <= len(before)


def wait(what: str, check: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until check() holds, polled every 2 s; None at the timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(2)
    print(f"  ({what}: not within {timeout:.0f} s)", flush=True)
    return None


def one_fault(  # noqa: PLR0913, PLR0917 - the lab's handles and one fault
    prom: str,
    am: str,
    log: Path,
    rotation: float,
    fault: tuple[str, str, Cause],
    before: set[str],
    params: Params,
) -> tuple[list[str], dict[str, str]]:
    """One fault, caused and restored: its row of the table, and the stray culprits named (when, and
    why). `before`: what Alertmanager held on the healthy mesh (the Transit Gateway capacity warnings
    of tokyo-c1's attachment, which its tests fill)."""
    name, want, cause = fault
    signals = path_signals(params)
    # A fault held at least this long reaches its steady state, as a fault of minutes does: its loss
    # window full of faulty echoes, and the per-path alerts' `for` past that (their pages, if any).
    steady = sum(
        common.duration_seconds(d)
        for d in (params.loss_window, params.loss_for, params.evaluation_interval, params.evaluation_interval)
    )
    print(f"{name} ...", flush=True)
    seen = len(log.read_text().splitlines())
    start, fault_at = time.monotonic(), time.time()
    restore = cause(prom)
    named: set[str] = set()
    stray_causes: dict[str, str] = {}
    phase = "fault"

    def look() -> None:
        """What the rules name, and each stray culprit's cause the first time it is named."""
        named.update(culprits(prom))
        for stray, why in strays(prom, signals, want).items():
            if stray not in stray_causes:
                stray_causes[stray] = f"{phase} +{time.monotonic() - start:.0f} s{why}"
                print(f"  named {stray} ({stray_causes[stray]})", flush=True)

    def paged() -> bool:
        look()
        return want in {warning_form(h) for h in held(am)}

    def behind_it() -> bool:
        look()
        return per_path_firing(prom) > len(before)

    def held_steady() -> bool:
        look()
        return time.monotonic() - start >= steady

    def quieted() -> bool:
        look()
        return quiet(prom, am, before)

    to_page = wait("the page", paged, 5 * rotation)
    # Then the per-path alerts behind it (a throughput window: two rotations and a half).
    wait("the per-path alerts", behind_it, 3 * rotation)
    wait("the fault's steady state", held_steady, steady + 10)
    holding, behind = held(am) - before, per_path_firing(prom) - len(before)
    look()
    restore()
    phase, restored_at = "restored", time.time()
    to_quiet = wait("quiet", quieted, 6 * rotation)
    notifications = [(n, at) for n, at in firing_notifications(log, seen) if n not in before]
    notified = [n for n, _ in notifications]
    for n, at in sorted(set(notifications), key=lambda na: na[1]):
        if warning_form(n) != want:  # when an alert besides the culprit's started firing
            when = f"restored +{at - restored_at:.0f} s" if at > restored_at else f"fault +{at - fault_at:.0f} s"
            print(f"  notified {n}: firing since {when}", flush=True)
    # A culprit's warning or critical form (...Degraded, ...Failing): how far below the shaping puts a
    # test decides which.
    ok = (
        to_page is not None
        and {warning_form(h) for h in holding} == {want}
        and {warning_form(n) for n in named} <= {want}
        and {warning_form(n) for n in notified} == {want}
    )
    sent = "; ".join(f"{n} x{notified.count(n)}" for n in sorted(set(notified))) or "-"
    others = sorted(n for n in named if warning_form(n) != want)
    row = [
        name,
        "; ".join(sorted(holding)) or "-",
        "; ".join(others) or "none",
        str(behind),
        sent,
        "-" if to_page is None else f"{to_page:.0f} s",
        "-" if to_quiet is None else f"{to_quiet:.0f} s",
        "yes" if ok else "NO",
    ]
    return row, stray_causes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="abcdef", help="the faults to cause, by letter (default: all six)")
    faults = [f for f in FAULTS if f[0][1] in parser.parse_args().only]
    with tempfile.TemporaryDirectory(prefix="culprit-drill-") as tmp:
        work = Path(tmp)
        net.up(TOPOLOGY)
        webhook = None
        try:
            for host in HOSTS:
                cfg = exporter_config(TOPOLOGY, host, work, SLOT, PROBES)
                (work / f"{host}.yaml").write_text(yaml.safe_dump(cfg))
                run = [str(REPO / ".venv/bin/pathprobe"), "run", "--config", str(work / f"{host}.yaml")]
                spawn(in_ns(ns(host), run), work / f"{host}.log", f"exporter {host}")
            log = work / "alerts.log"
            log.touch()
            webhook = demo.start_webhook(log, WEBHOOK_PORT)
            rotation = rotation_seconds(TOPOLOGY, SLOT)
            params = lab_alert_params(rotation)
            prom, am = demo.start_monitoring(
                TOPOLOGY,
                work,
                PROM_PORT,
                AM_PORT,
                REPO / "alerts" / "alertmanager.yml",
                params,
                webhook_port=WEBHOOK_PORT,
            )
            print(f"six hosts, rotation {rotation:.0f} s; waiting for two rotations of healthy results", flush=True)
            every_path = len(HOSTS) * (len(HOSTS) - 1)
            wait("every path's state", lambda: len(promql.query(prom, BAD)) == every_path, 4 * rotation)
            time.sleep(2 * rotation)
            before = held(am)
            print(
                f"healthy: held {sorted(before) or 'nothing'}, culprits {sorted(culprits(prom)) or 'none'}", flush=True
            )
            drills = [one_fault(prom, am, log, rotation, fault, before, params) for fault in faults]
        finally:
            if webhook:
                webhook.shutdown()
            net.down()
    head = [
        "fault",
        "Alertmanager holds (not inhibited)",
        "other culprits named",
        "per-path alerts behind it",
        "firing alerts notified (times)",
        "fault -> page",
        "restore -> quiet",
        "right culprit alone, one page",
    ]
    print("\n| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for row, _ in drills:
        print("| " + " | ".join(row) + " |")
    print("\nStray culprits (the rules' culprit record, pending ones too; when first named, and why):")
    for row, stray_causes in drills:
        for stray, why in stray_causes.items():
            print(f"  {row[0]}: {stray} ({why})")
    print(
        f"\nrotation {rotation_seconds(TOPOLOGY, SLOT):.0f} s; two rotations: "
        f"{2 * rotation_seconds(TOPOLOGY, SLOT):.0f} s"
    )
    return 0 if all(row[-1] == "yes" for row, _ in drills) else 1


if __name__ == "__main__":
    raise SystemExit(main())
