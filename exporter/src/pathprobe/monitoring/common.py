"""What the rule modules share: the `Alert` they are built of, the label sets and series they
name, the template fragments of their descriptions and the small PromQL builders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .params import Params, duration_seconds

__all__ = ["duration_seconds"]  # re-exported: the lab and the tests read durations through here

# One exporter: its target labels.
HOST = "job, instance, host, region"
# Labels that identify one measured path on one exporter (target labels + peer side).
PATH = "instance, peer"
TEST = "instance, peer, protocol, streams, direction"
# One ordered pair of regions (the source's target label, the peer's): what the global view keeps.
REGION_PAIR = "region, peer_region"
# The series a regional Prometheus sends to the global one (remote write), and nothing per host.
REGION_PAIR_SERIES = "region_pair:.+"


# The labels of a path that its source's target labels do not carry, from pathprobe_peer_info:
# the peer's region and zone, the path's class and the Transit Gateway attachments it crosses.
PATH_SIDES = "peer_region, peer_zone, path_class, attachment, peer_attachment"
# The scopes of the alerts (the `scope` label): what one alert is about, and so which per-path
# alerts a culprit explains (alertmanager.yml inhibits those).
SCOPES = ("path", "host", "zone", "region_pair", "transit_gateway", "mesh")


@dataclass(frozen=True)
class Alert:
    """One alerting rule, mixin style: CamelCase name, severity, summary, description, runbook link;
    `scope` says what it is about. A per-path alert carries every label of its path (PATH_SIDES), so
    that Alertmanager can match it with the culprit that explains it."""

    name: str
    expr: str
    severity: str
    summary: str
    description: str
    for_: str | None = None
    scope: str = "path"
    keep_firing_for: str | None = None

    def rule(self, p: Params) -> dict[str, Any]:
        expr = self.expr.strip()
        if self.scope == "path":
            expr = with_path_sides(p, f"({expr})")
        rule: dict[str, Any] = {"alert": self.name, "expr": expr}
        if self.for_:
            rule["for"] = self.for_
        if self.keep_firing_for:
            rule["keep_firing_for"] = self.keep_firing_for
        rule["labels"] = {"severity": self.severity, "scope": self.scope}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{p.runbook_url_base}#{self.name.lower()}",
        }
        return rule


# Alert template fragments as plain strings: the f-strings that put them in a description need
# no escaped braces.
VALUE = "{{ $value }}"
PERCENT = "{{ $value | humanizePercentage }}"
DURATION = "{{ $value | humanizeDuration }}"


def label(name: str) -> str:
    """An alert's label `name`, as its template reads it."""
    return "{{ $labels." + name + " }}"


PATH_TEXT = "{{ $labels.host }} ({{ $labels.region }}) -> {{ $labels.peer }} ({{ $labels.peer_region }})"
TEST_TEXT = PATH_TEXT + " {{ $labels.protocol }} x{{ $labels.streams }} {{ $labels.direction }}"
# RTT probe runs of each path in the unreachable window, by result: read twice by the reachability
# signal (no answer, and failed probes) and by PathprobePeerUnreachable, computed once.
RTT_RUNS = "path:pathprobe_rtt_probe_runs:increase"
# The source's labels that identify a path (the target labels and the peer).
SOURCE = "job, instance, host, region, zone, peer"
# Recorded series that several rules read, named once.
EXPECTED_RATIO = "path:pathprobe_throughput_expected_ratio:last"
PREVIOUS_RATIO = "path:pathprobe_throughput_previous_expected_ratio:last"  # the test before the last, to expected
SENT_RATIO = EXPECTED_RATIO + '{direction="send"}'  # the tests a host sent: its egress
# Tests whose last result measured one of their own ends (a CPU, a receive buffer), not the path:
# the path's throughput alerts and the culprits' throughput signal leave them out.
HOST_BOUND = "path:pathprobe_throughput_host_bound:last"
RTT_OK = f'{RTT_RUNS}{{result="ok"}}'


def rtt_p50(window: str) -> str:
    """The recorded idle RTT median over `window` (the exporter's own window, or a median of it)."""
    return f"path:pathprobe_rtt_seconds:p50_{window}"


def with_labels(expr: str, **labels: str) -> str:
    """expr with constant labels added."""
    for name, value in labels.items():
        expr = f'label_replace({expr}, "{name}", "{value}", "", "")'
    return expr


def copy_labels(expr: str, **renames: str) -> str:
    """expr with each label (key) set from another (value)."""
    for dst, src in renames.items():
        expr = f'label_replace({expr}, "{dst}", "$1", "{src}", "(.*)")'
    return expr


def with_path_sides(p: Params, expr: str) -> str:
    """A per-path expr with the labels of its path that its source's do not carry (PATH_SIDES)."""
    return f"{expr}\n* on ({PATH}) group_left ({PATH_SIDES}) pathprobe_peer_info{{{p.selector}}}"
