// pathprobe's Prometheus rules and Grafana dashboards as a monitoring mixin
// (github.com/monitoring-mixins/docs): prometheusRules (the recording groups),
// prometheusAlerts (the alerting group) and grafanaDashboards (by file name).
//
// They are the committed files themselves, imported: alerts/pathprobe.rules.yml and
// dashboards/json/*.json, rendered from the default parameters of
// exporter/src/pathprobe/monitoring/params.py. For other thresholds, windows, selector or
// runbook_url_base, render both with your parameters (alerts/README.md) instead.
local rules = std.parseYaml(importstr '../alerts/pathprobe.rules.yml');
local recording(group) = std.all([std.objectHas(rule, 'record') for rule in group.rules]);

{
  prometheusRules+:: {
    groups+: [group for group in rules.groups if recording(group)],
  },
  prometheusAlerts+:: {
    groups+: [group for group in rules.groups if !recording(group)],
  },
  grafanaDashboards+:: {
    'pathprobe-overview.json': import '../dashboards/json/overview.json',
    'pathprobe-path-detail.json': import '../dashboards/json/path-detail.json',
    'pathprobe-capacity.json': import '../dashboards/json/capacity.json',
    'pathprobe-exporter-health.json': import '../dashboards/json/exporter-health.json',
  },
}
