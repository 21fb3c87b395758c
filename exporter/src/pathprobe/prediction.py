"""Capacity before the hosts exist: limits.py's model applied to two instance types, a
path class, an RTT and the buffers, per stream count (`pathprobe capacity --predict`).

No second model: every figure comes from `limits.expected` and the instance-type table;
this module only chooses the inputs and words the plan. The floor is what to plan a
long transfer on (instance baselines, documented caps); the peak is the most a test may
reach (instance peaks, without the limits paths were measured above: limits.FLOOR_ONLY).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import ends, instance_types
from .capacity import format_duration, wording
from .config import Limits, PathClass, Peer
from .limits import Expected, expected, receiver_cpu_bound
from .units import format_bits

# Linux's tcp_rmem / tcp_wmem max on a host with enough memory (Amazon Linux 2023 shows
# these: docs/SOURCES.md); a plan names its own with --rmem-max / --wmem-max.
DEFAULT_RMEM_MAX = 6291456
DEFAULT_WMEM_MAX = 4194304
# The iperf3 a plan assumes: Ubuntu 24.04's, the first with a thread per stream (Debian 13 has
# 3.18; Debian 12 3.12 and Ubuntu 22.04 3.9 run every stream of a process on one thread).
DEFAULT_IPERF3_VERSION = "3.16"


@dataclass(frozen=True)
class Inputs:
    from_type: str
    to_type: str
    path_class: PathClass
    rtt_seconds: float
    rmem_max: int
    wmem_max: int
    window_share: float
    send_share: float
    # --limit NAME=RATE, as a peer's `limits:` (e.g. no EC2 per-flow limit off EC2)
    overrides: Limits = field(default_factory=Limits)
    # The receiver's iperf3 and the processes a test is split over: the threads its CPU runs.
    iperf3_version: str = DEFAULT_IPERF3_VERSION
    processes: int = 1

    def stream_threads(self, streams: int) -> int:
        return streams if ends.threads_per_stream(self.iperf3_version) else min(streams, self.processes)


@dataclass(frozen=True)
class PredictedRow:
    streams: int
    expected: Expected

    @property
    def floor(self) -> float:
        return self.expected.floor_bits_per_second

    @property
    def peak(self) -> float:
        return self.expected.ceiling_bits_per_second


def unknown_types(inputs: Inputs, types: instance_types.Table | None = None) -> list[str]:
    """The options naming a type the table does not know: a plan never guesses bandwidth."""
    types = types or instance_types.load()
    return [
        f"{opt} {name!r}"
        for opt, name in (("--from", inputs.from_type), ("--to", inputs.to_type))
        if types.get(name) is None
    ]


def predict(inputs: Inputs, streams: list[int], types: instance_types.Table | None = None) -> list[PredictedRow]:
    # The model reads the peer's class and type; "this host" is the sender (--from).
    peer = Peer(
        name="to",
        address="0.0.0.0",
        region="-",
        path_class=inputs.path_class,
        instance_type=inputs.to_type,
        limits=inputs.overrides,
    )
    receiver = (types or instance_types.load()).get(inputs.to_type)
    rows = []
    for n in streams:
        e = expected(
            peer,
            inputs.from_type,
            "tcp",
            n,
            inputs.rmem_max,
            inputs.rtt_seconds,
            sender_wmem_max=inputs.wmem_max,
            share=inputs.window_share,
            types=types,
            send_share=inputs.send_share,
            receiver_cpu=receiver_cpu_bound(receiver, inputs.stream_threads(n)),
        )
        rows.append(PredictedRow(n, e))
    return rows


def transfer(row: PredictedRow, volume_bytes: float | None, price_per_gb: float | None) -> dict[str, float] | None:
    """As the measured review plans: at the peak while burst credits last, the floor after.
    AWS does not publish how long credits last, so `seconds` is at the floor and
    `peak_seconds` the best case."""
    if not volume_bytes:
        return None
    out = {"seconds": volume_bytes * 8 / row.floor, "peak_seconds": volume_bytes * 8 / row.peak}
    if price_per_gb is not None:
        out["cost"] = volume_bytes / 1e9 * price_per_gb
    return out


def to_json(inputs: Inputs, rows: list[PredictedRow], volume: float | None, price: float | None) -> dict[str, Any]:
    return {
        "from_instance_type": inputs.from_type,
        "to_instance_type": inputs.to_type,
        "path_class": inputs.path_class.value,
        "rtt_seconds": inputs.rtt_seconds,
        "receiver_tcp_rmem_max_bytes": inputs.rmem_max,
        "sender_tcp_wmem_max_bytes": inputs.wmem_max,
        "window_share": inputs.window_share,
        "send_share": inputs.send_share,
        "iperf3_version": inputs.iperf3_version,
        "processes": inputs.processes,
        "volume_bytes": volume,
        "price_per_gb": price,
        "rows": [
            {
                "streams": r.streams,
                "floor_bits_per_second": r.floor,
                "peak_bits_per_second": r.peak,
                "binding_limit": r.expected.limit,
                "peak_binding_limit": r.expected.ceiling_limit,
                "floor_candidates": dict(r.expected.candidates),
                "transfer": transfer(r, volume, price),
            }
            for r in rows
        ],
    }


def text_report(inputs: Inputs, rows: list[PredictedRow], volume: float | None, price: float | None) -> str:
    lines = [
        f"capacity prediction: {inputs.from_type} -> {inputs.to_type}, {inputs.path_class.value}, "
        f"RTT {inputs.rtt_seconds * 1e3:.3g} ms",
        f"receiver tcp_rmem max {inputs.rmem_max} B ({inputs.window_share:.2g} advertised), sender tcp_wmem max "
        f"{inputs.wmem_max} B ({inputs.send_share:.2g} in flight); iperf3 {inputs.iperf3_version}"
        + (f" x{inputs.processes} processes" if inputs.processes > 1 else ""),
        "",
        f"{'streams':>7} {'floor':>12} {'bound by':<22} {'peak':>12} {'bound by':<22}"
        + (f" {'time at floor':>13} {'at peak':>9}" if volume else ""),
    ]
    for r in rows:
        line = (
            f"{r.streams:>7} {format_bits(r.floor):>12} {r.expected.limit:<22} {format_bits(r.peak):>12} "
            f"{r.expected.ceiling_limit:<22}"
        )
        t = transfer(r, volume, price)
        if t:
            line += f" {format_duration(t['seconds']):>13} {format_duration(t['peak_seconds']):>9}"
        lines.append(line)
    if volume:
        cost = f", transfer cost ${volume / 1e9 * price:,.0f}" if price is not None else ""
        lines += [
            "",
            f"moving {volume / 1e12:g} TB: plan on the floor (a burst instance falls to its baseline once "
            f"credits are spent; AWS does not publish when); the peak is the best case{cost}",
        ]
    bound = {r.expected.limit for r in rows} | {r.expected.ceiling_limit for r in rows}
    lines += [f"{k}: {wording(k)}" for k in sorted(bound)]
    return "\n".join(lines)


# --- the plan beside the measurement (`pathprobe capacity HOST --plan plan.json`) -----


def read_plan(path: Path) -> dict[int, dict[str, Any]]:
    """The rows of a saved `--predict --json`, by stream count. Raises ValueError naming --plan."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        rows = {
            int(r["streams"]): {
                **r,
                "floor_bits_per_second": float(r["floor_bits_per_second"]),
                "peak_bits_per_second": float(r["peak_bits_per_second"]),
            }
            for r in doc["rows"]
        }
        if any(min(r["floor_bits_per_second"], r["peak_bits_per_second"]) <= 0 for r in rows.values()):
            raise ValueError("a rate is not positive")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"--plan: {path} is not the output of `pathprobe capacity --predict --json` ({exc})") from exc
    return rows


def against_plan(measured: dict[int, float | None], plan: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measured stream count beside its planned floor and peak: how far reality was from the plan."""
    out = []
    for n, rate in sorted(measured.items()):
        p = plan.get(n)
        if p is None:
            continue
        floor, peak = float(p["floor_bits_per_second"]), float(p["peak_bits_per_second"])
        out.append(
            {
                "streams": n,
                "measured_bits_per_second": rate,
                "planned_floor_bits_per_second": floor,
                "planned_peak_bits_per_second": peak,
                "planned_binding_limit": p.get("binding_limit"),
                "measured_over_planned_floor": rate / floor if rate else None,
                "measured_over_planned_peak": rate / peak if rate else None,
            }
        )
    return out


def against_plan_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "against the plan: no stream count in both"
    lines = ["against the plan:", f"{'streams':>7} {'measured':>12} {'planned floor':>13} {'peak':>12}  measured/peak"]
    for r in rows:
        rate = r["measured_bits_per_second"]
        lines.append(
            f"{r['streams']:>7} {format_bits(rate) if rate else 'failed':>12} "
            f"{format_bits(r['planned_floor_bits_per_second']):>13} "
            f"{format_bits(r['planned_peak_bits_per_second']):>12}  "
            f"{'' if not rate else format(r['measured_over_planned_peak'], '.0%')}"
        )
    return "\n".join(lines)
