"""mixin/mixin.libsonnet, evaluated by the jsonnet binary as a jsonnet-bundler user imports it:
at the defaults of its `_config` it yields exactly the committed rules (recording and alerting
groups apart) and dashboards; with other values, what the Python renders from the same
parameters. Its generated files (scripts/mixin.py) are current."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pathprobe.monitoring import params, rules

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "dashboards"))

import generate as dashboards  # noqa: E402  (dashboards/generate.py)

pytestmark = pytest.mark.skipif(shutil.which("jsonnet") is None, reason="the jsonnet binary (scripts/setup.sh)")


def mixin(config: str = "{}") -> dict[str, Any]:
    """The mixin's hidden fields with `config` added to its _config, from the jsonnet binary."""
    snippet = (
        f"local m = (import 'mixin/mixin.libsonnet') + {{ _config+:: {config} }};\n"
        "{rules: m.prometheusRules, alerts: m.prometheusAlerts, dashboards: m.grafanaDashboards}"
    )
    out = subprocess.run(
        ["jsonnet", "-J", str(ROOT), "-e", snippet], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_the_generated_jsonnet_is_current() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mixin.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr


def test_at_its_defaults_the_mixin_yields_the_committed_rules_and_dashboards() -> None:
    got = mixin()
    committed = yaml.safe_load((ROOT / "alerts" / "pathprobe.rules.yml").read_text())["groups"]
    assert got["rules"]["groups"] + got["alerts"]["groups"] == committed
    assert all("record" in rule for group in got["rules"]["groups"] for rule in group["rules"])
    assert all("alert" in rule for group in got["alerts"]["groups"] for rule in group["rules"])
    assert len(got["alerts"]["groups"]) == 1 and len(got["rules"]["groups"]) == len(committed) - 1
    json_dir = ROOT / "dashboards" / "json"
    assert got["dashboards"] == {f"pathprobe-{p.name}": json.loads(p.read_text()) for p in json_dir.glob("*.json")}


# The same change as _config (jsonnet) and as parameters (Python): a selector, thresholds of both
# kinds, windows (one that names recording rules, one compared in seconds), a count, the runbook.
CHANGED = {
    "selector": 'job="netprobe", team="net"',
    "throughput_ratio_warning": 0.7,
    "loss_ratio_critical": 0.1,
    "exporters_down_share": 0.25,
    "loss_min_lost_packets": 5,
    "rtt_exporter_window": "1m",
    "mtu_memory": "2d",
    "evaluation_interval": "30s",
}
RUNBOOK = "https://wiki.example.com/netops/pathprobe-runbook"


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def every_parameter_changed() -> dict[str, Any]:
    """Each parameter off its default (a number 20% lower, an integer one more, a duration one unit
    longer): a value that the generated jsonnet wrote as a literal shows."""
    changed: dict[str, Any] = {}
    for name, field in params.Params.model_fields.items():
        default = field.default
        if name in {"runbook_url_base", "selector"}:
            continue
        if isinstance(default, str):
            changed[name] = f"{int(default[:-1]) + 1}{default[-1]}"
        elif field.annotation is int:
            changed[name] = default + 1
        else:
            changed[name] = round(default * 0.8, 6)
    return {**changed, "selector": CHANGED["selector"]}


def the_rendering(config: dict[str, Any]) -> dict[str, Any]:
    """What the mixin should yield with `config` (parameters' names), from the Python."""
    p = params.Params.model_validate({**config, "runbook_url_base": RUNBOOK})
    assert not params.problems(p)
    expected = {f"pathprobe-{n}": json.loads(text) for n, text in dashboards.render(p).items()}
    for board in expected.values():  # the tags are the mixin's own (_config.dashboardTags)
        board["tags"] = ["network", "pathprobe"]
        for link in board["links"]:
            link["tags"] = ["network", "pathprobe"]
    return {"groups": rules.render(p)["groups"], "dashboards": expected}


def as_config(config: dict[str, Any]) -> str:
    jsonnet = {camel(k): v for k, v in config.items()}
    return json.dumps(jsonnet | {"runbookURLPattern": RUNBOOK + "#%s", "dashboardTags": ["network", "pathprobe"]})


def test_the_mixin_follows_every_parameter() -> None:
    config = every_parameter_changed()
    got, expected = mixin(as_config(config)), the_rendering(config)
    assert got["rules"]["groups"] + got["alerts"]["groups"] == expected["groups"]
    assert got["dashboards"] == expected["dashboards"]


def test_the_mixin_follows_a_changed_config() -> None:
    got, expected = mixin(as_config(CHANGED)), the_rendering(CHANGED)
    assert got["rules"]["groups"] + got["alerts"]["groups"] == expected["groups"]
    assert got["dashboards"] == expected["dashboards"]
    # And visibly so, not only equal to a rendering that might have ignored them too.
    alerts = {r["alert"]: r for r in got["alerts"]["groups"][0]["rules"]}
    assert "< 0.7\n" in alerts["PathprobeThroughputBelowExpected"]["expr"]
    assert 'up{job="netprobe", team="net"} == 0' in alerts["PathprobeExporterDown"]["expr"]
    assert (
        "> 0.25" in alerts["PathprobeExportersDown"]["expr"]
        and "25%" in alerts["PathprobeExportersDown"]["annotations"]["description"]
    )
    assert "< 172800" in alerts["PathprobePathMtuBlackHole"]["expr"]
    assert alerts["PathprobeExporterDown"]["annotations"]["runbook_url"] == RUNBOOK + "#pathprobeexporterdown"
    assert "path:pathprobe_rtt_seconds:p50_1m" in {r.get("record") for g in got["rules"]["groups"] for r in g["rules"]}
    overview = json.dumps(got["dashboards"]["pathprobe-overview.json"])
    assert 'job=\\"netprobe\\", team=\\"net\\"' in overview and "Green >= 70%" in overview


@pytest.mark.parametrize(
    ("config", "refusal"),
    [
        ({"runbookURLPattern": "alerts/runbook.md#%s"}, "_config.runbookURLPattern: not an absolute http(s) URL"),
        ({"throughputRatioCritical": 0.9}, "_config.throughputRatioCritical must be below throughputRatioWarning"),
        ({"rttBaselineStep": "8d"}, "_config.rttBaselineStep must be below rttBaselineWindow"),
    ],
)
def test_the_mixin_refuses_what_the_parameters_refuse(config: dict[str, Any], refusal: str) -> None:
    snippet = f"((import 'mixin/mixin.libsonnet') + {{ _config+:: {json.dumps(config)} }}).prometheusAlerts"
    out = subprocess.run(
        ["jsonnet", "-J", str(ROOT), "-e", snippet], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 1 and refusal in out.stderr, out.stderr


def test_the_jsonnetfile_is_jsonnet_bundlers() -> None:
    spec = json.loads((ROOT / "mixin" / "jsonnetfile.json").read_text())
    assert spec["version"] == 1 and isinstance(spec["dependencies"], list)
