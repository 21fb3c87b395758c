"""Dashboards as code: regenerating gives the committed JSON, and every dashboard follows
the conventions (the live queries run in test_demo.py against the lab's Prometheus)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import promql_parser
import pytest
import yaml

from helpers import DASHBOARDS_JSON, dashboards, panels

ROOT = Path(__file__).parents[1]
UIDS = {"overview.json": "pathprobe-overview", "path-detail.json": "pathprobe-path",
        "capacity.json": "pathprobe-capacity", "exporter-health.json": "pathprobe-exporter"}  # fmt: skip


def test_regenerating_gives_the_committed_json() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "dashboards" / "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
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
    for var in ("region", "host", "peer"):
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
    substitute = {"$job": ".+", "$instance": ".+", "$region": ".*", "$host": ".*", "$peer": ".*",
                  "$__rate_interval": "1m", "$volume_tb": "40", "$price_per_gb": "0.02"}  # fmt: skip
    rules = []
    for name, d in dashboards().items():
        for i, panel in enumerate(panels(d)):
            for j, target in enumerate(panel["targets"]):
                expr = target["expr"]
                for var, value in substitute.items():
                    expr = expr.replace(var, value)
                rules.append({"record": f"check:{name.removesuffix('.json').replace('-', '_')}:{i}_{j}", "expr": expr})
    (tmp_path / "panels.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    proc = subprocess.run(["promtool", "check", "rules", str(tmp_path / "panels.yml")], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- Grafana's dashboard linter, github.com/grafana/dashboard-linter ------------------------
# Its rules (docs/rules/*.md; the checks of lint/rule_*.go) re-implemented here, because the
# linter (Go) cannot be built on this machine; its exclusion file json/.lint is applied as it
# applies it. The selectors of a query are read by a PromQL parser after Grafana's variables
# are replaced as the linter replaces them (lint/variables.go): not inside double quotes, so a
# matcher's "$job" stays as written, and $__rate_interval as a duration of its own to tell it.
RATE_INTERVAL = "4321s"
GLOBALS = {"__rate_interval": RATE_INTERVAL, "__interval": "1m", "__range": "1h", "__range_s": "3600"}
VARIABLE = re.compile(r"\$(\w+)|\$\{([^}]+)\}|\[\[([^\[\]]+)\]\]")
# lint/rule_panel_units.go's list, for the units these dashboards could use.
UNITS = {"none", "short", "percent", "percentunit", "bytes", "decbytes", "bits", "decbits", "pps", "Bps", "bps",
         "binBps", "binbps", "s", "ms", "µs", "ns", "m", "h", "d", "ops", "reqps", "rps", "currencyUSD",
         "dateTimeAsIso", "dateTimeFromNow", "bool"}  # fmt: skip
QUERY_PANELS = {"singlestat", "gauge", "table", "stat", "state-timeline", "timeseries"}  # lint: panelHasQueries
DATASOURCE_PANELS = {"singlestat", "graph", "table", "timeseries"}
UNIT_PANELS = {"stat", "singlestat", "graph", "table", "timeseries", "gauge"}
TEMPLATED = {"$datasource", "${datasource}"}


def expand(expr: str, variables: list[dict]) -> str:
    """Grafana's variables replaced by sample values outside double quotes (lint/variables.go)."""
    current = {v["name"]: v.get("current", {}).get("value") for v in variables}

    def sample(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g).split(":")[0]
        if name in GLOBALS:
            return GLOBALS[name]
        value = current.get(name)
        return value if isinstance(value, str) and value and not value.startswith("$") else name

    parts = expr.split('"')
    return '"'.join(part if i % 2 else VARIABLE.sub(sample, part) for i, part in enumerate(parts))


def lint(name: str, d: dict) -> list[tuple[str, str, str]]:
    """(rule, panel title or "", problem) for every finding of the rules, before exclusions."""
    found: list[tuple[str, str, str]] = []
    variables = d["templating"]["list"]
    sources = [v for v in variables if v["type"] == "datasource"]
    if len(sources) != 1 or sources[0]["name"] != "datasource" or sources[0].get("query") != "prometheus":
        found.append(("template-datasource-rule", "", f"one Prometheus data source variable: {sources}"))
    for var in ("job", "instance"):
        t = next((v for v in variables if v["name"] == var), None)
        ok = (t is not None and t["type"] == "query" and t["datasource"]["uid"] in TEMPLATED and t.get("multi")
              and t.get("allValue") == ".+" and t.get("label") == var.title())  # fmt: skip
        if not ok:
            found.append((f"template-{var}-rule", "", f"the {var} variable: {t}"))
    if d.get("editable", True):
        found.append(("uneditable-dashboard", "", "is editable"))
    for panel in panels(d):
        found += lint_panel(panel, variables)
    return found


def lint_panel(panel: dict, variables: list[dict]) -> list[tuple[str, str, str]]:
    found, title, kind = [], panel["title"], panel["type"]
    if kind in DATASOURCE_PANELS and panel["datasource"]["uid"] not in TEMPLATED:
        found.append(("panel-datasource-rule", title, str(panel["datasource"])))
    if kind in UNIT_PANELS and panel["fieldConfig"]["defaults"].get("unit") not in UNITS:
        found.append(("panel-units-rule", title, str(panel["fieldConfig"]["defaults"].get("unit"))))
    for target in panel["targets"]:
        nodes: list[object] = []
        promql_parser.walk(promql_parser.parse(expand(target["expr"], variables)), pre_visit=nodes.append)
        for node in nodes:
            if isinstance(node, promql_parser.VectorSelector):
                matchers = {(m.name, str(m.op), m.value) for m in node.matchers.matchers}
                for var in ("job", "instance"):
                    if (var, str(promql_parser.MatchOp.Re), f"${var}") not in matchers:
                        found.append((f"target-{var}-rule", title, f'{node}: no {var}=~"${var}"'))
            rate_call = isinstance(node, promql_parser.Call) and node.func.name in ("rate", "irate")
            if rate_call and kind in QUERY_PANELS:
                fixed = [a for a in node.args if isinstance(a, promql_parser.MatrixSelector)
                         and a.range != promql_parser.parse_duration(RATE_INTERVAL)]  # fmt: skip
                found += [("target-rate-interval-rule", title, f"{node}: not $__rate_interval") for _ in fixed]
    return found


def excluded(rule: str, dashboard: str, panel: str, exclusions: dict) -> bool:
    if rule not in exclusions:
        return False
    entries = (exclusions[rule] or {}).get("entries") or []
    return not entries or any(e.get("dashboard", dashboard) == dashboard and e.get("panel", panel) == panel
                              for e in entries)  # fmt: skip


def test_the_dashboard_linters_rules_hold() -> None:
    exclusions = yaml.safe_load((DASHBOARDS_JSON / ".lint").read_text())["exclusions"]
    used = set()
    for name, d in dashboards().items():
        findings = lint(name, d)
        problems = [f for f in findings if not excluded(f[0], d["title"], f[1], exclusions)]
        assert problems == [], f"{name}: {problems}"
        used |= {(rule, d["title"], panel) for rule, panel, _ in findings}
    # Every exclusion is still needed: none hides a panel that meanwhile follows the rule.
    for rule, spec in exclusions.items():
        for entry in spec["entries"]:
            assert (rule, entry["dashboard"], entry["panel"]) in used, (rule, entry)


def test_the_linter_checks_here_find_what_they_are_for() -> None:
    """The checks above on a dashboard that breaks each rule: they can fail."""
    d = dashboards()["path-detail.json"]
    d["editable"] = True
    d["templating"]["list"] = [v for v in d["templating"]["list"] if v["name"] != "instance"]
    panel = panels(d)[0]
    panel["datasource"] = {"type": "prometheus", "uid": "pathprobe-prometheus"}
    panel["fieldConfig"]["defaults"]["unit"] = "furlongs"
    panel["targets"][0]["expr"] = 'rate(pathprobe_probe_runs_total{job=~"$job"}[5m])'
    rules = {rule for rule, _, _ in lint("broken.json", d)}
    assert rules == {"uneditable-dashboard", "template-instance-rule", "panel-datasource-rule", "panel-units-rule",
                     "target-instance-rule", "target-rate-interval-rule"}  # fmt: skip
