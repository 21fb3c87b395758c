"""Configuration files derived from a lab topology: one exporter config per host,
and the Prometheus scrape config with region/zone/host as target labels."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pathprobe.config import PathClass, Peer
from pathprobe.limits import expected
from pathprobe.monitoring.params import Params

from . import cpu
from .topology import LabHost, Topology, address, resolve

METRICS_PORT = 9469


LAB_CLOCK_ERROR_BOUND = 1e-6


def exporter_config(
    topo: Topology, host_name: str, state_dir: Path, slot_seconds: float, probe_overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    paths = resolve(topo)
    index = {h.name: i for i, h in enumerate(topo.hosts, start=1)}
    me = next(h for h in topo.hosts if h.name == host_name)
    peers = []
    for other in topo.hosts:
        if other.name == host_name:
            continue
        peers.append(
            {
                "name": other.name,
                "address": address(index[other.name]),
                "region": other.region,
                "zone": other.zone,
                "instance_type": other.instance_type,
                "path_class": paths[(host_name, other.name)].path_class.value,
                "transit_gateway_attachment": attachment(other),
                **({"tcp_rmem_max_bytes": other.tcp_rmem_max} if other.tcp_rmem_max else {}),
                **({"tcp_wmem_max_bytes": other.tcp_wmem_max} if other.tcp_wmem_max else {}),
                "limits": scaled_limits(topo, me, other, paths[(host_name, other.name)].path_class),
            }
        )
    probes: dict[str, Any] = {
        "throughput": {"protocols": ["tcp"], "streams": [1, 4], "duration_seconds": 3, "omit_seconds": 1},
        # Above the defaults: the lab's alert windows are a minute, not ten (lab_alert_params), and its
        # drills and quiet demo were measured at these rates.
        "rtt": {"interval_seconds": 0.1},
        "loss": {"rate_pps": 20},
    }
    for key, value in (probe_overrides or {}).items():
        probes[key] = {**probes.get(key, {}), **value}
    cfg: dict[str, Any] = {
        "host": {
            "name": me.name,
            "address": address(index[me.name]),
            "region": me.region,
            "zone": me.zone,
            "instance_type": me.instance_type,
            "transit_gateway_attachment": attachment(me),
        },
        "peers": peers,
        "probes": probes,
        "schedule": {"slot_seconds": slot_seconds, "jitter_seconds": 1, "timeout_margin_seconds": 3},
        "web": {"listen": f"{address(index[me.name])}:{METRICS_PORT}"},
        # A host whose iperf3 is held to a CPU quota runs it through the lab's wrapper (cpu.py).
        **({"iperf3": {"binary": str(cpu.wrapper(me.name))}} if me.iperf3_cpu is not None else {}),
        # The lab's hosts share one kernel clock: their offset is zero, and a microsecond covers
        # the stamps' own error, so one-way delays are exact here (clock.py).
        "clock": {"source": "stated", "error_bound_seconds": LAB_CLOCK_ERROR_BOUND},
        "budget": {
            "daily_bytes": "200GB",
            "state_file": str(state_dir / f"{me.name}-budget.json"),
            # Example prices for the cost panels (set the regions' own: they differ by region).
            "price_per_gb": {"inter_region": 0.02, "intra_region": 0.01},
        },
    }
    return cfg  # the host's own buffers: the exporter reads them in its namespace


def attachment(host: LabHost) -> str:
    """A lab host is a VPC of its own: its Transit Gateway attachment is named after it."""
    return f"tgw-attach-{host.name}"


# The expected-limit candidates the lab scales, by the per-peer override that carries each.
OVERRIDES = {
    "per_flow": "per_flow_bits_per_second",
    "instance": "instance_bits_per_second",
    "region_cap": "region_cap_bits_per_second",
    "transit_gateway": "transit_gateway_bits_per_second",
}


def scaled_limits(topo: Topology, me: LabHost, other: LabHost, path_class: PathClass) -> dict[str, float]:
    """The limits table's figures for this path divided by the topology's scale (the lab runs
    AWS Gbps as Gbit/s / 10), written as the per-peer overrides every exporter takes: the
    production config has no scale. A lab host's own Transit Gateway cap (topology) is its
    attachment's figure, as the lab shapes it."""
    peer = Peer(
        name=other.name,
        address="198.18.0.1",
        region=other.region,
        path_class=path_class,
        instance_type=other.instance_type,
    )
    bounds = expected(peer, me.instance_type, "tcp", 1, None, None)
    scaled = {OVERRIDES[k]: v / topo.scale for k, v in bounds.candidates.items() if k in OVERRIDES}
    if me.transit_gateway_cap and "transit_gateway" in bounds.candidates:
        scaled[OVERRIDES["transit_gateway"]] = me.transit_gateway_cap
    if bounds.peak_candidates.get("instance", 0) > bounds.candidates.get("instance", 0):
        scaled["instance_peak_bits_per_second"] = bounds.peak_candidates["instance"] / topo.scale
    return scaled


def scrape_targets(topo: Topology, meshes: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Prometheus static/file_sd targets: the source host's region and zone are target labels, and
    its mesh where `meshes` names one (host -> mesh: a lab of several meshes, each its own schedule)."""
    return [
        {
            "targets": [f"{address(i)}:{METRICS_PORT}"],
            "labels": {
                "host": h.name,
                "region": h.region,
                "zone": h.zone,
                **({"mesh": meshes[h.name]} if meshes and h.name in meshes else {}),
            },
        }
        for i, h in enumerate(topo.hosts, start=1)
    ]


# The lab's rule evaluation interval (production: Params().evaluation_interval, 1m).
LAB_EVALUATION_INTERVAL = "5s"


def lab_alert_params(rotation_seconds: float, rtt_window_seconds: int = 300) -> Params:
    """The production rules with windows short enough for a lab fire drill (minutes);
    `rtt_window_seconds`: the exporters' probes.rtt.quantile_window_seconds."""
    # Two rotations and a margin (Params.throughput_window): one missed test does not resolve an alert.
    window = f"{int(2 * rotation_seconds + 30)}s"
    rtt_window = f"{rtt_window_seconds // 60}m" if rtt_window_seconds % 60 == 0 else f"{rtt_window_seconds}s"
    half_minute = (
        "rtt_for",
        "mtu_for",
        "unreachable_window",
        "unreachable_for",
        "exporter_down_for",
        "budget_for",
        "budget_state_unusable_for",
    )
    # loss_for 4 times culprit_for (production: 10m and 3m). A lossy zone's paths cross the critical loss
    # ratio one by one, seconds apart, around the time their sum does; at 30 s against 15 s, one noisy
    # path's critical alert fired before the zone's did and paged too (bench/culprit_drill.py, fault d).
    minute = ("loss_window", "loss_for", "refused_window", "schedule_mismatch_for", "budget_save_failures_window")
    return Params.model_validate(
        {
            **dict.fromkeys(half_minute, "30s"),
            **dict.fromkeys(minute, "1m"),
            "throughput_window": window,
            "rtt_baseline_window": "15m",
            "rtt_baseline_step": "30s",
            "rtt_exporter_window": rtt_window,
            # Not the exporters' window: each names its own recording rule (Params refuses equal ones).
            "rtt_recent_window": "90s" if rtt_window == "1m" else "1m",
            "baseline_evaluation_interval": "30s",
            "partial_failure_for": "60s",  # longer than any self-inflicted loss of a test (a flow counts 32 packets)
            "culprit_for": "15s",  # below the per-path alerts' 30 s and 1 m, as in production
            # A rotation: each path's throughput alert resolves at its next test, before the culprit's.
            "culprit_keep_firing_for": f"{int(rotation_seconds + 30)}s",
            "mtu_memory": "15m",
            "evaluation_interval": LAB_EVALUATION_INTERVAL,
        }
    )


def rotation_seconds(topo: Topology, slot_seconds: float) -> float:
    n = len(topo.hosts)
    return (n - 1 if n % 2 == 0 else n) * slot_seconds
