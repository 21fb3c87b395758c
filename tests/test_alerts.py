"""Rules and routing, checked by the real promtool and amtool, and a fire drill in the lab:
impair a path, the alert reaches the webhook through Prometheus and Alertmanager, restore
it, the alert resolves."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from helpers import in_host, scrape, start_exporter, topology, value, wait_for
from pathprobe import promql
from pathprobe.monitoring import params, rules
from pathprobe_lab import demo, net, shaping
from pathprobe_lab.configs import exporter_config, lab_alert_params, rotation_seconds
from pathprobe_lab.state import ROUTER, State, in_ns
from pathprobe_lab.topology import PathSpec, address

ALERTS = Path(__file__).parents[1] / "alerts"
RULES = ALERTS / "pathprobe.rules.yml"
AM = ALERTS / "alertmanager.yml"
FAR_BELOW, BELOW = "PathprobeThroughputFarBelowExpected", "PathprobeThroughputBelowExpected"


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def alert_rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_committed_rules_are_the_rendered_defaults() -> None:
    assert RULES.read_text() == rules.dump(params.Params()), (
        "run: pathprobe alerts render --out alerts/pathprobe.rules.yml"
    )


def test_every_parameter_is_documented_with_its_default() -> None:
    readme = (ALERTS / "README.md").read_text()
    for name, field in params.Params.model_fields.items():
        default = field.default if isinstance(field.default, str) else f"{field.default:g}"
        assert f"`{name}`" in readme, f"alerts/README.md does not document {name}"
        assert f"`{default}`" in readme, f"alerts/README.md does not show {name}'s default {default}"


def test_promtool_checks_and_unit_tests_pass() -> None:
    check = run("promtool", "check", "rules", str(RULES))
    assert check.returncode == 0, check.stdout + check.stderr
    test = run("promtool", "test", "rules", str(ALERTS / "tests" / "pathprobe.rules.test.yml"))
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


def test_every_alert_follows_the_mixin_style_and_is_unit_tested() -> None:
    runbook_sections = set(re.findall(r"^## (\w+)$", (ALERTS / "runbook.md").read_text(), re.M))
    tested = set(re.findall(r"alertname: (\w+)", (ALERTS / "tests" / "pathprobe.rules.test.yml").read_text()))
    # promtool over generated meshes: tests/test_culprits.py
    tested |= {*rules.CULPRIT_ALERTS.values(), *rules.CULPRIT_CRITICAL_ALERTS.values()}
    for rule in alert_rules():
        name = rule["alert"]
        assert re.fullmatch(r"Pathprobe([A-Z][a-z0-9]+)+", name), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["labels"]["scope"] in rules.SCOPES, name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert rule["annotations"]["runbook_url"].endswith("#" + name.lower()), name
        assert name in runbook_sections, f"{name} has no section in alerts/runbook.md"
        assert name in tested, f"{name} has no promtool test"


def test_lab_rules_are_valid_too(tmp_path: Path) -> None:
    lab_rules = tmp_path / "lab.rules.yml"
    lab_rules.write_text(rules.dump(lab_alert_params(90)))
    check = run("promtool", "check", "rules", str(lab_rules))
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("rtt_window_seconds", [60, 300])
def test_every_recording_rule_writes_its_own_series(rtt_window_seconds: int) -> None:
    """Two rules recording one name write one series twice: Prometheus keeps one and discards the other."""
    for p in (params.Params(), lab_alert_params(rotation_seconds(DRILL, SLOT), rtt_window_seconds)):
        # A record's rule labels (the culprits' scope) tell its series apart.
        records = [(r["record"], str(r.get("labels"))) for g in yaml.safe_load(rules.dump(p))["groups"]
                   for r in g["rules"] if "record" in r]  # fmt: skip
        assert len(records) == len(set(records)), sorted(r for r in records if records.count(r) > 1)


def test_rtt_windows_that_would_name_one_recording_are_refused() -> None:
    with pytest.raises(ValidationError, match=r"rtt_recent_window\n.*equal to rtt_exporter_window"):
        params.Params(rtt_exporter_window="1m", rtt_recent_window="1m")


def test_alertmanager_config_is_valid(tmp_path: Path) -> None:
    check = run("amtool", "check-config", str(AM))
    assert check.returncode == 0, check.stdout + check.stderr
    lab = tmp_path / "alertmanager.yml"
    lab.write_text(yaml.safe_dump(demo.alertmanager_config("http://127.0.0.1:1/alerts", AM)))
    check = run("amtool", "check-config", str(lab))
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(("labels", "receivers"), [
    (["severity=critical", "region=ap-northeast-1", "alertname=PathprobePeerUnreachable"], "pagerduty,slack-apac"),
    (["severity=critical", "region=us-east-1", "alertname=PathprobeExporterDown"], "pagerduty,slack-americas"),
    (["severity=warning", "region=eu-west-1", "alertname=PathprobeRttAboveBaseline"], "slack-emea"),
    (["severity=warning", "alertname=PathprobeScheduleMismatch"], "slack-network"),
    (["alertname=SomethingElse"], "webhook"),
])  # fmt: skip
def test_routing(labels: list[str], receivers: str) -> None:
    out = run("amtool", "config", "routes", "test", f"--config.file={AM}", *labels)
    assert out.stdout.strip() == receivers, out.stdout + out.stderr


def test_region_outage_is_grouped_into_one_notification() -> None:
    route = yaml.safe_load(AM.read_text())["route"]
    assert route["group_by"] == ["alertname", "region"]


# --- fire drill ---------------------------------------------------------------------
DRILL = topology("""
hosts:
  - {name: drill-a, region: ap-northeast-1, zone: ap-northeast-1a, instance_type: c6gn.xlarge}
  - {name: drill-b, region: ap-northeast-3, zone: ap-northeast-3a, instance_type: c6gn.xlarge}
paths:
  - {between: [ap-northeast-1, ap-northeast-3], one_way_delay: 4ms}
""")
SLOT = 26.0  # two tests (1 and 4 streams) of 1 + 2 s with a 3 s margin each and 1 s of jitter per half
# The exporters' RTT quantile window, and the rules' name for it: one minute, so that an added delay
# moves the p50 within half a minute (the default window is five minutes).
RTT_WINDOW = 60
PROM_PORT, AM_PORT, WEBHOOK_PORT = 19190, 19193, 19198


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    work = tmp_path_factory.mktemp("drill")
    net.up(DRILL)
    for h in DRILL.hosts:
        cfg = exporter_config(DRILL, h.name, work, SLOT, {
            "throughput": {"streams": [1, 4], "duration_seconds": 2, "omit_seconds": 1},
            "rtt": {"quantile_window_seconds": RTT_WINDOW},
        })  # fmt: skip
        start_exporter(h.name, cfg, work)
    log = work / "alerts.log"
    log.touch()
    webhook = demo.start_webhook(log, WEBHOOK_PORT)
    params = lab_alert_params(rotation_seconds(DRILL, SLOT), RTT_WINDOW)
    prom, _ = demo.start_monitoring(DRILL, work, PROM_PORT, AM_PORT, AM, params, webhook_port=WEBHOOK_PORT)
    yield {"prom": prom, "log": log, "params": params}
    webhook.shutdown()
    net.down()


def notifications_by_message(log: Path) -> list[list[tuple[str, str, str]]]:
    """(status, alertname, peer) of every alert, one list per webhook notification, in order."""
    return [
        [(a["status"], a["labels"]["alertname"], a["labels"].get("peer", "")) for a in json.loads(line)["alerts"]]
        for line in log.read_text().splitlines()
    ]


def alerts_sent(log: Path, alertname: str, status: str = "firing") -> list[dict]:
    """Every alert of that name and status in the webhook's notifications, with labels and annotations."""
    return [a for line in log.read_text().splitlines() for a in json.loads(line)["alerts"]
            if a["labels"]["alertname"] == alertname and a["status"] == status]  # fmt: skip


def notifications(log: Path) -> list[tuple[str, str, str]]:
    """(status, alertname, peer) of every alert in every webhook notification so far."""
    return [alert for message in notifications_by_message(log) for alert in message]


@pytest.mark.lab
def test_fire_drill(drill: dict, capsys: pytest.CaptureFixture[str]) -> None:
    a = f"{address(1)}:9469"
    ratio = 'path:pathprobe_throughput_expected_ratio:last{host="drill-a",peer="drill-b"}'

    def healthy() -> bool:
        found = promql.query(drill["prom"], ratio)
        return bool(found) and float(found[0]["value"][1]) > 0.9

    # A healthy path first: 478 of an expected 500 Mbit/s (the lab's 5 Gbps per-flow limit / 10).
    wait_for("a healthy result in Prometheus", healthy, timeout=90)
    s = scrape(a)
    assert value(s, "pathprobe_throughput_expected_bytes_per_second", peer="drill-b", limit="per_flow") == 500e6 / 8
    assert not [n for n in notifications(drill["log"]) if n[0] == "firing"]

    state = State.load()
    assert state is not None
    spec = state.spec("drill-a", "drill-b")
    impaired = time.monotonic()
    shaping.set_path(state, "drill-a", "drill-b", PathSpec(150e6, spec.one_way_delay, 0.0, spec.path_class))
    fired = wait_for(
        "the alert at the webhook",
        lambda: ("firing", FAR_BELOW, "drill-b") in notifications(drill["log"]),
        timeout=240,
    )
    time_to_fire = time.monotonic() - impaired
    assert fired
    assert_warning_inhibited_by_critical(drill["log"])

    # The description names the binding limit of each test: one stream the per-flow limit, four
    # the inter-region cap (c6gn.xlarge: 5 Gbps, 500 Mbit/s here).
    wait_for("both tests' alerts", lambda: {"1", "4"} <= {a["labels"]["streams"] for a in alerts_sent(drill["log"],
             FAR_BELOW)}, timeout=120)  # fmt: skip
    for a in alerts_sent(drill["log"], FAR_BELOW):
        limit = {"1": "per_flow", "4": "region_cap"}[a["labels"]["streams"]]
        assert f"(binding limit: {limit})" in a["annotations"]["description"], a

    restored = time.monotonic()
    shaping.restore(State.load(), "drill-a", "drill-b")  # type: ignore[arg-type]
    wait_for(
        "the resolved notifications of both tests",
        lambda: {a["labels"]["streams"] for a in alerts_sent(drill["log"], FAR_BELOW,
                 "resolved")} >= {"1", "4"},
        timeout=240,
    )  # fmt: skip
    time_to_resolve = time.monotonic() - restored
    with capsys.disabled():
        print(
            f"\nfire drill: slot {SLOT:g} s, rotation {rotation_seconds(DRILL, SLOT):g} s, "
            f"window {lab_alert_params(rotation_seconds(DRILL, SLOT)).throughput_window}: "
            f"fired after {time_to_fire:.0f} s, resolved after {time_to_resolve:.0f} s"
        )


def assert_warning_inhibited_by_critical(log: Path, seen: int = 0) -> None:
    """The critical throughput alert inhibits the warning one on the same test: no notification
    from the first critical one on lists the warning as firing. A test run while the shaping
    changed rates between the two thresholds, so the warning alone may be sent before it."""
    messages = [json.loads(line)["alerts"] for line in log.read_text().splitlines()[seen:]]

    def firing(message: list[dict], alertname: str, streams: str) -> bool:
        return any(a["status"] == "firing" and a["labels"]["alertname"] == alertname
                   and a["labels"].get("streams") == streams for a in message)  # fmt: skip

    for streams in {a["labels"].get("streams") for m in messages for a in m}:
        critical = [i for i, m in enumerate(messages) if firing(m, FAR_BELOW, streams)]
        after = messages[critical[0] :] if critical else []
        assert not [m for m in after if firing(m, BELOW, streams)], streams


def new_alerts(log: Path, seen: int, status: str = "firing") -> list[dict]:
    """Alerts of that status in the notifications after the first `seen` ones."""
    return [a for line in log.read_text().splitlines()[seen:] for a in json.loads(line)["alerts"]
            if a["status"] == status]  # fmt: skip


@pytest.mark.lab
def test_a_lowered_per_flow_cap_fires_for_one_stream_only(drill: dict, capsys: pytest.CaptureFixture[str]) -> None:
    state = State.load()
    assert state is not None
    seen = len(drill["log"].read_text().splitlines())
    impaired, impaired_at = time.monotonic(), time.time()
    # 150 Mbit/s per flow: one stream reaches 30% of its 500 Mbit/s; four still fill the 500 Mbit/s cap.
    shaping.set_per_flow_cap(state, "drill-a", 150e6)
    try:
        wait_for("the one-stream alert", lambda: [a for a in new_alerts(drill["log"], seen)
                 if a["labels"]["alertname"] == FAR_BELOW and a["labels"]["streams"] == "1"], timeout=240)  # fmt: skip
        time_to_fire = time.monotonic() - impaired
        # A four-stream test run since the change is healthy.
        newer = f'pathprobe_throughput_last_test_timestamp_seconds{{host="drill-a",streams="4"}} > {impaired_at:.0f}'
        wait_for("a four-stream test under the lowered cap", lambda: promql.query(drill["prom"], newer), timeout=60)
        ratio = promql.query(drill["prom"], 'path:pathprobe_throughput_expected_ratio:last{host="drill-a",streams="4"}')
        assert ratio and float(ratio[0]["value"][1]) > 0.9, ratio
    finally:
        shaping.set_per_flow_cap(State.load(), "drill-a", None)  # type: ignore[arg-type]
    fired = {(a["labels"]["alertname"], a["labels"].get("streams", ""), a["labels"].get("host", ""))
             for a in new_alerts(drill["log"], seen)}  # fmt: skip
    # The one-stream test only; its warning form only before the critical one (a test that straddled the change).
    assert (FAR_BELOW, "1", "drill-a") in fired, fired
    assert fired <= {(FAR_BELOW, "1", "drill-a"), (BELOW, "1", "drill-a")}, fired
    assert_warning_inhibited_by_critical(drill["log"], seen)
    assert all("(binding limit: per_flow)" in a["annotations"]["description"] for a in new_alerts(drill["log"], seen))
    restored = time.monotonic()
    wait_for("the one-stream alert resolved", lambda: new_alerts(drill["log"], seen, "resolved"), timeout=240)
    with capsys.disabled():
        print(f"\nper-flow drill (500 -> 150 Mbit/s per flow): one-stream alert after {time_to_fire:.0f} s, "
              f"resolved after {time.monotonic() - restored:.0f} s; four streams stayed healthy")  # fmt: skip


@pytest.mark.lab
def test_loss_fires_the_loss_alert_and_resolves(drill: dict, capsys: pytest.CaptureFixture[str]) -> None:
    state = State.load()
    assert state is not None
    spec = state.spec("drill-a", "drill-b")
    seen_before = len(notifications(drill["log"]))
    impaired = time.monotonic()
    shaping.set_path(state, "drill-a", "drill-b", PathSpec(spec.rate, spec.one_way_delay, 0.03, spec.path_class))
    wait_for("the loss alert", lambda: ("firing", "PathprobePacketLossHigh", "drill-b") in notifications(drill["log"]),
             timeout=240)  # fmt: skip
    time_to_fire = time.monotonic() - impaired
    fired = {name for status, name, peer in notifications(drill["log"])[seen_before:] if status == "firing"}
    # 3% is above the 1% warning and below the 5% critical threshold; TCP slows under loss, so the
    # throughput alerts may join; nothing about RTT, reachability or the exporters.
    assert "PathprobePacketLossCritical" not in fired
    assert fired <= {"PathprobePacketLossHigh", BELOW, FAR_BELOW}, fired
    restored = time.monotonic()
    shaping.restore(State.load(), "drill-a", "drill-b")  # type: ignore[arg-type]
    resolved = ("resolved", "PathprobePacketLossHigh", "drill-b")
    wait_for("the loss alert resolved", lambda: resolved in notifications(drill["log"]), timeout=240)
    with capsys.disabled():
        print(f"\nloss drill (3% one way): fired after {time_to_fire:.0f} s, "
              f"resolved after {time.monotonic() - restored:.0f} s")  # fmt: skip


@pytest.mark.lab
def test_added_delay_fires_the_rtt_baseline_alert_and_resolves(drill: dict, capsys: pytest.CaptureFixture[str]) -> None:
    state = State.load()
    assert state is not None
    spec = state.spec("drill-a", "drill-b")
    # The baseline is the median of the path's RTT over its window: with more than half of that window
    # healthy before the delay, the delay cannot raise it before the alert fires. Run after the other
    # drills, the history is there; run alone, this waits for it.
    p = drill["params"]
    history = (f'count_over_time(path:pathprobe_rtt_seconds:p50_{p.rtt_exporter_window}{{host="drill-a", '
               f'peer="drill-b"}}[{p.rtt_baseline_window}:{p.rtt_baseline_step}])')  # fmt: skip
    wait_for("6 minutes of RTT history", lambda: [s for s in promql.query(drill["prom"], history)
             if float(s["value"][1]) >= 12], timeout=600, every=10)  # fmt: skip
    seen = len(drill["log"].read_text().splitlines())
    impaired = time.monotonic()
    # 8 ms RTT becomes 28 ms one way only (the echo's reverse path is untouched): more than 1.5x
    # the 15-minute baseline, and more than 2 ms above it.
    shaping.set_path(state, "drill-a", "drill-b", PathSpec(spec.rate, spec.one_way_delay + 0.020, 0.0, spec.path_class))
    try:
        wait_for("the RTT alert", lambda: [a for a in new_alerts(drill["log"], seen)
                 if a["labels"]["alertname"] == "PathprobeRttAboveBaseline" and a["labels"]["host"] == "drill-a"],
                 timeout=420)  # fmt: skip
        time_to_fire = time.monotonic() - impaired
    finally:
        shaping.restore(State.load(), "drill-a", "drill-b")  # type: ignore[arg-type]
    fired = {a["labels"]["alertname"] for a in new_alerts(drill["log"], seen)}
    # More delay lowers no expected value here (the buffers still cover 28 ms at 500 Mbit/s) and loses nothing.
    assert fired == {"PathprobeRttAboveBaseline"}, fired
    restored = time.monotonic()
    wait_for("the RTT alert resolved", lambda: [a for a in new_alerts(drill["log"], seen, "resolved")
             if a["labels"]["alertname"] == "PathprobeRttAboveBaseline"], timeout=420)  # fmt: skip
    with capsys.disabled():
        print(f"\ndelay drill (+20 ms one way): fired after {time_to_fire:.0f} s, "
              f"resolved after {time.monotonic() - restored:.0f} s")  # fmt: skip


def alert_fired(log: Path, seen: int, alertname: str, host: str = "drill-a") -> list[dict]:
    return [a for a in new_alerts(log, seen) if a["labels"]["alertname"] == alertname and a["labels"]["host"] == host]


def alert_resolved(log: Path, seen: int, alertname: str) -> list[dict]:
    return [a for a in new_alerts(log, seen, "resolved") if a["labels"]["alertname"] == alertname]


def router_nft(script: str) -> None:
    subprocess.run(in_ns(ROUTER, ["nft", "-f", "-"]), input=script, text=True, check=True)


@pytest.mark.lab
def test_one_dead_ecmp_member_fires_the_partial_failure_alert(drill: dict, capsys: pytest.CaptureFixture[str]) -> None:
    # drill-a's echo prober sends over 8 sockets (source ports); a broken ECMP member drops what one of them
    # sends. The path's loss alone is 1/8 (loss alerts may join); the partial-failure alert names the path.
    seen = len(drill["log"].read_text().splitlines())

    def ports() -> list[int] | None:
        out = in_host("drill-a", ["ss", "-uanH", "dst", f"{address(2)}:9470"]).stdout
        found = sorted({int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()})
        return found if len(found) >= 8 else None

    victim = wait_for("drill-a's echo flows", ports, timeout=30)[3]
    impaired = time.monotonic()
    router_nft(f"table inet ecmp {{\n chain member {{\n type filter hook forward priority 0\n"
               f" udp sport {victim} drop\n }}\n}}\n")  # fmt: skip
    try:
        fired = wait_for(
            "the partial-failure alert",
            lambda: alert_fired(drill["log"], seen, "PathprobePathPartiallyFailing"),
            timeout=240,
        )
        time_to_fire = time.monotonic() - impaired
    finally:
        subprocess.run(in_ns(ROUTER, ["nft", "delete", "table", "inet", "ecmp"]), check=False)
    assert fired[0]["labels"]["peer"] == "drill-b" and fired[0]["labels"]["protocol"] == "udp", fired
    restored = time.monotonic()
    wait_for("it resolved", lambda: alert_resolved(drill["log"], seen, "PathprobePathPartiallyFailing"), timeout=240)
    with capsys.disabled():
        print(f"\nECMP drill (1 of 8 echo flows dropped): fired after {time_to_fire:.0f} s, "
              f"resolved after {time.monotonic() - restored:.0f} s")  # fmt: skip


@pytest.mark.lab
def test_a_path_mtu_black_hole_fires_and_names_the_size(drill: dict, capsys: pytest.CaptureFixture[str]) -> None:
    # The router's link to drill-b carries 1450 bytes, and its "fragmentation needed" is filtered: 1500-byte
    # packets (what the inter-region class must carry) vanish. Throughput tests stall too, so their alerts may join.
    seen = len(drill["log"].read_text().splitlines())
    impaired = time.monotonic()
    subprocess.run(["ip", "-n", ROUTER, "link", "set", "r2", "mtu", "1450"], check=True)
    router_nft("table inet pmtu {\n chain out {\n type filter hook output priority 0\n"
               " icmp type destination-unreachable icmp code frag-needed drop\n }\n}\n")  # fmt: skip
    try:
        fired = wait_for(
            "the black-hole alert", lambda: alert_fired(drill["log"], seen, "PathprobePathMtuBlackHole"), timeout=240
        )
        time_to_fire = time.monotonic() - impaired
    finally:
        subprocess.run(["ip", "-n", ROUTER, "link", "set", "r2", "mtu", "1500"], check=False)
        subprocess.run(in_ns(ROUTER, ["nft", "delete", "table", "inet", "pmtu"]), check=False)
    assert {(a["labels"]["peer"], a["labels"]["size_bytes"]) for a in fired} == {("drill-b", "1500")}, fired
    restored = time.monotonic()
    wait_for("it resolved", lambda: alert_resolved(drill["log"], seen, "PathprobePathMtuBlackHole"), timeout=240)
    with capsys.disabled():
        print(f"\nMTU drill (1500 bytes black-holed): fired after {time_to_fire:.0f} s, "
              f"resolved after {time.monotonic() - restored:.0f} s")  # fmt: skip
