"""Lab topologies: hosts in regions and the paths between them.

Validated like the exporter config (file:line and field path on error).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator

from pathprobe import yamlfile
from pathprobe.config import PathClass
from pathprobe.strict import Congestion, Strict
from pathprobe.units import parse_duration, parse_quantity, parse_ratio

Rate = Annotated[float, BeforeValidator(lambda v: parse_quantity(v, "rate")), Field(gt=0)]
Delay = Annotated[float, BeforeValidator(lambda v: parse_duration(v, "one_way_delay")), Field(ge=0, le=2)]
Loss = Annotated[float, BeforeValidator(lambda v: parse_ratio(v, "loss"))]
Size = Annotated[int, BeforeValidator(lambda v: int(parse_quantity(v, "size"))), Field(gt=0)]


class LabHost(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,20}$")
    region: str
    zone: str = ""
    instance_type: str = ""
    # Per-namespace TCP settings, so that the receive-window bound can be reproduced.
    tcp_rmem_max: Size | None = None
    tcp_wmem_max: Size | None = None
    congestion: Congestion | None = None
    # With an instance type: the network I/O credits the host bursts on (lab bytes above the
    # baseline), refilled at the baseline whenever the host sends less (caps.py).
    burst_bytes: Size = 64 * 2**20
    # With an instance type: the per-flow cap in lab bits/s (default: limits.yaml's per-flow
    # limit at the lab's scale); `lab impair-host` lowers it to break that limit alone.
    per_flow_cap: Rate | None = None
    # With an instance type and a transit_gateway path: its VPC attachment's bandwidth in lab
    # bits/s (default: limits.yaml's per-attachment figure at the lab's scale).
    transit_gateway_cap: Rate | None = None
    # A CPU quota for this host's iperf3 processes alone, in CPUs (cpu.py): a host too small for its
    # tests, whose results must name its CPU.
    iperf3_cpu: float | None = Field(default=None, gt=0, le=64)


class LabPath(Strict):
    """Shaping of every directed path between two ends; an end is a host or a region name.

    Later entries override earlier ones for the host pairs they match.
    """

    between: tuple[str, str]
    rate: Rate | None = None  # lab bits/s; None: unshaped
    one_way_delay: Delay = 0.0
    loss: Loss = 0.0
    path_class: PathClass | None = None  # default: intra_region in one region, else inter_region


class Topology(Strict):
    # AWS Gbps are shown as lab Gbit/s divided by this; expected limits are scaled the same way.
    scale: float = Field(default=10, gt=0)
    hosts: list[LabHost] = Field(min_length=2, max_length=200)
    paths: list[LabPath] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Topology:
        names = [h.name for h in self.hosts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"host names must be unique; repeated: {', '.join(dupes)}")
        known = set(names) | {h.region for h in self.hosts}
        for i, p in enumerate(self.paths):
            for end in p.between:
                if end not in known:
                    raise ValueError(f"paths.{i}.between: {end!r} is neither a host nor a region of this topology")
        return self


@dataclass(frozen=True)
class PathSpec:
    rate: float | None
    one_way_delay: float
    loss: float
    path_class: PathClass

    def describe(self) -> str:
        rate = f"{self.rate / 1e6:g} Mbit/s" if self.rate else "unshaped"
        return f"{rate}, {self.one_way_delay * 1e3:g} ms one way, {self.loss:.2%} loss"


def _matches(end: str, host: LabHost) -> bool:
    return end in (host.name, host.region)


def resolve(topo: Topology) -> dict[tuple[str, str], PathSpec]:
    """The shaping of every directed host pair."""
    out = {}
    for a in topo.hosts:
        for b in topo.hosts:
            if a is b:
                continue
            cls = PathClass.intra_region if a.region == b.region else PathClass.inter_region
            spec = PathSpec(None, 0.0, 0.0, cls)
            for p in topo.paths:
                x, y = p.between
                if (_matches(x, a) and _matches(y, b)) or (_matches(x, b) and _matches(y, a)):
                    spec = PathSpec(p.rate, p.one_way_delay, p.loss, p.path_class or cls)
            out[(a.name, b.name)] = spec
    return out


def address(index: int) -> str:
    """Host number `index` (1-based) lives at 198.18.<index>.2 behind the router's .1."""
    return f"198.18.{index}.2"


def load(path: str | Path | None) -> Topology:
    if path is None:
        with resources.as_file(resources.files("pathprobe_lab") / "data" / "lab-topology.yaml") as default:
            return yamlfile.load_model(default, Topology)
    return yamlfile.load_model(path, Topology)
