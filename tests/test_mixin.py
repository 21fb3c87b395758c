"""mixin/mixin.libsonnet, evaluated with the jsonnet package as a jsonnet-bundler user would
import it, yields exactly the committed rules (recording and alerting groups apart) and
dashboards."""

from __future__ import annotations

import json
from pathlib import Path

import _jsonnet
import yaml

ROOT = Path(__file__).parents[1]


def mixin() -> dict:
    # As a user imports it once vendored: the mixin's hidden fields, from a snippet.
    snippet = ("local m = import 'mixin/mixin.libsonnet';\n"
               "{rules: m.prometheusRules, alerts: m.prometheusAlerts, dashboards: m.grafanaDashboards}")  # fmt: skip
    return json.loads(_jsonnet.evaluate_snippet("main.jsonnet", snippet, jpathdir=[str(ROOT)]))  # type: ignore[no-any-return]


def test_the_mixin_yields_the_committed_rules_and_dashboards() -> None:
    got = mixin()
    committed = yaml.safe_load((ROOT / "alerts" / "pathprobe.rules.yml").read_text())["groups"]
    assert got["rules"]["groups"] + got["alerts"]["groups"] == committed
    assert all("record" in rule for group in got["rules"]["groups"] for rule in group["rules"])
    assert all("alert" in rule for group in got["alerts"]["groups"] for rule in group["rules"])
    assert len(got["alerts"]["groups"]) == 1 and len(got["rules"]["groups"]) == len(committed) - 1
    json_dir = ROOT / "dashboards" / "json"
    assert got["dashboards"] == {f"pathprobe-{p.name}": json.loads(p.read_text()) for p in json_dir.glob("*.json")}


def test_the_jsonnetfile_is_jsonnet_bundlers() -> None:
    spec = json.loads((ROOT / "mixin" / "jsonnetfile.json").read_text())
    assert spec["version"] == 1 and isinstance(spec["dependencies"], list)
