"""Dashboards as code: regenerating gives the committed JSON, and every dashboard follows
the conventions (the live queries run in test_demo.py against the lab's Prometheus)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
JSON = ROOT / "dashboards" / "json"
UIDS = {"overview.json": "pathprobe-overview", "path-detail.json": "pathprobe-path",
        "capacity.json": "pathprobe-capacity", "exporter-health.json": "pathprobe-exporter"}  # fmt: skip


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(JSON.glob("*.json"))}


def panels(d: dict) -> list[dict]:
    """The panels that show something (rows only group them)."""
    return [p for p in d["panels"] if p["type"] != "row"]


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
    substitute = {"$region": ".*", "$host": ".*", "$peer": ".*", "$__rate_interval": "1m", "$volume_tb": "40",
                  "$price_per_gb": "0.02"}  # fmt: skip
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
