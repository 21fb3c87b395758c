"""Culprits: the localizing rules name the host, zone, region pair or Transit Gateway attachment
behind a fault, and Alertmanager turns the fault into one notification.

The rules run in promtool over synthetic series of a small mesh (three regions, two zones in one
of them, Transit Gateway paths; one test per kind of fault), and a real Alertmanager on
alerts/alertmanager.yml receives each culprit's alerts with the per-path alerts of its bad paths
and must hold the culprit's alone as not inhibited. bench/fleet.py's 1,000 hosts in 30 regions
run through a real Prometheus and Alertmanager (promtool cannot hold them: below).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from culprit_paths import (
    FLEET_DOWN,
    FLEET_LOSSY_PAIR,
    FLEET_LOSSY_ZONE,
    FLEET_PARAMS,
    FLEET_SCRAPE_INTERVAL,
    FleetExporters,
    Host,
    Path_,
    between,
    fleet_loss,
    fleet_mesh,
    path_class,
    serve_exposition,
)

from helpers import wait_for
from pathprobe import promql
from pathprobe.monitoring import common, culprits, rules
from pathprobe.monitoring.params import Params
from pathprobe_lab import demo

REPO = Path(__file__).parents[1]

AM = REPO / "alerts" / "alertmanager.yml"
FAULT_AT, EVAL_AT, MINUTES = 10, 25, 30  # minutes: the fault starts, the rules are read, the series end


# The small mesh: Tokyo in two zones, Osaka and Singapore in one zone each; a full mesh. Tokyo's 1c
# hosts, Osaka's and Singapore's are in three VPCs attached to Transit Gateways (three, so that an
# attachment's fault differs from its one peer's: with two, the same paths would cross both).
SMALL = [
    Host("tokyo-a1", "ap-northeast-1", "ap-northeast-1a"),
    Host("tokyo-a2", "ap-northeast-1", "ap-northeast-1a"),
    Host("tokyo-c1", "ap-northeast-1", "ap-northeast-1c", "tgw-attach-tokyo"),
    Host("tokyo-c2", "ap-northeast-1", "ap-northeast-1c", "tgw-attach-tokyo"),
    Host("osaka-a1", "ap-northeast-3", "ap-northeast-3a", "tgw-attach-osaka"),
    Host("osaka-a2", "ap-northeast-3", "ap-northeast-3a", "tgw-attach-osaka"),
    Host("singapore-a1", "ap-southeast-1", "ap-southeast-1a", "tgw-attach-singapore"),
    Host("singapore-a2", "ap-southeast-1", "ap-southeast-1b", "tgw-attach-singapore"),
]


def small_mesh() -> list[Path_]:
    return [Path_(a, b, path_class(a, b)) for a in SMALL for b in SMALL if a is not b]


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items() if v)
    return {"series": f"{name}{{{body}}}", "values": values}


def _counter(per_minute: float, faulty_per_minute: float) -> str:
    """A counter's values: per_minute until the fault, then faulty_per_minute."""
    before = per_minute * (FAULT_AT - 1)
    return f"0+{per_minute:g}x{FAULT_AT - 1} {before:g}+{faulty_per_minute:g}x{MINUTES - FAULT_AT + 1}"


def input_series(paths: list[Path_], fault: dict[Path_, tuple[str, float]], down: str = "") -> list[dict[str, str]]:
    """Every path's peer_info and its signals: idle UDP echoes (600 a minute) and an idle RTT p50
    (10 ms) on every path, a throughput test where the fault is a ratio. fault: path ->
    ("ratio", measured/expected), ("loss", ratio), ("rtt", the RTT's factor) or ("unreachable", 1:
    its probes fail). `down`: a host whose exporter stops at the fault (its own series go stale)
    and whose peers' probes to it fail."""
    out = []
    for path in paths:
        labels, kind, amount = path.labels(), *fault.get(path, ("", 0.0))
        gone = path.src.name == down
        out.append(_series("pathprobe_peer_info", path.info(), f"1x{FAULT_AT - 1} stale" if gone else f"1x{MINUTES}"))
        if gone:
            continue
        idle = {**labels, "state": "idle"}
        unreachable = kind == "unreachable" or path.dst.name == down
        lost = 600 * (amount if kind == "loss" else 1.0 if unreachable else 0.0)
        out.append(_series("pathprobe_udp_packets_sent_total", idle, _counter(600, 600)))
        out.append(_series("pathprobe_udp_packets_lost_total", idle, _counter(0, lost)))
        rtt_factor = amount if kind == "rtt" else 1.0
        out.append(
            _series(
                "pathprobe_rtt_seconds",
                {**idle, "protocol": "tcp", "quantile": "0.5"},
                f"0.01x{FAULT_AT - 1} {0.01 * rtt_factor:g}x{MINUTES - FAULT_AT + 1}",
            )
        )
        if unreachable:
            rtt = {**labels, "probe": "rtt"}
            out.append(_series("pathprobe_probe_runs_total", {**rtt, "result": "ok"}, _counter(60, 0)))
            out.append(_series("pathprobe_probe_runs_total", {**rtt, "result": "timeout"}, _counter(0, 60)))
        if kind == "ratio":
            test = {**labels, "protocol": "tcp", "streams": "1", "direction": "send"}
            out.append(
                _series(
                    "pathprobe_throughput_bytes_per_second",
                    test,
                    f"100x{FAULT_AT - 1} {100 * amount:g}x{MINUTES - FAULT_AT + 1}",
                )
            )
            out.append(
                _series(
                    "pathprobe_throughput_expected_bytes_per_second", {**test, "limit": "per_flow"}, f"100x{MINUTES}"
                )
            )
    return out


def culprit_labels(scope: str, critical: bool, **labels: str) -> list[dict[str, str]]:
    """The labels of a culprit's alerts (the ingress forms' peer-side copies, a zone's peer_zone):
    its warning one, and its critical one beside it when most of its paths fail."""
    if labels.get("side") == "ingress":
        labels |= {"peer": labels["host"]} if scope == "host" else {"peer_attachment": labels["attachment"]}
    if scope == "zone":
        labels["peer_zone"] = labels["zone"]
    alerts = [{"alertname": culprits.CULPRIT_ALERTS[scope], "severity": "warning", "scope": scope, **labels}]
    if critical:
        alerts.append(
            {"alertname": culprits.CULPRIT_CRITICAL_ALERTS[scope], "severity": "critical", "scope": scope, **labels}
        )
    return alerts


def pages(named: list[dict[str, str]]) -> list[dict[str, str]]:
    """Of a fault's culprit alerts, those Alertmanager sends: the critical ones silence their warnings."""
    return [n for n in named if n["severity"] == "critical"] or named


def promtool_case(
    paths: list[Path_], fault: dict[Path_, tuple[str, float]], named: list[dict[str, str]], down: str = ""
) -> dict[str, Any]:
    """One promtool test: no culprit alert (not even pending) before the fault, exactly `named` (their
    labels) firing after."""
    culprits = 'ALERTS{scope=~"host|zone|region_pair|transit_gateway"}'
    samples = [
        {
            "labels": "ALERTS{" + ",".join(f'{k}="{v}"' for k, v in {**n, "alertstate": "firing"}.items()) + "}",
            "value": 1,
        }
        for n in named
    ]
    return {
        "interval": "1m",
        "input_series": input_series(paths, fault, down),
        "promql_expr_test": [
            {"expr": culprits, "eval_time": f"{FAULT_AT - 1}m", "exp_samples": []},
            {"expr": culprits, "eval_time": f"{EVAL_AT}m", "exp_samples": samples},
        ],
    }


def run_promtool(tmp: Path, tests: list[dict[str, Any]]) -> None:
    (tmp / "pathprobe.rules.yml").write_text(rules.dump(Params()))
    (tmp / "culprits.test.yml").write_text(
        yaml.safe_dump(
            {"rule_files": ["pathprobe.rules.yml"], "evaluation_interval": "1m", "tests": tests}, width=10000
        )
    )
    out = subprocess.run(
        ["promtool", "test", "rules", str(tmp / "culprits.test.yml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]


MESH = small_mesh()
TOKYO, OSAKA = "ap-northeast-1", "ap-northeast-3"
# Each fault of the runbook, on the small mesh: the paths it degrades and the culprit to name.
SMALL_CASES: dict[str, tuple[dict[Path_, tuple[str, float]], list[dict[str, str]], str]] = {
    "a host's egress at a fifth": (
        {p: ("ratio", 0.2) for p in between(MESH, src="tokyo-a1")},
        culprit_labels("host", True, side="egress", host="tokyo-a1", region=TOKYO, zone="ap-northeast-1a"),
        "",
    ),
    "the same host's ingress at a fifth": (
        {p: ("ratio", 0.2) for p in between(MESH, dst="tokyo-a1")},
        culprit_labels("host", True, side="ingress", host="tokyo-a1", region=TOKYO, zone="ap-northeast-1a"),
        "",
    ),
    "a region pair halved": (
        {p: ("ratio", 0.55) for p in between(MESH, src_region=TOKYO, dst_region=OSAKA)},
        culprit_labels("region_pair", False, region=TOKYO, peer_region=OSAKA),
        "",
    ),
    "a zone's paths at 3% loss": (
        {p: ("loss", 0.03) for p in between(MESH, zone="ap-northeast-1c")},
        culprit_labels("zone", False, zone="ap-northeast-1c", region=TOKYO),
        "",
    ),
    "a Transit Gateway attachment halved": (
        {p: ("ratio", 0.55) for p in between(MESH, src_attachment="tgw-attach-tokyo", path_class="transit_gateway")},
        culprit_labels("transit_gateway", False, side="egress", attachment="tgw-attach-tokyo", region=TOKYO),
        "",
    ),
    # RTT is a round trip too: a delay between two regions raises both directions' RTT.
    "a region pair's RTT tripled": (
        {
            p: ("rtt", 3.0)
            for p in between(MESH, src_region=TOKYO, dst_region=OSAKA)
            + between(MESH, src_region=OSAKA, dst_region=TOKYO)
        },
        culprit_labels("region_pair", False, region=TOKYO, peer_region=OSAKA)
        + culprit_labels("region_pair", False, region=OSAKA, peer_region=TOKYO),
        "",
    ),
    "one path alone": ({p: ("ratio", 0.2) for p in between(MESH, src="tokyo-a2", dst="osaka-a1")}, [], ""),
    # Loss is a round trip: a host's loss marks its paths both ways; its zone (two hosts) stays unnamed.
    "a host's paths at 3% loss": (
        {p: ("loss", 0.03) for p in between(MESH, src="tokyo-c1") + between(MESH, dst="tokyo-c1")},
        culprit_labels("host", False, side="egress", host="tokyo-c1", region=TOKYO, zone="ap-northeast-1c")
        + culprit_labels("host", False, side="ingress", host="tokyo-c1", region=TOKYO, zone="ap-northeast-1c"),
        "",
    ),
    # A lossy zone (a warning) with one path's probes failing (a firewall change): that path's critical
    # alert, held back by the zone's warning, turns the zone critical, and its page names the zone.
    "a zone's paths at 3% loss, one of them unreachable": (
        {
            p: ("unreachable", 1.0) if (p.src.name, p.dst.name) == ("tokyo-c1", "osaka-a1") else ("loss", 0.03)
            for p in between(MESH, zone="ap-northeast-1c")
        },
        culprit_labels("zone", True, zone="ap-northeast-1c", region=TOKYO),
        "",
    ),
    # A host down in a zone of its own: the host, not the zone.
    "a host down, alone in its zone": (
        {},
        culprit_labels(
            "host", True, side="ingress", host="singapore-a2", region="ap-southeast-1", zone="ap-southeast-1b"
        ),
        "singapore-a2",
    ),
}


# Cases for the rules alone (their per-path alerts are not all held back: a page of their own).
RULES_CASES: dict[str, tuple[dict[Path_, tuple[str, float]], list[dict[str, str]], str]] = {
    # A zone at the critical loss line: its paths' windows read 4% and 7% by turns (as a lab path's
    # ~100 echoes a window scatter around 5.5%), so fewer than most of them are past 5% alone, but
    # their echoes together lose 5.5%: the zone fails (critical), and its page holds back theirs.
    "a zone's paths at 4% and 7% loss by turns": (
        {p: ("loss", (0.04, 0.07)[i % 2]) for i, p in enumerate(between(MESH, zone="ap-northeast-1c"))},
        culprit_labels("zone", True, zone="ap-northeast-1c", region=TOKYO),
        "",
    ),
    # A host outside two lossy zones, with two more lossy paths of its own: four of its seven paths
    # each way are the zones' (explained by them), so it counts two bad of three: not named (counted
    # with the zones' paths, six of seven named it).
    "two zones lossy and two stray paths of a host outside them": (
        {
            p: ("loss", 0.03)
            for p in between(MESH, zone="ap-northeast-1a")
            + between(MESH, zone="ap-northeast-1c")
            + between(MESH, src_region="ap-northeast-3", dst="singapore-a1")
        },
        culprit_labels("zone", False, zone="ap-northeast-1a", region=TOKYO)
        + culprit_labels("zone", False, zone="ap-northeast-1c", region=TOKYO),
        "",
    ),
    # Two faults: Tokyo's zones at 10% loss (critical), and a Singapore host's egress at 0.7 of expected
    # (a warning). Four of the host's seven paths run into the zones: their echoes (10% lost) and their
    # critical loss alerts are the zones' page, not the host's. Counted as its own, they made its
    # echoes lose 5.7% together and turned it critical too: a second page for the zones' fault.
    "two zones critically lossy and a host's egress at a warning level": (
        {p: ("loss", 0.1) for p in between(MESH, zone="ap-northeast-1a") + between(MESH, zone="ap-northeast-1c")}
        | {
            p: ("ratio", 0.7)
            for p in between(MESH, src="singapore-a1", dst_region="ap-northeast-3")
            + between(MESH, src="singapore-a1", dst="singapore-a2")
        },
        culprit_labels("zone", True, zone="ap-northeast-1a", region=TOKYO)
        + culprit_labels("zone", True, zone="ap-northeast-1c", region=TOKYO)
        + culprit_labels(
            "host", False, side="egress", host="singapore-a1", region="ap-southeast-1", zone="ap-southeast-1a"
        ),
        "",
    ),
}


def test_each_fault_of_the_small_mesh_names_its_culprit_alone(tmp_path: Path) -> None:
    run_promtool(tmp_path, [promtool_case(MESH, *case) for case in [*SMALL_CASES.values(), *RULES_CASES.values()]])


def test_the_culprits_hold_back_the_per_path_alerts_the_rules_count_as_theirs() -> None:
    """alertmanager.yml's culprit -> path inhibitions name the alerts whose critical firing turns a
    culprit critical (culprits.EXPLAINABLE), and hold them back whatever their severity."""
    inhibitions = [
        r
        for r in yaml.safe_load(AM.read_text())["inhibit_rules"]
        if r["target_matchers"][0] == 'scope="path"' and "scope=" in r["source_matchers"][0]
    ]
    assert len(inhibitions) == 7, inhibitions
    for rule in inhibitions:
        assert rule["target_matchers"][1] == f'alertname=~"{culprits.EXPLAINABLE}"', rule
        assert "severity" not in rule["equal"], rule


def test_a_critical_culprit_says_how_much_its_echoes_lose_together(tmp_path: Path) -> None:
    fault, named, _ = RULES_CASES["a zone's paths at 4% and 7% loss by turns"]
    alert = culprits.CULPRIT_CRITICAL_ALERTS["zone"]
    summary = next(
        r["annotations"]["summary"]
        for g in rules.render(Params())["groups"]
        for r in g["rules"]
        if r.get("alert") == alert
    )
    zone = "ap-northeast-1c"

    def counted(paths: list[Path_]) -> int:  # a zone counts the paths from it and to it (inside it: twice)
        return sum((p.src.zone == zone) + (p.dst.zone == zone) for p in paths)

    bad, critical = counted(list(fault)), counted([p for p, (_, loss) in fault.items() if loss > 0.05])
    description = (
        f"{zone} ({TOKYO}): {bad} of its {bad} paths are bad ({critical} critically; their idle echoes "
        "lose 5.5% together), from and to its hosts."
    )
    annotations = {
        "summary": summary,
        "description": description,
        "runbook_url": f"{Params().runbook_url_base}#{alert.lower()}",
    }
    expected = [{"exp_labels": n, "exp_annotations": annotations} for n in named if n["alertname"] == alert]
    test = {"alertname": alert, "eval_time": f"{EVAL_AT}m", "exp_alerts": expected}
    run_promtool(tmp_path, [{"interval": "1m", "input_series": input_series(MESH, fault), "alert_rule_test": [test]}])


def per_path_alerts(fault: dict[Path_, tuple[str, float]]) -> list[dict[str, str]]:
    """The per-path alerts of the faulty paths, with the labels the rules give them (common.PATH_SIDES)."""
    out = []
    for path, (kind, amount) in fault.items():
        info = {"scope": "path", **{k: v for k, v in path.info().items() if v and k != "address"}}
        if kind == "ratio":
            test = {**info, "protocol": "tcp", "streams": "1", "direction": "send"}
            out.append({"alertname": "PathprobeThroughputBelowExpected", "severity": "warning", **test})
            if amount < 0.5:
                out.append({"alertname": "PathprobeThroughputFarBelowExpected", "severity": "critical", **test})
        elif kind == "rtt":
            out.append({"alertname": "PathprobeRttAboveBaseline", "severity": "warning", **info, "protocol": "tcp"})
        elif kind == "unreachable":
            out.append({"alertname": "PathprobePeerUnreachable", "severity": "critical", **info})
        else:
            out.append({"alertname": "PathprobePacketLossHigh", "severity": "warning", **info})
            if amount > Params().loss_ratio_critical:
                out.append({"alertname": "PathprobePacketLossCritical", "severity": "critical", **info})
    return out


# The quick tier runs two pytest workers, and either may set up this module's fixtures: each
# worker's Alertmanager and webhook listen on ports of its own.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
AM_API, WEBHOOK = 19293 + 10 * _WORKER, 19294 + 10 * _WORKER


@pytest.fixture(scope="module")
def notifications(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A webhook on port WEBHOOK that logs each notification it gets, one JSON a line, to the path yielded."""
    log = tmp_path_factory.mktemp("webhook") / "notifications.log"
    log.touch()
    webhook = demo.start_webhook(log, WEBHOOK)
    yield log
    webhook.shutdown()


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory, notifications: Path) -> Iterator[str]:
    """A real Alertmanager on the production routing and inhibitions with the lab's timers, every
    receiver the `notifications` webhook."""
    work = tmp_path_factory.mktemp("am")
    config = demo.alertmanager_config(f"http://127.0.0.1:{WEBHOOK}/alerts", AM)
    (work / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = AM_API
    proc = subprocess.Popen(
        [
            demo.binary("prometheus-alertmanager", "alertmanager"),
            f"--config.file={work / 'alertmanager.yml'}",
            f"--storage.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        demo.wait_ready(f"{url}/-/ready", "Alertmanager")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _api(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read() or b"null")


@pytest.mark.parametrize("case", [c for c, (fault, named, _) in SMALL_CASES.items() if fault and named])
def test_alertmanager_holds_the_culprit_alone(alertmanager: str, case: str) -> None:
    fault, named, _ = SMALL_CASES[case]
    # `case` tells this test's alerts apart in the API's answers; posted() resolves them after it.
    alerts = [{"labels": {**a, "case": case}} for a in [*named, *per_path_alerts(fault)]]
    with posted(alertmanager, alerts):
        held_alone(alertmanager, case, alerts, pages(named))


@contextlib.contextmanager
def posted(alertmanager: str, alerts: list[dict[str, Any]]) -> Iterator[None]:
    """The alerts firing at Alertmanager, then resolved (so that one test's culprit inhibits
    nothing of the next one's)."""
    _api(f"{alertmanager}/api/v2/alerts", alerts)
    try:
        yield
    finally:
        ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
        _api(f"{alertmanager}/api/v2/alerts", [{**a, "endsAt": ended} for a in alerts])


def held_alone(alertmanager: str, case: str, alerts: list[dict[str, Any]], named: list[dict[str, str]]) -> None:
    """Of the case's alerts, Alertmanager holds `named` alone as not inhibited, in one group per receiver."""

    def held() -> list[dict[str, str]] | None:
        query = f"{alertmanager}/api/v2/alerts?active=true&inhibited=false&silenced=false"
        mine = [a["labels"] for a in _api(query) if a["labels"].get("case") == case]
        inhibited = _api(f"{alertmanager}/api/v2/alerts?active=false&inhibited=true&silenced=false")
        return (
            mine
            if len(mine) + len([a for a in inhibited if a["labels"].get("case") == case]) == len(alerts)
            and len(mine) == len(named)
            else None
        )

    got = wait_for("the per-path alerts inhibited", held, timeout=30, every=0.5)
    assert sorted(a["alertname"] for a in got) == sorted(n["alertname"] for n in named), got
    # One notification per receiver its route names (a page and the region's channel for a critical
    # one) and per region (the routing groups by alertname and region): a round trip's culprits in
    # two regions are two. The groups come from Alertmanager's dispatcher, which takes the alerts
    # from its store a moment after the alerts API shows them: the count is waited for, and must
    # then hold rather than grow.
    regions = {n["region"] for n in pages(named)}
    want = len(regions) * (2 if named[0]["severity"] == "critical" else 1)

    def groups() -> list[dict[str, Any]]:
        return [
            g
            for g in _api(f"{alertmanager}/api/v2/alerts/groups?inhibited=false&silenced=false")
            if any(a["labels"].get("case") == case for a in g["alerts"])
        ]

    wait_for(f"{want} notification groups", lambda: len(groups()) >= want, timeout=30, every=0.2)
    time.sleep(1)  # a group too many would be dispatched within the same moment
    assert len(groups()) == want, groups()


def test_a_zone_culprit_holds_back_its_hosts_culprits(alertmanager: str) -> None:
    """While a lossy zone recovers, its paths drain at different times and one of its hosts can
    look like a culprit after the zone is no longer named; the zone's alert, still firing, explains it."""
    case = "a zone and its host"
    zone = culprit_labels("zone", False, zone="ap-northeast-1c", region=TOKYO)
    host = culprit_labels("host", False, side="ingress", host="tokyo-c1", region=TOKYO, zone="ap-northeast-1c")
    alerts = [{"labels": {**a, "case": case}} for a in [*zone, *host]]
    with posted(alertmanager, alerts):
        held_alone(alertmanager, case, alerts, zone)


def test_a_culprit_that_turns_critical_within_the_wait_pages_alone(alertmanager: str, notifications: Path) -> None:
    """A fault's paths cross their warning thresholds before their critical ones, so its culprit's
    warning form fires first; the critical form two of the lab's rule evaluations later (10 s) still
    silences it before its channel hears of it. A culprit that stays a warning in the same group
    (alertname, region) is sent when the wait ends."""
    case = "warning, then critical"
    # A region of its own: a group (alertname, region) that has sent before sends a new alert at its
    # next group_interval, not after group_wait, and the cases above use Tokyo's groups.
    region = "eu-west-1"
    turns = culprit_labels("host", True, side="egress", host="dublin-a1", region=region, zone="eu-west-1a")
    stays = culprit_labels("host", False, side="egress", host="dublin-c1", region=region, zone="eu-west-1c")
    warnings = [{"labels": {**a, "case": case}} for a in [turns[0], *stays]]
    critical = [{"labels": {**turns[1], "case": case}}]
    with posted(alertmanager, warnings):
        time.sleep(10)  # the critical form fires two of the lab's evaluations (5 s) after the warning one
        with posted(alertmanager, critical):

            def sent() -> list[tuple[str, str, str]] | None:
                got = [
                    (receiver, a["labels"]["alertname"], a["labels"]["host"])
                    for receiver, a in sent_firing(notifications)
                    if a["labels"].get("case") == case
                ]
                return sorted(got) if len(got) >= 3 else None

            got = wait_for("the warning group's notification and the page", sent, timeout=60, every=0.5)
    # The warning group's one notification holds the culprit that stayed a warning, not the one that turned.
    assert got == sorted(
        [
            ("pagerduty", "PathprobeHostFailing", "dublin-a1"),
            ("slack-emea", "PathprobeHostFailing", "dublin-a1"),
            ("slack-emea", "PathprobeHostDegraded", "dublin-c1"),
        ]
    ), got


# --- 1,000 hosts through a real Prometheus ---------------------------------------------
# promtool's rule unit tests cap each query at a fixed number of samples (not configurable in
# promtool 2.42): the fleet's 34,080 paths exceed it at the first rule. So the fleet runs through a
# real Prometheus that scrapes its series from one synthetic target and evaluates the shipped rules
# (windows of seconds, as the lab's), and a real Alertmanager on the production routing sends what
# passes its inhibitions to a webhook.
PROM_PORT, AM_PORT, WEBHOOK_PORT, FLEET_PORT = 19390, 19393, 19398, 19399
FLEET_ROUTING = demo.alertmanager_config(
    f"http://127.0.0.1:{WEBHOOK_PORT}/alerts", AM, FLEET_PARAMS.evaluation_interval
)


@pytest.fixture(scope="module")
def fleet_monitoring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetExporters, str, Path]]:
    work = tmp_path_factory.mktemp("fleet")
    exporters = FleetExporters(fleet_mesh())
    server = serve_exposition(exporters, FLEET_PORT)
    log = work / "notifications.log"
    log.touch()
    webhook = demo.start_webhook(log, WEBHOOK_PORT)
    (work / "rules.yml").write_text(rules.dump(FLEET_PARAMS))
    (work / "alertmanager.yml").write_text(yaml.safe_dump(FLEET_ROUTING))
    (work / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {
                    "scrape_interval": FLEET_SCRAPE_INTERVAL,
                    "evaluation_interval": FLEET_PARAMS.evaluation_interval,
                },
                "rule_files": [str(work / "rules.yml")],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{AM_PORT}"]}]}]},
                "scrape_configs": [
                    {
                        "job_name": "pathprobe",
                        "honor_labels": True,
                        "static_configs": [{"targets": [f"127.0.0.1:{FLEET_PORT}"]}],
                    }
                ],
            }
        )
    )
    procs = [
        subprocess.Popen(
            [
                demo.binary("prometheus-alertmanager", "alertmanager"),
                f"--config.file={work / 'alertmanager.yml'}",
                f"--storage.path={work / 'am'}",
                f"--web.listen-address=127.0.0.1:{AM_PORT}",
                "--cluster.listen-address=",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [
                demo.binary("prometheus"),
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'prom'}",
                f"--web.listen-address=127.0.0.1:{PROM_PORT}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(work / "prometheus.log").open("w"),
        ),
    ]
    try:
        demo.wait_ready(f"http://127.0.0.1:{AM_PORT}/-/ready", "Alertmanager")
        demo.wait_ready(f"http://127.0.0.1:{PROM_PORT}/-/ready", "Prometheus")
        yield exporters, f"http://127.0.0.1:{PROM_PORT}", log
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
        webhook.shutdown()
        server.shutdown()


def firing(prom: str, scope: str) -> set[tuple[tuple[str, str], ...]]:
    """The firing alerts of a scope (path, or the culprits' scopes as a regular expression), as label sets."""
    found = promql.query(prom, f'ALERTS{{alertstate="firing", scope=~"{scope}"}}')
    return {tuple(sorted((k, v) for k, v in a["metric"].items() if k not in ("__name__", "alertstate"))) for a in found}


def prometheus_said(prom: str) -> str:
    """What Prometheus says of its scrapes and rules: the targets' health and the rules' errors."""
    with urllib.request.urlopen(f"{prom}/api/v1/targets", timeout=10) as r:
        targets = [(t["health"], t["lastError"]) for t in json.load(r)["data"]["activeTargets"]]
    with urllib.request.urlopen(f"{prom}/api/v1/rules", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    errors = {x.get("name"): x["lastError"] for g in groups for x in g["rules"] if x.get("lastError")}
    took = {g["name"]: (round(g["evaluationTime"], 1), g["lastEvaluation"][11:19]) for g in groups}
    return f"targets {targets}, rule errors {dict(list(errors.items())[:3])}, groups (seconds, last) {took}"


@pytest.mark.slow
def test_a_1000_host_fleet_names_each_of_three_faults_and_pages_once_for_each(
    fleet_monitoring: tuple[FleetExporters, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    exporters, prom, log = fleet_monitoring
    scopes = "host|zone|region_pair|transit_gateway"
    # Healthy: every path evaluated (its state recorded) and nothing firing, for a loss window and more.
    paths = len(exporters.paths)
    counted: list[int] = []  # each poll's count of the paths with a state

    def every_path_has_a_state() -> bool:
        found = promql.query(prom, f"count({culprits.BAD})")
        counted.append(int(float(found[0]["value"][1])) if found else 0)
        return counted[-1] == paths

    try:
        wait_for("every path's state", every_path_has_a_state, timeout=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {paths} paths, the last counts {counted[-5:]}; {prometheus_said(prom)}") from None
    time.sleep(35)  # the loss window (30 s) filled with healthy echoes, so that silence means something
    assert not promql.query(prom, "ALERTS"), promql.query(prom, "ALERTS")

    down, zone, pair = FLEET_DOWN, FLEET_LOSSY_ZONE, FLEET_LOSSY_PAIR
    loss = fleet_loss(exporters.paths)
    expected = [
        *culprit_labels("host", True, side="ingress", host=down, region="region-01", zone="region-01b"),
        *culprit_labels("region_pair", False, region=pair[0], peer_region=pair[1]),
        *culprit_labels("zone", False, zone=zone, region="region-07"),
    ]
    want = {tuple(sorted(e.items())) for e in expected}
    exporters.fault(loss, down)
    faulted = time.monotonic()
    wait_for("the three culprits", lambda: firing(prom, scopes) == want or None, timeout=180)
    named_after = time.monotonic() - faulted
    # The per-path alerts of the bad paths fire too (in Prometheus), and no other culprit is named.
    wait_for("the per-path alerts", lambda: len(firing(prom, "path")) >= len(loss), timeout=180)
    assert firing(prom, scopes) == want
    # One notification per fault and receiver: the host down pages (and tells the channel); nothing per path.
    expected_notifications = sorted(
        [
            ("pagerduty", "PathprobeHostFailing", down),
            ("slack-network", "PathprobeHostFailing", down),
            ("slack-network", "PathprobeRegionPairDegraded", pair[0]),
            ("slack-network", "PathprobeZoneDegraded", zone),
        ]
    )
    wait_for("the culprits' notifications", lambda: set(expected_notifications) <= set(notified(log)), timeout=180)
    # Anything else (a culprit's warning before its critical form) fired no later than what was sent
    # and goes out within the routing's longest wait of firing (a group interval more for the sending).
    last_fired = max(datetime.datetime.fromisoformat(a["startsAt"]).timestamp() for _, a in sent_firing(log))
    route = FLEET_ROUTING["route"]
    settled = last_fired + longest_wait(route) + common.duration_seconds(route["group_interval"])
    time.sleep(max(0.0, settled - time.time()))
    assert notified(log) == expected_notifications, (notified(log), culprit_evaluation(prom))
    with capsys.disabled():
        print(
            f"\n1,000 hosts / 30 regions, hierarchical k=2 ({paths:,} paths): three faults at once, each culprit "
            f"named after {named_after:.0f} s (culprit_for 5 s, loss window 30 s, rules every "
            f"{FLEET_PARAMS.evaluation_interval}); {len(firing(prom, 'path'))} per-path alerts firing, all "
            f"inhibited; {len(notified(log))} notifications; {culprit_evaluation(prom)}"
        )


def longest_wait(route: dict[str, Any]) -> int:
    """The longest group_wait in a route and those under it, in seconds."""
    return max([common.duration_seconds(route.get("group_wait", "0s")), *map(longest_wait, route.get("routes", []))])


def sent_firing(log: Path) -> list[tuple[str, dict[str, Any]]]:
    """The firing alerts the webhook was sent, with their receivers."""
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    return [(m["receiver"], a) for m in sent for a in m["alerts"] if a["status"] == "firing"]


def notified(log: Path) -> list[tuple[str, str, str]]:
    """The firing alerts the webhook was sent, as (receiver, alertname, host or zone or region), sorted."""
    return sorted(
        (
            receiver,
            a["labels"]["alertname"],
            a["labels"].get("host") or a["labels"].get("zone") or a["labels"]["region"],
        )
        for receiver, a in sent_firing(log)
    )


def culprit_evaluation(prom: str) -> str:
    """How long the culprit and alert rule groups' last evaluations took, against their interval,
    and the slowest rules of each."""
    with urllib.request.urlopen(f"{prom}/api/v1/rules", timeout=10) as response:
        groups = {g["name"]: g for g in json.load(response)["data"]["groups"]}

    def took(name: str) -> str:
        group = groups[name]
        slowest = sorted(group["rules"], key=lambda r: -r["evaluationTime"])[:5]
        return (
            f"{name}'s last evaluation took {group['evaluationTime']:.1f} s of its "
            f"{FLEET_PARAMS.evaluation_interval}; slowest: "
            + ", ".join(f"{r['name']} {r['evaluationTime']:.1f} s" for r in slowest)
        )

    return f"{took('pathprobe.culprits')}; {took('pathprobe.alerts')}"


def test_a_host_down_is_its_exporter_down_alert_alone(alertmanager: str) -> None:
    """A host that is down: its exporter's alert (scope host), its ingress culprit and its peers'
    per-path alerts to it; Alertmanager holds the first alone (the culprit, though inhibited,
    still inhibits the per-path ones)."""
    down = SMALL[0]
    into = between(MESH, dst=down.name)
    exporter_down = {
        "alertname": "PathprobeExporterDown",
        "severity": "warning",
        "scope": "host",
        "job": "pathprobe",
        "instance": f"{down.name}:9469",
        "host": down.name,
        "region": down.region,
        "zone": down.zone,
    }
    culprit = culprit_labels("host", True, side="ingress", host=down.name, region=down.region, zone=down.zone)
    unreachable = [
        {**a, "alertname": "PathprobePeerUnreachable", "severity": "critical"}
        for a in per_path_alerts({p: ("loss", 1.0) for p in into})
        if a["alertname"] == "PathprobePacketLossHigh"
    ]  # one per path
    alerts = [{"labels": {**a, "case": "down"}} for a in [exporter_down, *culprit, *unreachable]]
    with posted(alertmanager, alerts):
        held_alone(alertmanager, "down", alerts, [exporter_down])
