"""The one parameter object of pathprobe's rules AND dashboards (as node-mixin's
config.libsonnet): the selector of the exporters' series, every threshold and window.
Rules (`pathprobe alerts render --params FILE`), dashboards (`dashboards/generate.py
--params FILE`) and the Ansible monitoring play (`monitoring_alert_params`) read the same
YAML, so a threshold changed once changes the alert and the colour that shows it."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator

from .. import yamlfile
from ..config import Strict


class Params(Strict):
    """Every threshold and window of the rules; the defaults suit production meshes."""

    runbook_url_base: str = Field(
        default="alerts/runbook.md",
        description="the runbook each alert links to, at its own section (#alertname in lower case): a path in "
        "this repository by default; set it to the URL of your own copy",
    )
    selector: str = Field(default='job="pathprobe"', description="label matchers of the exporters' series")
    throughput_ratio_warning: float = Field(default=0.8, gt=0, le=1, description="share of expected, warning")
    throughput_ratio_critical: float = Field(default=0.5, gt=0, le=1, description="share of expected, critical")
    throughput_window: str = Field(
        default="2h",
        description="the throughput alerts compare a test's last two results while its last test is this recent "
        "(older results neither fire nor hold them): at least 2 rotations of the schedule, so that one missed test "
        "(a busy peer) does not resolve an alert",
    )
    tgw_utilisation_warning: float = Field(default=0.8, gt=0, le=1, description="share of the TGW attachment limit")
    rtt_baseline_ratio: float = Field(default=1.5, gt=1, description="30-minute RTT p50 against the 7-day p50")
    rtt_baseline_min_increase_seconds: float = Field(default=0.002, ge=0, description="ignore smaller increases")
    rtt_exporter_window: str = Field(
        default="5m",
        description="the exporters' RTT quantile window (probes.rtt.quantile_window_seconds): names the recording "
        "rules that read it (path:pathprobe_rtt_seconds:p50_5m)",
    )
    rtt_recent_window: str = Field(default="30m", description="the 'now' of the RTT baseline comparison")
    rtt_baseline_window: str = Field(default="7d", description="the baseline of the RTT comparison")
    rtt_baseline_step: str = Field(default="30m", description="the baseline's sampling step (well below its window)")
    rtt_for: str = Field(default="15m")
    loss_ratio_warning: float = Field(default=0.01, gt=0, lt=1)
    loss_ratio_critical: float = Field(default=0.05, gt=0, lt=1)
    loss_window: str = Field(default="10m")
    loss_min_lost_packets: int = Field(
        default=3,
        ge=1,
        description="fewer idle packets lost in loss_window are noise, whatever their share (a window of 100 "
        "packets makes one lost 1%)",
    )
    loss_for: str = Field(default="10m")
    partial_failure_for: str = Field(default="5m", description="some flows of a path fail, others not")
    mtu_memory: str = Field(default="1d", description="a size carried within this window and now not: black hole")
    mtu_for: str = Field(default="5m")
    unreachable_window: str = Field(default="5m")
    unreachable_for: str = Field(default="5m")
    stale_rotations: float = Field(default=3, gt=1, description="no successful test (or turn) in this many rotations")
    turn_errors_window: str = Field(default="1h", description="throughput turns that failed on an unexpected error")
    exporter_down_for: str = Field(default="5m")
    budget_for: str = Field(default="15m")
    budget_state_unusable_for: str = Field(default="5m", description="the state file held today as spent at start")
    budget_save_failures_window: str = Field(
        default="1h", description="failed writes of the budget state file (above the time between a host's tests)"
    )
    refused_window: str = Field(default="15m")
    out_of_turn_window: str = Field(
        default="1h", description="a host's tests that its peers cut as out of turn, twice or more in this window"
    )
    clock_offset_max_seconds: float = Field(
        default=0.5, gt=0, description="a host's clock against every peer's (half the throughput turns' 1 s of grace)"
    )
    clock_offset_for: str = Field(default="5m")
    schedule_mismatch_for: str = Field(default="30m")
    snapshot_stale_seconds: float = Field(
        default=30, gt=0, description="/metrics snapshot older than this (a few refresh intervals)"
    )
    snapshot_stale_for: str = Field(default="5m")
    culprit_bad_share: float = Field(
        default=0.75,
        gt=0.5,
        le=1,
        description="share of the paths through a host, zone, region pair or Transit Gateway attachment that "
        "must be bad to name it (above half: a host's egress fault leaves its ingress and its peers' other "
        "paths good)",
    )
    culprit_min_bad_paths: int = Field(default=2, ge=2, description="fewer bad paths are one path's fault")
    culprit_for: str = Field(
        default="3m", description="shorter than the per-path alerts' own, so that the culprit's page comes first"
    )
    culprit_keep_firing_for: str = Field(
        default="1h",
        description="a culprit's alerts keep firing (and holding back its paths' alerts) this long after it is no "
        "longer named, so that those alerts resolve first: at least one rotation of the schedule (a path's "
        "throughput alert resolves at its next test)",
    )
    evaluation_interval: str = Field(default="1m", description="of the rule groups but the baseline's")
    baseline_evaluation_interval: str = Field(
        default="5m", description="of the RTT baseline (a median over days changes slowly; its query is the largest)"
    )

    @field_validator("rtt_recent_window", "rtt_baseline_window")
    @classmethod
    def _names_its_own_recording(cls, window: str, info: ValidationInfo) -> str:
        """Each RTT window names a recording rule (path:pathprobe_rtt_seconds:p50_<window>): two equal
        windows would write one series from two rules, and Prometheus keeps only one of them."""
        earlier = {f: info.data.get(f) for f in ("rtt_exporter_window", "rtt_recent_window") if f != info.field_name}
        for field, other in earlier.items():
            if window == other:
                raise ValueError(f"equal to {field} ({other}): the two would name the same recording rule")
        return window


def load_params(path: str | Path | None) -> Params:
    return Params() if path is None else yamlfile.load_model(path, Params)
