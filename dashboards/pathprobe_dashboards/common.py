"""What every pathprobe dashboard shares: the data source, the region/host/peer
variables, the links between the dashboards, and small panel builders.

Conventions: one `datasource` variable that every panel uses; `job` and `instance`
variables, selected by every query of a series that has them, and `region`, `host` and
`peer` variables (multi, all); a unit and a description on every panel; stable UIDs;
rows, laid out by the SDK (no absolute positions); read-only (the code is the source);
the selector and the thresholds from the monitoring parameters. Grafana's dashboard
linter's rules (github.com/grafana/dashboard-linter, docs/rules) hold: tests/dashboard_lint.py
checks all of them, with the exceptions `json/.lint` lists (the linter's own exclusion file).
The overview's cells and rows link to Path detail (links.py).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import table, timeseries
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.common import TableColoredBackgroundCellOptions
from grafana_foundation_sdk.models.dashboard import (
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from pathprobe.monitoring.params import Params

from . import links

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
TAG = "pathprobe"
# Panel sizes on Grafana's 24-column grid.
FULL, HALF, THIRD, QUARTER = 24, 12, 8, 6


def target(p: Params) -> str:
    """The exporters' series, narrowed to the chosen jobs and instances (the scrape's own labels)."""
    return f'{p.selector}, job=~"$job", instance=~"$instance"'


def selector(p: Params) -> str:
    """The exporters' series of the chosen paths (peer_region: the overview's drill-down from a
    region pair sets it; every per-path series has it, pathprobe.metrics.common.PEER)."""
    return f'{target(p)}, region=~"$region", host=~"$host", peer=~"$peer", peer_region=~"$peer_region"'


def query(
    expr: str, legend: str = "", instant: bool = False, fmt: PromQueryFormat | None = None, ref: str = "A"
) -> Dataquery:
    q = Dataquery().expr(expr).ref_id(ref).datasource(DS)
    q = q.legend_format(legend) if legend else q
    q = q.instant() if instant else q.range()
    return q.format(fmt) if fmt else q


def lines(*pairs: tuple[str, str]) -> list[Dataquery]:
    """Range queries of one panel from (expr, legend) pairs, lettered A, B, C... in order."""
    return [query(expr, legend, ref=chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def steps(*pairs: tuple[float | None, str]) -> ThresholdsConfig:
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps([Threshold(v, c) for v, c in pairs])


def series(title: str, description: str, unit: str, *targets: Dataquery, span: int = HALF) -> timeseries.Panel:
    p = timeseries.Panel().title(title).description(description).unit(unit).datasource(DS).span(span).height(8)
    for t in targets:
        p = p.with_target(t)
    return p


def grid(  # noqa: PLR0913, PLR0917 - a panel's texts, query, colours and precision
    title: str,
    description: str,
    unit: str,
    expr: str,
    thresholds: ThresholdsConfig,
    decimals: int = 2,
) -> table.Panel:
    """A region x region matrix (perfSONAR MaDDash style): rows source region, columns peer region."""
    return (
        table.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .decimals(decimals)
        .datasource(DS)
        .span(THIRD)
        .height(9)
        .with_target(query(expr, instant=True, fmt=PromQueryFormat.TABLE))
        .with_transformation(
            DataTransformerConfig(
                id_val="groupingToMatrix",
                options={
                    "rowField": "region",
                    "columnField": "peer_region",
                    "valueField": "Value",
                    "emptyValue": "null",
                },
            )
        )
        .thresholds(thresholds)
        .cell_options(TableColoredBackgroundCellOptions())
        .data_links([links.cell_link()])
        # The first column holds the rows' regions (groupingToMatrix names it "row\\column"): no link.
        .override_by_name("region\\peer_region", [DynamicConfigValue("links", [])])
    )


def dashboard(p: Params, uid: str, title: str, description: str) -> Dashboard:
    info = f"pathprobe_peer_info{{{target(p)}"
    return (
        Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .readonly()
        .time("now-6h", "now")
        .refresh("1m")
        .timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(variable("job", "Job", f"label_values(pathprobe_peer_info{{{p.selector}}}, job)", ".+"))
        .with_variable(
            variable(
                "instance",
                "Instance",
                f'label_values(pathprobe_peer_info{{{p.selector}, job=~"$job"}}, instance)',
                ".+",
            )
        )
        .with_variable(variable("region", "Source region", f"label_values({info}}}, region)"))
        .with_variable(variable("host", "Source host", f'label_values({info}, region=~"$region"}}, host)'))
        .with_variable(variable("peer_region", "Peer region", f"label_values({info}}}, peer_region)"))
        .with_variable(
            variable("peer", "Peer", f'label_values({info}, host=~"$host", peer_region=~"$peer_region"}}, peer)')
        )
        .link(
            DashboardLink("pathprobe")
            .type(DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )


def variable(name: str, label: str, definition: str, all_value: str = ".*") -> QueryVariable:
    """A multi-value variable from a query; "All" is `all_value` (job and instance: ".+", as the
    linter's template rules ask: every series has them)."""
    return (
        QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query(definition)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(all_value)
        .current(VariableOption(True, "All", "$__all"))
    )
