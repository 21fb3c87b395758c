"""Drill-down: data links from the overview's cells and rows to Path detail, narrowed to the paths
they name, in the same time range, with the same data source, jobs and instances.

Grafana's data-link variables (grafana.com/docs/grafana/latest/panels-visualizations/configure-data-links/,
"Data link variables"): `${__data.fields[i]}` / `${__data.fields.NAME}` a field's value on the
clicked row, `${__field.name}` the clicked column's name, `${__from}` / `${__to}` the time range,
`${VAR:queryparam}` a dashboard variable as `var-VAR=value` (each value; `$__all` for All).

A row names its paths in labels that differ by kind (a culprit host is the source of its paths on
egress, the peer on ingress; a region pair has both regions; a per-path alert has all four), and a
link cannot choose by row. So the row's query also yields one hidden label per variable of Path
detail, `detail_<var>`: the value the row names, or `$__all`. `with_detail_labels` computes them
in PromQL (label_replace adds labels and changes no value or series); the table hides them.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import DashboardLink
from grafana_foundation_sdk.models.dashboard import DynamicConfigValue

PATH_DETAIL = "/d/pathprobe-path/pathprobe-path-detail"
# The variables a drill-down sets on Path detail, and those it carries from the dashboard it leaves.
NARROWED = ("region", "host", "peer", "peer_region")
CARRIED = ("datasource", "job", "instance")
ALL = "$__all"  # Grafana's value of a variable's All option, in a URL too
TIME = "from=${__from}&to=${__to}"
# One row's labels, joined (side first: "ingress" swaps the source's labels to the peer's).
JOINED = ("side", "host", "peer", "region", "peer_region")
_ANY, _ONE, _NOT_INGRESS = "[^/]*", "([^/]+)", "(?:egress)?"


def detail_url(values: dict[str, str], carried: tuple[str, ...] = CARRIED) -> str:
    """Path detail's URL with each variable of `values` set and the `carried` ones passed on."""
    params = [f"var-{var}={value}" for var, value in values.items()]
    params += [f"${{{var}:queryparam}}" for var in carried]
    return f"{PATH_DETAIL}?{'&'.join([*params, TIME])}"


def link(title: str, url: str) -> DashboardLink:
    return DashboardLink(title).url(url)


def row_link(title: str) -> DashboardLink:
    """A table row's link to the paths its `detail_*` labels name (see `with_detail_labels`)."""
    return link(title, detail_url({var: f"${{__data.fields.detail_{var}}}" for var in NARROWED}))


def cell_link() -> DashboardLink:
    """A region x region grid's cell (after groupingToMatrix: the row's region in the first field,
    the peer region in the column's name) to the paths between the two regions."""
    return link(
        "Paths from this region to that one",
        detail_url({"region": "${__data.fields[0]}", "peer_region": "${__field.name}", "host": ALL, "peer": ALL}),
    )


def panel_link(title: str) -> DashboardLink:
    """A stat's link (it names no path): Path detail with this dashboard's own choice of paths."""
    return link(title, detail_url({}, (*CARRIED, *NARROWED)))


# A table's hidden columns: the computed labels stay in the frame for the links, out of sight.
HIDDEN = DynamicConfigValue("custom.hidden", True)
HIDDEN_FIELDS = "detail.*"


def with_detail_labels(expr: str) -> str:
    """`expr` with the labels `detail_region`, `detail_host`, `detail_peer` and `detail_peer_region`
    (and `detail`, the join they are read from): what a row names, or `$__all`.

    Not ingress (a path, an egress culprit, a zone, a region pair): host, peer, region and
    peer_region are themselves. Ingress (a culprit host or attachment as a receiver): its host is
    the paths' peer and its region their peer region."""
    rules = [
        ("detail_host", f"{_NOT_INGRESS}/{_ONE}/{_ANY}/{_ANY}/{_ANY}"),
        ("detail_peer", f"{_ANY}/{_ANY}/{_ONE}/{_ANY}/{_ANY}"),
        ("detail_peer", f"ingress/{_ONE}/{_ANY}/{_ANY}/{_ANY}"),
        ("detail_region", f"{_NOT_INGRESS}/{_ANY}/{_ANY}/{_ONE}/{_ANY}"),
        ("detail_peer_region", f"{_ANY}/{_ANY}/{_ANY}/{_ANY}/{_ONE}"),
        ("detail_peer_region", f"ingress/{_ANY}/{_ANY}/{_ONE}/{_ANY}"),
    ]
    out = "label_join({}, {})".format(expr, ", ".join(f'"{x}"' for x in ("detail", "/", *JOINED)))
    for var in NARROWED:  # "$$" is label_replace's literal "$": the value is $__all
        out = f'label_replace({out}, "detail_{var}", "$$__all", "detail", ".*")'
    for dst, regex in rules:
        out = f'label_replace({out}, "{dst}", "$1", "detail", "{regex}")'
    return out
