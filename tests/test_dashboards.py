"""Dashboards as code: regenerating gives the committed JSON, and every dashboard follows
the conventions (the live queries run in test_demo.py against the lab's Prometheus)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import dashboard_lint
import pytest
import yaml

from helpers import DASHBOARDS_JSON, dashboards, panels

ROOT = Path(__file__).parents[1]
UIDS = {
    "overview.json": "pathprobe-overview",
    "path-detail.json": "pathprobe-path",
    "capacity.json": "pathprobe-capacity",
    "exporter-health.json": "pathprobe-exporter",
}


def test_regenerating_gives_the_committed_json() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "dashboards" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_stable_uids_and_links() -> None:
    found = dashboards()
    assert {name: d["uid"] for name, d in found.items()} == UIDS
    for d in found.values():
        assert any(link.get("tags") == ["pathprobe"] and link.get("includeVars") for link in d["links"]), d["uid"]


@pytest.mark.parametrize("name", sorted(UIDS))
def test_conventions(name: str) -> None:
    d = dashboards()[name]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert [v for v in variables.values() if v["type"] == "datasource"] == [variables["datasource"]]
    for var in ("region", "host", "peer", "peer_region"):
        assert variables[var]["multi"] and variables[var]["includeAll"], var
    assert d["panels"][0]["type"] == "row", f"{name}: panels are grouped in rows"
    for panel in panels(d):
        title = panel.get("title")
        assert title, f"{name}: a panel without a title"
        assert panel.get("description"), f"{name}/{title}: no description"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{name}/{title}: no unit"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, f"{name}/{title}"
        assert panel["targets"], f"{name}/{title}: no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", f"{name}/{title}: hard-coded datasource"


def test_provisioning_files() -> None:
    ds = yaml.safe_load((ROOT / "dashboards" / "provisioning" / "datasources" / "pathprobe.yml").read_text())
    assert [d["uid"] for d in ds["datasources"]] == ["pathprobe-prometheus"]
    prov = yaml.safe_load((ROOT / "dashboards" / "provisioning" / "dashboards" / "pathprobe.yml").read_text())
    assert prov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/pathprobe"


def test_a_fleets_parameters_reach_the_dashboards(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text('selector: job="netprobe", env="prod"\nthroughput_ratio_warning: 0.7\n')
    out = tmp_path / "json"
    cmd = [sys.executable, str(ROOT / "dashboards" / "generate.py"), "--params", str(params), "--out-dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    path = (out / "path-detail.json").read_text()  # the overview reads the region-pair rules only
    assert 'job=\\"netprobe\\", env=\\"prod\\"' in path and 'job=\\"pathprobe\\"' not in path
    assert "below 70% of expected" in (out / "overview.json").read_text()


def test_every_panel_query_parses(tmp_path: Path) -> None:
    """PromQL syntax of every query, by the real promtool (the lab runs them for data in test_demo.py)."""
    substitute = {
        "$job": ".+",
        "$instance": ".+",
        "$region": ".*",
        "$host": ".*",
        "$peer_region": ".*",  # before $peer, its prefix
        "$peer": ".*",
        "$__rate_interval": "1m",
        "$volume_tb": "40",
        "$price_per_gb": "0.02",
    }
    rules = []
    for name, d in dashboards().items():
        for i, panel in enumerate(panels(d)):
            for j, target in enumerate(panel["targets"]):
                expr = target["expr"]
                for var, value in substitute.items():
                    expr = expr.replace(var, value)
                rules.append({"record": f"check:{name.removesuffix('.json').replace('-', '_')}:{i}_{j}", "expr": expr})
    (tmp_path / "panels.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    proc = subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "panels.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- Grafana's dashboard linter, github.com/grafana/dashboard-linter --------------------------
# All of its rules (tests/dashboard_lint.py, pinned to the commit it was read at), with its
# exclusion file json/.lint applied as it applies it; a warning fails too (the linter's --strict).


def test_the_dashboard_linters_rules_hold() -> None:
    config = yaml.safe_load((DASHBOARDS_JSON / ".lint").read_text())
    used: set[tuple[str, str]] = set()
    for name, d in dashboards().items():
        left, matched = dashboard_lint.configured(d, dashboard_lint.lint(d), config)
        assert left == [], f"{name}: {left}"
        used |= matched
    # Every exclusion is still needed: none hides a panel that meanwhile follows the rule.
    for rule, spec in config["exclusions"].items():
        for entry in spec["entries"]:
            assert (rule, json.dumps(entry, sort_keys=True)) in used, (rule, entry)


def test_every_rule_of_the_linter_is_checked() -> None:
    assert sorted(dashboard_lint.RULES) == sorted(LINTER_RULES)


def test_the_linter_checks_here_find_what_they_are_for() -> None:
    """The checks on a dashboard that breaks each rule (bar LogQL's: a Loki target): they can fail."""
    d = dashboards()["path-detail.json"]
    d["editable"] = True
    variables = d["templating"]["list"]
    d["templating"]["list"] = [v for v in variables if v["name"] != "instance"]
    source = next(v for v in variables if v["name"] == "datasource")
    source["label"] = "Prometheus"
    job = next(v for v in variables if v["name"] == "job")
    job.update(refresh=1, query="label_values(pathprobe_peer_info{, job)")
    first, second, third, fourth = panels(d)[:4]
    first["datasource"] = {"type": "prometheus", "uid": "pathprobe-prometheus"}
    first["fieldConfig"]["defaults"]["unit"] = "furlongs"
    first["description"] = ""
    first["targets"][0]["expr"] = 'rate(pathprobe_probe_runs_total{job=~"$job"}[5m])'
    second["targets"][0]["expr"] = "sum(pathprobe_probe_runs_total)"
    del third["targets"]
    fourth["targets"][0]["expr"] = "sum(("
    config = yaml.safe_load((DASHBOARDS_JSON / ".lint").read_text())
    # Findings on the panels .lint exempts (AWS's latency from its own job) are left out, as above.
    left, _ = dashboard_lint.configured(d, dashboard_lint.lint(d), config)
    assert {f.rule for f in left} == {
        "uneditable-dashboard",
        "template-datasource-rule",
        "template-instance-rule",
        "template-label-promql-rule",
        "template-on-time-change-reload-rule",
        "panel-datasource-rule",
        "panel-title-description-rule",
        "panel-units-rule",
        "panel-no-targets-rule",
        "target-promql-rule",
        "target-job-rule",
        "target-instance-rule",
        "target-rate-interval-rule",
        "target-counter-agg-rule",
    }
    second["targets"][0].update(expr='{job="x"}', datasource={"type": "loki", "uid": "${datasource}"})
    rules = {f.rule for f in dashboard_lint.lint(d)}
    assert {"target-logql-rule", "target-logql-auto-rule"} <= rules


# lint/rules.go's NewRuleSet at the pinned commit.
LINTER_RULES = [
    "template-datasource-rule",
    "template-job-rule",
    "template-instance-rule",
    "template-label-promql-rule",
    "template-on-time-change-reload-rule",
    "panel-datasource-rule",
    "panel-title-description-rule",
    "panel-units-rule",
    "panel-no-targets-rule",
    "target-logql-rule",
    "target-logql-auto-rule",
    "target-promql-rule",
    "target-rate-interval-rule",
    "target-job-rule",
    "target-instance-rule",
    "target-counter-agg-rule",
    "uneditable-dashboard",
]


def test_the_last_tests_link_opens_its_record_on_the_exporter(tmp_path: Path) -> None:
    """Path detail's link from a test's id: the URL Grafana makes of the table's row (its instance and
    test_id, as pathprobe_evidence_last_test_info labels them) is the exporter's /tests/<id>."""
    from pathprobe import evidence
    from pathprobe.web.evidence import EvidenceRoutes

    [panel] = [x for x in panels(dashboards()["path-detail.json"]) if x["title"] == "Last test's record"]
    assert "pathprobe_evidence_last_test_info{" in panel["targets"][0]["expr"]
    [override] = panel["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byName", "options": "test_id"}
    [link] = next(p["value"] for p in override["properties"] if p["id"] == "links")
    store = evidence.EvidenceStore(tmp_path, 10, 2**20).open()
    test_id = evidence.new_id(1.7e9)
    store.add(evidence.record(test_id=test_id, host="a", key=("b", "tcp", "1", "send"), started=1.7e9, ended=1.7e9,
                              outcome="ran", settings={}))  # fmt: skip
    url = link["url"].replace("${__data.fields.instance}", "t:9469").replace("${__value.raw}", test_id)
    assert url == f"http://t:9469/tests/{test_id}"
    status: list[str] = []
    body = EvidenceRoutes(store)({"PATH_INFO": url.removeprefix("http://t:9469")}, lambda s, h: status.append(s))
    assert status == ["200 OK"] and test_id.encode() in b"".join(body)
