"""Grafana's dashboard linter (github.com/grafana/dashboard-linter, Apache-2.0), its rules as its
source has them at commit 4d0844b40d49cbfd442916fc6c0c3c6fc81084e3 (2026-06-18; lint/rules.go's
NewRuleSet: 17 rules, lint/rule_*.go), re-implemented in Python so that the tests run without Go:
the linter needs Loki's LogQL parser (AGPL) to build, which this project does not take in.

Where this differs from the Go code, it says so: PromQL is parsed by promql_parser (the Rust
promql-parser crate) instead of Prometheus's parser; the two LogQL rules only report a Loki query
(none here) as unchecked. The linter's exclusion file (.lint beside the dashboards) is applied as
lint/configuration.go applies it.

    lint(dashboard) -> [Finding]       every error and warning, before the exclusion file
    configured(findings, config)       the findings the exclusion file leaves
"""

from __future__ import annotations

import datetime
import json
import re
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import promql_parser as pp

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    message: str
    panel: str | None = None  # the panel's title, for panel and target rules
    target: int | None = None  # the target's index, for target rules


# --- lint/variables.go: Grafana's variables replaced by sample values ------------------------
GLOBALS: dict[str, object] = {
    "__rate_interval": "8869990787ms",
    "__interval": "4867856611ms",
    "__interval_ms": "7781188786",
    "__range_ms": "6737667980",
    "__range_s": "9397795485",
    "__range": "6069770749ms",
    "__dashboard": "AwREbnft",
    "__from": datetime.datetime(2020, 7, 13, 20, 19, 9, 254000, tzinfo=datetime.UTC),
    "__to": datetime.datetime(2020, 7, 13, 20, 19, 9, 254000, tzinfo=datetime.UTC),
    "__name": "name",
    "__org": 42,
    "__org.name": "orgname",
    "__user.id": 42,
    "__user.login": "user",
    "__user.email": "user@test.com",
    "timeFilter": "time > now() - 7d",
    "__timeFilter": "time > now() - 7d",
    "__auto": "12345ms",
}
RATE_INTERVAL = datetime.timedelta(milliseconds=8869990787)
VARIABLE = re.compile(r"\$([0-9A-Za-z_]+)|\$\{([^}]+)\}|\[\[([^\[\]]+)\]\]")


def _string_value(name: str, value: object, kind: str, fmt: str) -> str:
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime.datetime):
        if kind == "date":
            if fmt == "seconds":
                return str(int(value.timestamp()))
            if fmt == "iso":
                return value.strftime("%Y-%m-%dT%H:%M:%SZ")
            raise ValueError(f"unsupported momentjs time format: {fmt}")
        return value.strftime("%Y-%m-%dT%H:%M:%SZ") if fmt == "date" else str(int(value.timestamp() * 1000))
    s = str(value)
    items = [s, s, s]  # a list's sample: the value three times
    formats: dict[str, Callable[[], str]] = {
        "csv": lambda: ",".join(items),
        "doublequote": lambda: '"' + '","'.join(items) + '"',
        "glob": lambda: "{" + ",".join(items) + "}",
        "json": lambda: json.dumps(items, separators=(",", ":")),
        "lucene": lambda: '("' + '" OR "'.join(items) + '")',
        "percentencode": lambda: urllib.parse.quote_plus(",".join(items)),
        "pipe": lambda: "|".join(items),
        "raw": lambda: ",".join(items),
        "regex": lambda: "|".join(items),
        "singlequote": lambda: "'" + "','".join(items) + "'",
        "sqlstring": lambda: "'" + "','".join(items) + "'",
        "text": lambda: " + ".join(items),
        "queryparam": lambda: urllib.parse.urlencode([(f"var-{name}", x) for x in items]),
    }
    return formats[fmt]() if fmt in formats else s


def _first(value: object) -> str:
    return str(value[0]) if isinstance(value, list) else str(value or "")


def _sample(spec: str, variables: list[dict]) -> str:
    parts = spec.split(":")
    if len(parts) > 3:
        raise ValueError(f"unknown variable format: {spec}")
    name, kind, fmt = [*parts, "", ""][:3] if len(parts) != 2 else (parts[0], "", parts[1])
    if name in GLOBALS:
        return _string_value(name, GLOBALS[name], kind, fmt)
    if name.startswith("__auto_interval"):
        return "10s"
    for v in variables:
        if v.get("name") != name:
            continue
        others = [x for x in variables if x.get("name") != name]
        current = _first((v.get("current") or {}).get("value"))
        if current:
            return expand(current, others)
        if v.get("options"):
            return expand(_first(v["options"][0].get("value")), others)
    return _string_value(name, name, kind, fmt)


def expand(expr: str, variables: list[dict]) -> str:
    """expandVariables: every variable outside double quotes replaced by a sample value."""
    parts = expr.split('"')
    for i in range(0, len(parts), 2):
        parts[i] = VARIABLE.sub(lambda m: _sample(next(g for g in m.groups() if g is not None), variables), parts[i])
    return '"'.join(parts)


# promql_parser overflows on milliseconds past 2**32 (the samples' "8869990787ms"): the same
# duration in seconds and milliseconds parses.
LONG_MS = re.compile(r"\b(\d{10,})ms\b")


def parse(expr: str, variables: list[dict]) -> pp.Expr:
    text = LONG_MS.sub(lambda m: f"{int(m[1]) // 1000}s{int(m[1]) % 1000}ms", expand(expr, variables))
    return pp.parse(text)


# --- the dashboard model of lint/lint.go ----------------------------------------------------
def all_panels(d: dict) -> list[dict]:
    """GetPanels: the (deprecated) rows' panels, then the panels, each with its nested ones."""

    def nested(p: dict) -> list[dict]:
        return [p] + [q for child in p.get("panels") or [] for q in nested(child)]

    rows = [q for row in d.get("rows") or [] for p in row.get("panels") or [] for q in nested(p)]
    return rows + [q for p in d.get("panels") or [] for q in nested(p)]


def datasource_uid(raw: object) -> str:
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, dict) and isinstance(raw.get("uid"), str):
        return raw["uid"]
    raise ValueError(f"invalid type for field 'datasource': {raw}")


def template_query(t: dict) -> str:
    raw = t.get("query")
    if t.get("type") in ("adhoc", "custom"):
        return ""
    if isinstance(raw, dict):
        return str(raw.get("query", ""))
    return raw if isinstance(raw, str) else ""


def templates(d: dict) -> list[dict]:
    return (d.get("templating") or {}).get("list") or []


def prometheus(d: dict) -> bool:
    """getTemplateDatasource(d).Query == "prometheus": the rules for PromQL apply."""
    first = next((t for t in templates(d) if t.get("type") == "datasource"), None)
    return first is not None and template_query(first) == "prometheus"


def walk(node: object, parents: tuple[object, ...] = ()) -> Iterator[tuple[object, tuple[object, ...]]]:
    """parser.Walk's order: each node with the path from the root to it."""
    yield node, parents
    below = (*parents, node)
    children: list[object] = []
    if isinstance(node, pp.BinaryExpr):
        children = [node.lhs, node.rhs]
    elif isinstance(node, pp.AggregateExpr):
        children = [c for c in (node.param, node.expr) if c is not None]
    elif isinstance(node, pp.Call):
        children = list(node.args)
    elif isinstance(node, pp.MatrixSelector):
        children = [node.vector_selector]
    elif isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        children = [node.expr]
    for child in children:
        yield from walk(child, below)


def selectors(expr: pp.Expr) -> list[pp.VectorSelector]:
    return [n for n, _ in walk(expr) if isinstance(n, pp.VectorSelector)]


def matchers(sel: pp.VectorSelector) -> list[tuple[str, str, str]]:
    """The selector's matchers, the metric name's too (parser.ExtractSelectors gives it as __name__)."""
    found = [(m.name, str(m.op), m.value) for m in sel.matchers.matchers]
    return found + ([("__name__", str(pp.MatchOp.Equal), sel.name)] if sel.name else [])


# --- the rules -----------------------------------------------------------------------------
DASHBOARD_RULES: dict[str, Callable[[dict], list[tuple[str, str]]]] = {}
PANEL_RULES: dict[str, Callable[[dict, dict], list[str]]] = {}
TARGET_RULES: dict[str, Callable[[dict, dict, dict], list[str]]] = {}
QUERY_PANELS = ("singlestat", "gauge", "table", "stat", "state-timeline", "timeseries")  # panelHasQueries
SHOWING = ("stat", "singlestat", "graph", "table", "timeseries", "gauge")


def dashboard_rule(name: str) -> Callable:
    return lambda fn: DASHBOARD_RULES.setdefault(name, fn)


def panel_rule(name: str) -> Callable:
    return lambda fn: PANEL_RULES.setdefault(name, fn)


def target_rule(name: str) -> Callable:
    return lambda fn: TARGET_RULES.setdefault(name, fn)


@dashboard_rule("template-datasource-rule")
def _template_datasource(d: dict) -> list[tuple[str, str]]:
    found = []
    sources = [t for t in templates(d) if str(t.get("type", "")).lower() == "datasource"]
    if not sources:
        found.append((ERROR, "does not have a templated data source"))
    for t in sources:
        query = template_query(t)
        uids, names = {f"{query.lower()}_datasource"}, {f"{query.title()} data source"}
        if len(sources) == 1:
            uids.add("datasource")
            names.add("Data source")
        if t.get("name") not in uids:
            found.append((ERROR, f"templated data source variable named '{t.get('name')}', should be one of {uids}"))
        if t.get("label", "") not in names:
            found.append((WARNING, f"templated data source variable labeled '{t.get('label')}', should be {names}"))
    return found


def _check_template(d: dict, name: str) -> list[tuple[str, str]]:
    if not prometheus(d):
        return []
    t = next((x for x in templates(d) if x.get("name") == name), None)
    if t is None:
        return [(ERROR, f"is missing the {name} template")]
    found = []
    uid = datasource_uid(t.get("datasource"))
    if uid not in ("$datasource", "${datasource}", "$prometheus_datasource", "${prometheus_datasource}"):
        found.append((ERROR, f"{name} template should use datasource '$datasource', is currently '{uid}'"))
    if t.get("type") != "query":
        found.append((ERROR, f"{name} template should be a Prometheus query, is currently '{t.get('type')}'"))
    if t.get("label", "") != name.title():
        found.append((WARNING, f"{name} template should be a labeled '{name.title()}', is '{t.get('label')}'"))
    if not t.get("multi"):
        found.append((ERROR, f"{name} template should be a multi select"))
    if t.get("allValue", "") != ".+":
        found.append((ERROR, f"{name} template allValue should be '.+', is currently '{t.get('allValue')}'"))
    return found


dashboard_rule("template-job-rule")(lambda d: _check_template(d, "job"))
dashboard_rule("template-instance-rule")(lambda d: _check_template(d, "instance"))
TEMPLATED_LABEL = re.compile(r"([a-z_]+)\((.+)\)")


def _first_argument(text: str) -> str:
    """The text up to the first comma outside brackets, quotes and braces."""
    depth, quote = 0, ""
    for i, c in enumerate(text):
        if quote:
            quote = "" if c == quote and text[i - 1] != "\\" else quote
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            return text[:i]
    return text


@dashboard_rule("template-label-promql-rule")
def _template_label_promql(d: dict) -> list[tuple[str, str]]:
    if not prometheus(d):
        return []
    found = []
    for t in templates(d):
        if t.get("type") != "query":
            continue
        query = template_query(t)
        tokens = TEMPLATED_LABEL.search(query)
        problem = ""
        if tokens is None:
            problem = f"invalid 'query': {query}"
        elif tokens[1] not in ("label_names", "label_values", "metrics", "query_result"):
            problem = f"invalid 'function': {tokens[1]}"
        else:
            # Prometheus's ParseExpr returns the expression it read before an error (the rule
            # passes when it returns one): label_values(EXPR, label)'s ", label" is that error.
            try:
                parse(_first_argument(tokens[2]), templates(d))
            except ValueError as exc:
                problem = str(exc)
        if problem:
            found.append((ERROR, f"template '{t.get('name')}' invalid templated label '{query}': {problem}"))
    return found


@dashboard_rule("template-on-time-change-reload-rule")
def _template_reload(d: dict) -> list[tuple[str, str]]:
    return [
        (ERROR, f"templated variable '{t.get('name')}' should refresh on time range change (2), is {t.get('refresh')}")
        for t in templates(d)
        if t.get("type") == "query" and t.get("refresh", 0) != 2
    ]


@dashboard_rule("uneditable-dashboard")
def _uneditable(d: dict) -> list[tuple[str, str]]:
    # Go's `Editable bool`: an absent field reads false.
    return [(ERROR, "is editable, it should be set to 'editable: false'")] if d.get("editable", False) else []


@panel_rule("panel-datasource-rule")
def _panel_datasource(d: dict, p: dict) -> list[str]:
    if p.get("type") not in ("singlestat", "graph", "table", "timeseries"):
        return []
    names = [t.get("name") for t in templates(d) if str(t.get("type", "")).lower() == "datasource"]
    uid = datasource_uid(p.get("datasource"))
    return [] if uid in {f"${n}" for n in names} | {f"${{{n}}}" for n in names} else [f"uses datasource '{uid}'"]


@panel_rule("panel-title-description-rule")
def _panel_title_description(d: dict, p: dict) -> list[str]:
    ok = p.get("type") not in SHOWING or (p.get("title") and p.get("description"))
    return [] if ok else [f"has missing title or description: '{p.get('title')}', '{p.get('description')}'"]


# lint/rule_panel_units.go's list (from Grafana's valueFormats/categories.ts).
_UNITS = """
    none string short percent percentunit humidity dB hex0x hex sci locale pixel accMS2 accFS2 accG degree
    radian grad arcmin arcsec areaM2 areaF2 areaMI2 flops mflops gflops tflops pflops eflops zflops yflops ppm
    conppb conngm3 conngNm3 conμgm3 conμgNm3 conmgm3 conmgNm3 congm3 congNm3 conmgdL conmmolL currencyUSD
    currencyGBP currencyEUR currencyJPY currencyRUB currencyUAH currencyBRL currencyDKK currencyISK currencyNOK
    currencySEK currencyCZK currencyCHF currencyPLN currencyBTC currencymBTC currencyμBTC currencyZAR
    currencyINR currencyKRW currencyIDR currencyPHP currencyVND bytes decbytes bits decbits kbytes deckbytes
    mbytes decmbytes gbytes decgbytes tbytes dectbytes pbytes decpbytes pps binBps Bps binbps bps KiBs Kibits
    KBs Kbits MiBs Mibits MBs Mbits GiBs Gibits GBs Gbits TiBs Tibits TBs Tbits PiBs Pibits PBs Pbits
    dateTimeAsIso dateTimeAsIsoNoDateIfToday dateTimeAsUS dateTimeAsUSNoDateIfToday dateTimeAsLocal
    dateTimeAsLocalNoDateIfToday dateTimeAsSystem dateTimeFromNow watt kwatt megwatt gwatt mwatt Wm2 voltamp
    kvoltamp voltampreact kvoltampreact watth watthperkg kwatth kwattm amph kamph mamph joule ev amp kamp mamp
    volt kvolt mvolt dBm ohm kohm Mohm farad µfarad nfarad pfarad ffarad henry mhenry µhenry lumens flowgpm
    flowcms flowcfs flowcfm litreh flowlpm flowmlpm lux forceNm forcekNm forceN forcekN Hs KHs MHs GHs THs PHs
    EHs massmg massg masslb masskg masst lengthmm lengthin lengthft lengthm lengthkm lengthmi pressurembar
    pressurebar pressurekbar pressurepa pressurehpa pressurekpa pressurehg pressurepsi radbq radci radgy radrad
    radsv radmsv radusv radrem radexpckg radr radsvh radmsvh radusvh rotrpm rothz rotrads rotdegs celsius
    fahrenheit kelvin hertz ns µs ms s m h d dtdurationms dtdurations dthms dtdhms timeticks clockms clocks cps
    ops reqps rps wps iops cpm opm rpm wpm mps mpm velocityms velocitykmh velocitymph velocityknot mlitre litre
    m3 Nm3 dm3 gallons bool bool_yes_no bool_on_off
"""
UNITS = frozenset(_UNITS.split())


@panel_rule("panel-units-rule")
def _panel_units(d: dict, p: dict) -> list[str]:
    if p.get("type") not in SHOWING:
        return []
    if p.get("type") == "stat" and ((p.get("options") or {}).get("reduceOptions") or {}).get("fields", ""):
        return []  # a stat of non-numeric fields
    fc = p.get("fieldConfig") or {}
    properties = [x for o in fc.get("overrides") or [] for x in o.get("properties") or []]
    if any(x.get("id") == "mappings" and x.get("value") is not None for x in properties):
        return []
    if (fc.get("defaults") or {}).get("mappings") is not None:
        return []  # value mappings: the rule does not apply
    unit = next((x["value"] for x in reversed(properties) if x.get("id") == "unit"), "")
    unit = unit or (fc.get("defaults") or {}).get("unit", "")
    return [] if unit in UNITS else [f"has no or invalid units defined: '{unit}'"]


@panel_rule("panel-no-targets-rule")
def _panel_no_targets(d: dict, p: dict) -> list[str]:
    return ["has no targets"] if p.get("type") in SHOWING and p.get("targets") is None else []


def _loki(d: dict, t: dict) -> bool:
    first = next((x for x in templates(d) if x.get("type") == "datasource"), None)
    source = t.get("datasource")
    return (first is not None and template_query(first) == "loki") or (
        isinstance(source, dict) and source.get("type") == "loki"
    )


def _logql(d: dict, p: dict, t: dict) -> list[str]:
    if t.get("hide") or not _loki(d, t) or p.get("type") not in QUERY_PANELS:
        return []
    return [f"a LogQL query, not checked here (Loki's parser is AGPL): '{t.get('expr')}'"]


target_rule("target-logql-rule")(_logql)
target_rule("target-logql-auto-rule")(_logql)


@target_rule("target-promql-rule")
def _target_promql(d: dict, p: dict, t: dict) -> list[str]:
    if not prometheus(d) or p.get("type") not in QUERY_PANELS:
        return []
    found = []
    expr = t.get("expr", "")
    if not expr and t.get("panelId", 0) > 0 and not any(x.get("id") == t["panelId"] for x in d.get("panels") or []):
        found.append("Invalid panel reference in target")
    try:
        parse(expr, templates(d))
    except ValueError as exc:
        found.append(f"invalid PromQL query '{expr}': {exc}")
    return found


def _parsed(d: dict, t: dict) -> pp.Expr | None:
    try:
        return parse(t.get("expr", ""), templates(d))
    except ValueError:
        return None  # invalid PromQL is target-promql-rule's


@target_rule("target-rate-interval-rule")
def _target_rate_interval(d: dict, p: dict, t: dict) -> list[str]:
    expr = _parsed(d, t) if prometheus(d) and p.get("type") in QUERY_PANELS else None
    for node, parents in walk(expr) if expr is not None else ():
        if not isinstance(node, pp.MatrixSelector) or node.range == RATE_INTERVAL or not parents:
            continue
        call = parents[-1]
        if not isinstance(call, pp.Call):
            return [f"invalid PromQL query '{t['expr']}': $__rate_interval used in non-rate function"]
        if call.func.name in ("rate", "irate"):
            return [f"invalid PromQL query '{t['expr']}': should use $__rate_interval"]
    return []


def _matcher_rule(label: str) -> Callable[[dict, dict, dict], list[str]]:
    def rule(d: dict, p: dict, t: dict) -> list[str]:
        expr = _parsed(d, t) if prometheus(d) else None
        return [
            f"invalid PromQL query '{t['expr']}': {label} selector not found in {sel.prettify()}"
            for sel in (selectors(expr) if expr is not None else [])
            if (label, str(pp.MatchOp.Re), f"${label}") not in matchers(sel)
        ]

    return rule


target_rule("target-job-rule")(_matcher_rule("job"))
target_rule("target-instance-rule")(_matcher_rule("instance"))


@target_rule("target-counter-agg-rule")
def _target_counter_agg(d: dict, p: dict, t: dict) -> list[str]:
    expr = _parsed(d, t)
    for node, parents in walk(expr) if expr is not None else ():
        # The Go rule tests selector.String() for the suffix: a selector printed with matchers or
        # a modifier ("foo_total{job=~...}") ends in "}" or its modifier, and passes.
        bare = (
            isinstance(node, pp.VectorSelector)
            and not node.matchers.matchers
            and node.offset is None
            and node.at is None
            and (node.name or "").endswith("_total")
        )
        if not bare:
            continue
        ranged = len(parents) >= 2 and isinstance(parents[-1], pp.MatrixSelector)
        call = parents[-2] if ranged else None
        if not (isinstance(call, pp.Call) and call.func.name in ("rate", "irate", "increase")):
            return [f"counter metric '{node.prettify()}' is not aggregated with rate, irate, or increase"]
    return []


RULES = [*DASHBOARD_RULES, *PANEL_RULES, *TARGET_RULES]


def lint(d: dict) -> list[Finding]:
    """Every rule's findings on one dashboard, as lint/rules.go's RuleSet runs them."""
    found = [Finding(rule, sev, msg) for rule, fn in DASHBOARD_RULES.items() for sev, msg in fn(d)]
    for p in all_panels(d):
        title = p.get("title", "")
        found += [Finding(rule, ERROR, msg, title) for rule, fn in PANEL_RULES.items() for msg in fn(d, p)]
        for i, t in enumerate(p.get("targets") or []):
            found += [Finding(rule, ERROR, msg, title, i) for rule, fn in TARGET_RULES.items() for msg in fn(d, p, t)]
    return found


def _matches(entry: dict, title: str, f: Finding) -> bool:
    """ConfigurationEntry.IsMatch: each attribute the entry sets must match, where the finding has it."""
    if entry.get("dashboard") and entry["dashboard"] != title:
        return False
    if entry.get("panel") and f.panel is not None and entry["panel"] != f.panel:
        return False
    idx = str(entry.get("targetIdx", ""))
    return not (f.target is not None and idx.isdigit() and int(idx) != f.target)


def _listed(section: dict, title: str, f: Finding) -> list[dict] | None:
    """The entries of `section` that match `f` ([{}] for a rule listed without entries), or None."""
    if f.rule not in section:
        return None
    entries = (section[f.rule] or {}).get("entries") or []
    return [{}] if not entries else [e for e in entries if _matches(e, title, f)] or None


def configured(d: dict, findings: list[Finding], config: dict) -> tuple[list[Finding], set[tuple[str, str]]]:
    """ConfigurationFile.Apply: (the findings left, excluded ones removed and listed warnings as
    warnings; the (rule, entry) pairs used, to tell an exclusion nothing needs any more)."""
    left, used = [], set()
    for f in findings:
        excluded = _listed(config.get("exclusions") or {}, d.get("title", ""), f)
        if excluded is not None:
            used |= {(f.rule, json.dumps(e, sort_keys=True)) for e in excluded}
            continue
        warned = _listed(config.get("warnings") or {}, d.get("title", ""), f)
        left.append(Finding(f.rule, WARNING, f.message, f.panel, f.target) if warned is not None else f)
    return left, used
