"""The overview's drill-down: every panel links to Path detail, every link names a dashboard and
variables that exist there, and the labels a row's link reads are what the row names (the query
evaluated by the real promtool)."""

from __future__ import annotations

import re
import subprocess
import urllib.parse
from pathlib import Path

import yaml

from helpers import dashboards, panels

PARAM = re.compile(r"\$\{(\w+):queryparam\}")
FIELD = re.compile(r"\$\{__data\.fields\.(\w+)\}")


def data_links(panel: dict) -> list[dict]:
    return panel["fieldConfig"]["defaults"].get("links") or []


def variables(d: dict) -> set[str]:
    return {v["name"] for v in d["templating"]["list"]}


def test_every_overview_panel_links_to_existing_variables_in_the_time_range() -> None:
    found = dashboards()
    by_uid = {d["uid"]: d for d in found.values()}
    overview = found["overview.json"]
    for panel in panels(overview):
        assert data_links(panel), f"{panel['title']}: no data link"
        for link in data_links(panel):
            url = link["url"]
            path, _, query = url.partition("?")
            uid = path.split("/")[2]
            assert path.startswith("/d/") and uid in by_uid, url
            assert "from=${__from}&to=${__to}" in query, url
            target = variables(by_uid[uid])
            named = {
                k.removeprefix("var-") for k, _ in urllib.parse.parse_qsl(PARAM.sub("", query)) if k.startswith("var-")
            }
            carried = set(PARAM.findall(query))
            assert named | carried <= target, (panel["title"], (named | carried) - target)
            assert carried <= variables(overview), (panel["title"], carried - variables(overview))
            assert {"datasource", "job", "instance"} <= carried, url
            # A row's link reads labels that its query makes (links.with_detail_labels), hidden in the table.
            for field in FIELD.findall(url):
                assert f'"{field}"' in panel["targets"][0]["expr"], (panel["title"], field)
                hidden = [o for o in panel["fieldConfig"]["overrides"] if re.fullmatch(o["matcher"]["options"], field)]
                assert {"id": "custom.hidden", "value": True} in hidden[0]["properties"], (panel["title"], field)


def test_a_grid_cell_opens_the_paths_between_its_two_regions() -> None:
    grids = [
        p
        for p in panels(dashboards()["overview.json"])
        if p.get("transformations", [{}])[0].get("id") == "groupingToMatrix"
    ]
    assert len(grids) == 5
    for grid in grids:
        options = grid["transformations"][0]["options"]
        assert (options["rowField"], options["columnField"]) == ("region", "peer_region")
        [link] = data_links(grid)
        values = dict(urllib.parse.parse_qsl(link["url"].partition("?")[2]))
        # After groupingToMatrix the first field holds the row's region; each other column is named by its peer region.
        assert values["var-region"] == "${__data.fields[0]}" and values["var-peer_region"] == "${__field.name}"
        assert values["var-host"] == values["var-peer"] == "$__all"
        [first] = [
            o
            for o in grid["fieldConfig"]["overrides"]
            if o["matcher"] == {"id": "byName", "options": "region\\peer_region"}
        ]
        assert first["properties"] == [{"id": "links", "value": []}], "the regions' own column links nowhere"


def test_path_detail_narrows_to_a_peer_region() -> None:
    d = dashboards()["path-detail.json"]
    [peer] = [v for v in d["templating"]["list"] if v["name"] == "peer"]
    assert 'peer_region=~"$peer_region"' in peer["query"]
    for panel in panels(d):
        for t in panel["targets"]:
            if '_region=~"$region"' in t["expr"]:  # AWS's latency: source and destination
                assert 'destination_region=~"$peer_region"' in t["expr"], panel["title"]
            elif 'region=~"$region"' in t["expr"]:
                assert 'peer_region=~"$peer_region"' in t["expr"], panel["title"]


# Rows as the culprit rules and the alerts name them, and the Path detail variables each should set.
ALL = "$__all"
ROWS = [
    ({"scope": "host", "side": "egress", "host": "h1", "region": "r1", "zone": "z1"}, ("r1", "h1", ALL, ALL)),
    ({"scope": "host", "side": "ingress", "host": "h2", "peer": "h2", "region": "r2", "zone": "z2"},
     (ALL, ALL, "h2", "r2")),
    ({"scope": "zone", "zone": "z3", "peer_zone": "z3", "region": "r3"}, ("r3", ALL, ALL, ALL)),
    ({"scope": "region_pair", "region": "r4", "peer_region": "r5"}, ("r4", ALL, ALL, "r5")),
    ({"scope": "transit_gateway", "side": "egress", "attachment": "a1", "region": "r6"}, ("r6", ALL, ALL, ALL)),
    ({"scope": "transit_gateway", "side": "ingress", "attachment": "a2", "peer_attachment": "a2", "region": "r7"},
     (ALL, ALL, ALL, "r7")),
]  # fmt: skip
PATH_ALERT = {"alertname": "PathprobeRttHigh", "alertstate": "firing", "job": "pathprobe", "instance": "a:9469",
              "host": "a", "peer": "b", "region": "r1", "peer_region": "r2", "severity": "warning"}  # fmt: skip
DOWN_ALERT = {"alertname": "PathprobeExporterDown", "alertstate": "firing", "job": "pathprobe", "instance": "c:9469"}


def _series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _expected(labels: dict[str, str], values: tuple[str, ...]) -> dict[str, str]:
    joined = "/".join(labels.get(k, "") for k in ("side", "host", "peer", "region", "peer_region"))
    detail = dict(zip(("detail_region", "detail_host", "detail_peer", "detail_peer_region"), values, strict=True))
    return {**labels, "detail": joined, **detail}


def test_a_rows_hidden_labels_name_its_paths(tmp_path: Path) -> None:
    """The culprits' and the alerts' queries, evaluated by promtool on the rows that they show."""
    by_title = {p["title"]: p for p in panels(dashboards()["overview.json"])}
    culprits = by_title["Culprits now"]["targets"][0]["expr"]
    alerts = by_title["Firing pathprobe alerts"]["targets"][0]["expr"].replace("$job", ".+")
    culprit_series = [_series("culprit:pathprobe_culprit:level", labels) for labels, _ in ROWS]
    alert_rows = [(PATH_ALERT, ("r1", "a", "b", "r2")), (DOWN_ALERT, (ALL, ALL, ALL, ALL))]
    test = {
        "rule_files": [],
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": "1x3"} for s in culprit_series]
                + [{"series": _series("ALERTS", labels), "values": "1x3"} for labels, _ in alert_rows],
                "promql_expr_test": [
                    {
                        "expr": culprits,
                        "eval_time": "2m",
                        "exp_samples": [
                            {"labels": _series("", _expected(labels, values)), "value": 1} for labels, values in ROWS
                        ],
                    },
                    {
                        "expr": alerts,
                        "eval_time": "2m",
                        "exp_samples": [
                            {"labels": _series("ALERTS", _expected(labels, values)), "value": 1}
                            for labels, values in alert_rows
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "links.test.yml").write_text(yaml.safe_dump(test))
    proc = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / "links.test.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
