"""The one parameter object of pathprobe's rules AND dashboards (as node-mixin's
config.libsonnet): the selector of the exporters' series, every threshold and window.
Rules (`pathprobe alerts render --params FILE`), dashboards (`dashboards/generate.py
--params FILE`) and the Ansible monitoring play (`monitoring_alert_params`) read the same
YAML, so a threshold changed once changes the alert and the colour that shows it."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator

from .. import yamlfile
from ..strict import Strict

# The runbook at this repository's address as its own metadata states it (the Ansible collection's
# galaxy.yml `repository`): a fleet that keeps its own copy, or whose readers cannot reach that
# address, sets runbook_url_base to it. Absolute, because a notification is read outside the
# repository: a relative link in a Slack or PagerDuty message leads nowhere.
REPOSITORY_RUNBOOK = "https://github.com/pathprobe/pathprobe/blob/main/alerts/runbook.md"
# A Prometheus duration of one unit (5m, 2h, 7d): the rules name windows in recording rules and
# compare some with time(), which needs their seconds.
DURATION = re.compile(r"^([0-9]+)(ms|s|m|h|d|w|y)$")
DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_seconds(duration: str) -> float:
    """A duration of DURATION's form in seconds."""
    m = DURATION.match(duration)
    if m is None:
        raise ValueError(f"{duration!r} is not a Prometheus duration of one unit (e.g. 30s, 5m, 2h, 7d)")
    return int(m.group(1)) * DURATION_UNITS[m.group(2)]


class Params(Strict):
    """Every threshold and window of the rules; the defaults suit production meshes."""

    runbook_url_base: str = Field(
        default=REPOSITORY_RUNBOOK,
        description="the runbook each alert links to, at its own section (#alertname in lower case): an absolute "
        "http(s) URL; this repository's by default, set it to the URL of your own copy",
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
    exporter_down_for: str = Field(default="5m", description="one exporter not scraped (a warning)")
    exporters_down_share: float = Field(
        default=0.1,
        gt=0,
        lt=1,
        description="more than this share of a job's exporters not scraped pages (critical), as kube-prometheus's "
        "TargetDown",
    )
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
    app_window: str = Field(default="15m", description="the window of the applications' flows' alerts")
    app_retransmit_ratio: float = Field(
        default=0.005,
        gt=0,
        lt=1,
        description="applications' retransmitted segments per segment acknowledged (segments of "
        "app_segment_bytes) on a path whose probes lose below loss_ratio_warning",
    )
    app_segment_bytes: int = Field(
        default=1448,
        ge=536,
        description="bytes per segment for that ratio: a 1500-byte MTU's MSS (more at 9001: "
        "the ratio is then underestimated, the alert errs toward silence)",
    )
    app_min_bytes: float = Field(
        default=100e6, ge=0, description="fewer bytes acked to a peer in app_window are too few to judge"
    )
    app_window_limited_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="share of the flows' sending time the receive window or send buffer was full",
    )
    app_long_path_seconds: float = Field(
        default=0.03, gt=0, description="a path with an RTT p50 from this on is long: its BDP outgrows default buffers"
    )
    app_target_bits_per_second: float = Field(
        default=5e9,
        gt=0,
        description="the per-flow rate the figure to set is for (EC2's per-flow limit outside "
        "a cluster placement group)",
    )
    app_window_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="the share of a buffer TCP keeps in flight, for the figure (Linux "
        "before 6.6 at tcp_adv_win_scale 1)",
    )
    app_for: str = Field(default="15m")
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

    @field_validator("runbook_url_base")
    @classmethod
    def _absolute(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise ValueError(
                f"{url!r} is not an absolute http(s) URL: notifications carry it outside the repository "
                f"(e.g. {REPOSITORY_RUNBOOK})"
            )
        return url

    @field_validator("*")
    @classmethod
    def _durations(cls, value: object, info: ValidationInfo) -> object:
        """Every window, step and interval a positive duration; a `for` may be 0s (fire at once)."""
        name = info.field_name or ""
        if not isinstance(value, str) or name in {"runbook_url_base", "selector"}:
            return value
        seconds = duration_seconds(value)
        if seconds <= 0 and not name.endswith("_for"):
            raise ValueError(f"{value!r}: a window or interval must be longer than 0")
        return value

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


# Thresholds that must come in order: (the lower, the higher, why).
ORDERED = (
    ("throughput_ratio_critical", "throughput_ratio_warning", "a critical throughput is a lower share of expected"),
    ("loss_ratio_warning", "loss_ratio_critical", "a critical loss is a higher share"),
    ("rtt_baseline_step", "rtt_baseline_window", "the baseline samples its window in steps"),
    ("rtt_recent_window", "rtt_baseline_window", "the recent RTT is compared with a longer baseline"),
)


def problems(p: Params) -> list[tuple[tuple[str | int, ...], str]]:
    """Thresholds and windows out of order, each named by the field the file set (both if both)."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    for low, high, why in ORDERED:
        a, b = getattr(p, low), getattr(p, high)
        if isinstance(a, str):
            a, b = duration_seconds(a), duration_seconds(b)
        if a >= b:
            named = [f for f in (low, high) if f in p.model_fields_set] or [low]
            for field in named:
                found.append(
                    (
                        (field,),
                        f"{low} ({getattr(p, low)}) must be below {high} ({getattr(p, high)}): {why}",
                    )
                )
    return found


def load_params(path: str | Path | None) -> Params:
    """The parameters of a YAML file (the defaults if none), refused with file:line when a value or
    the order of two is wrong."""
    if path is None:
        return Params()
    return yamlfile.load_model(path, Params, check=problems)
