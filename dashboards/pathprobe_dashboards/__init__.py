"""pathprobe's Grafana dashboards as code: common.py holds what they share, one module
per dashboard builds it from the monitoring parameters (pathprobe.monitoring.params),
the same object the alerting rules are rendered from."""
