"""Prometheus configurations of the three layouts (docs/fleet.md):

- `single`: one Prometheus scrapes every exporter and evaluates every rule (small fleets, the demo);
- `regional`: one per region scrapes that region's exporters, evaluates the per-path rules and
  alerts, and remote-writes the region-pair aggregates (`region_pair:*`) to the global one;
- `global`: receives them (`--web.enable-remote-write-receiver`) and scrapes nothing: the
  overview reads it, and it holds nothing per host.

Thanos or Mimir take the global role for bigger fleets: point `remote_write_url` at their
receive endpoint instead.
"""

from __future__ import annotations

from typing import Any, Literal

from .common import REGION_PAIR_SERIES

Layout = Literal["single", "regional", "global"]


def render(  # noqa: PLR0913 - keyword-only, each an optional section of prometheus.yml
    layout: Layout,
    *,
    file_sd: str | None = None,
    rule_files: list[str] | None = None,
    alertmanagers: list[str] | None = None,
    remote_write_url: str | None = None,
    external_labels: dict[str, str] | None = None,
    interval: str = "1m",
    scrape: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The prometheus.yml of one server of `layout`. `scrape`: what the pathprobe job adds to its
    scrape config (scheme, tls_config, basic_auth)."""
    if layout != "global" and not file_sd:
        raise ValueError(f"a {layout} Prometheus scrapes exporters: give the file_sd file of its targets")
    if layout == "regional" and not remote_write_url:
        raise ValueError("a regional Prometheus sends its region pairs on: give the global one's remote_write_url")
    out: dict[str, Any] = {"global": {"scrape_interval": interval, "evaluation_interval": interval}}
    if external_labels:
        out["global"]["external_labels"] = external_labels
    if rule_files:
        out["rule_files"] = rule_files
    if alertmanagers:
        out["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": alertmanagers}]}]}
    if layout != "global":
        job = {"job_name": "pathprobe", **(scrape or {}), "file_sd_configs": [{"files": [file_sd]}]}
        out["scrape_configs"] = [job]
    if layout == "regional":
        out["remote_write"] = [
            {
                "url": remote_write_url,
                "write_relabel_configs": [
                    {"source_labels": ["__name__"], "regex": REGION_PAIR_SERIES, "action": "keep"}
                ],
            }
        ]
    return out
