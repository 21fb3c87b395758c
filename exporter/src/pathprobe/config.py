"""The exporter's configuration: one YAML file per host, validated strictly.

Every model forbids unknown keys so that a typo is an error, not a silently
ignored setting.
"""

from __future__ import annotations

import ipaddress
import socket
from collections import Counter
from collections.abc import Callable
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BeforeValidator,
    Field,
    IPvAnyAddress,
    IPvAnyNetwork,
    field_validator,
    model_validator,
)

from . import mesh as selection
from . import wire, yamlfile
from .probe_settings import FLOWS_DEFAULT, Probes, ThroughputOverrides, ThroughputSettings
from .strict import BitsPerSecond, Bytes, Strict


class PathClass(StrEnum):
    intra_region = "intra_region"
    inter_region = "inter_region"
    transit_gateway = "transit_gateway"
    vpc_peering = "vpc_peering"


class Host(Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    address: IPvAnyAddress
    region: str = Field(min_length=1)
    zone: str = ""
    instance_type: str = ""
    # The Transit Gateway attachment of this host's VPC (tgw-attach-...), the one its transit_gateway
    # paths leave through: the alert rules name it when most of the paths over it degrade.
    transit_gateway_attachment: str = ""
    # Whose ENA allowance counters (ethtool -S) to read; default: the default route's interface.
    interface: str = Field(default="", pattern=r"^[A-Za-z0-9_.:@-]{0,15}$")
    # The address probes and tests leave from (peers admit this host by `address`); default:
    # `address` when this host holds it, else the route's choice (a NAT's or an Elastic IP's).
    source_address: IPvAnyAddress | None = None

    @cached_property
    def probe_source(self) -> str | None:
        """The address every probe and test binds to, or None for the route's choice."""
        if self.source_address is not None:
            return str(self.source_address)
        return str(self.address) if wire.sendable_from(str(self.address)) else None


class ScheduleSettings(Strict):
    # Length of one slot of the round-robin tournament; the two hosts of a pair
    # each get half of it as the client.
    slot_seconds: float = Field(default=120, ge=4)
    # Random delay before a half-slot's first test, so that tests do not start
    # in lock-step on clock edges.
    jitter_seconds: float = Field(default=2, ge=0)
    # Time a test may overrun duration + omit before it is killed; killed at its turn's end anyway.
    timeout_margin_seconds: float = Field(default=5, ge=1)


class Limits(Strict):
    """Per-path expected-throughput inputs (see limits.py); all optional."""

    expected_bits_per_second: BitsPerSecond | None = None
    per_flow_bits_per_second: BitsPerSecond | None = None
    instance_bits_per_second: BitsPerSecond | None = None  # the instance's baseline (the alerting floor)
    # The instance's peak ("up to") while network I/O credits last; default: instance_bits_per_second if
    # given, else the instance-type table's peak.
    instance_peak_bits_per_second: BitsPerSecond | None = None
    region_cap_bits_per_second: BitsPerSecond | None = None
    transit_gateway_bits_per_second: BitsPerSecond | None = None
    placement: Literal["default", "cluster", "ena_express"] | None = None


class Peer(Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    address: IPvAnyAddress
    region: str = Field(min_length=1)
    zone: str = ""
    path_class: PathClass
    instance_type: str = ""
    # The Transit Gateway attachment of the peer's VPC (with path_class transit_gateway).
    transit_gateway_attachment: str = ""
    # Ports of this peer's responders when they differ from this host's own.
    iperf3_port: int | None = Field(default=None, ge=1, le=65535)
    rr_port: int | None = Field(default=None, ge=1, le=65535)
    echo_port: int | None = Field(default=None, ge=1, le=65535)
    throughput: ThroughputOverrides = ThroughputOverrides()
    rtt_ceiling_seconds: float | None = Field(default=None, gt=0)
    limits: Limits = Limits()
    # The peer's tcp_rmem and tcp_wmem max, for the buffer bounds of tests it receives
    # or sends; default: this host's own (a fleet tuned alike).
    tcp_rmem_max_bytes: Bytes | None = None
    tcp_wmem_max_bytes: Bytes | None = None


class Iperf3Auth(Strict):
    """iperf3's RSA authentication (iperf3 >= 3.7 built with OpenSSL)."""

    username: str
    password_file: Path
    public_key_file: Path  # the mesh's server public key, used as client
    private_key_file: Path  # used as server
    authorized_users_file: Path
    # True while any host of the fleet runs iperf3 older than 3.17: this host's iperf3, if 3.17 or
    # newer, then uses the old PKCS#1 padding as server, and as client up to 3.19 (iperf3.py says
    # why). Every host of a fleet must use one padding: a server reads one, whoever the client is.
    legacy_rsa_padding: bool = False


class Iperf3Settings(Strict):
    binary: str = "iperf3"
    port: int = Field(default=5201, ge=1, le=65535)
    # iperf3 servers this host runs, on `port` and the ports after it; a test of several streams is
    # split over as many client processes (each its share of the streams, at most `processes`, at
    # most the peer's servers) where this host's or the peer's iperf3 is older than 3.16: those run
    # every stream of a process on one thread, so a test measures one core, not a 50 Gbit/s
    # instance's network. From 3.16 a thread per stream: one process is enough, and is used.
    processes: int = Field(default=1, ge=1, le=64)
    # The longest a peer's test may run on this host's servers before the supervisor takes the
    # server for wedged and restarts it (and iperf3 3.20+'s own --server-max-duration); None: half
    # the schedule's slot (no test of the schedule's takes longer), 120 s under `pathprobe serve`.
    max_test_seconds: float | None = Field(default=None, gt=0, le=3600)
    auth: Iperf3Auth | None = None
    # Limits on what a peer's test may take from this host (iperf3 -s options).
    server_bitrate_limit: BitsPerSecond | None = None
    idle_timeout_seconds: int = Field(default=30, ge=1)
    # Whose tests the iperf3 server lets run (others are cut as they connect, and counted):
    # "turn": a peer in its client turn against this host by the schedule (and responders.allow
    # at any time); "peers": any peer or responders.allow at any time; "anyone": no check.
    admit: Literal["turn", "peers", "anyone"] = "turn"

    @property
    def ports(self) -> list[int]:
        """The servers' ports."""
        return list(range(self.port, self.port + self.processes))

    @model_validator(mode="after")
    def _ports_exist(self) -> Iperf3Settings:
        if self.port + self.processes - 1 > 65535:
            raise ValueError(f"port {self.port} and {self.processes - 1} more (processes) pass 65535")
        return self


class ClockSettings(Strict):
    """This host's clock error bound, which one-way delays need (clock.py): ClockBound's
    segment, chronyd's tracking, or a stated figure; `auto`: ClockBound where it runs, else chronyd."""

    source: Literal["auto", "clockbound", "chrony", "stated"] = "auto"
    error_bound_seconds: float | None = Field(default=None, gt=0, le=10)  # with source: stated
    clockbound_path: Path = Path("/var/run/clockbound/shm0")
    chronyc: str = "chronyc"
    refresh_seconds: float = Field(default=16, ge=1, le=3600)
    # A one-way delay is trusted while both ends' bounds added stay within this share of it.
    max_error_share: float = Field(default=0.1, gt=0, le=1)

    @model_validator(mode="after")
    def _stated_needs_a_figure(self) -> ClockSettings:
        if (self.source == "stated") != (self.error_bound_seconds is not None):
            raise ValueError("error_bound_seconds is set with source: stated, and only then")
        return self


class Responders(Strict):
    listen: IPvAnyAddress = ipaddress.IPv4Address("0.0.0.0")
    rr_port: int = Field(default=9470, ge=1, le=65535)
    echo_port: int = Field(default=9470, ge=1, le=65535)
    # Addresses allowed besides the configured peers.
    allow: list[IPvAnyNetwork] = []  # noqa: RUF012 - a pydantic field: copied per model
    # Echo packets per second accepted from one source; more are dropped and counted.
    echo_max_pps_per_source: float = Field(default=2000, gt=0)
    # At least the peers' probes.rtt.flows.
    rr_max_connections_per_source: int = Field(default=2 * FLOWS_DEFAULT, ge=1)


def _moved_to_web_config(what: str) -> Callable[[object], None]:
    """A validator refusing a field of the old web section, with where its setting lives now."""

    def refuse(value: object) -> None:
        if value is None:  # nothing set (and what a model_dump of a config writes back)
            return
        raise ValueError(
            f"moved to the web config file (web.config_file or --web.config.file, exporter-toolkit's "
            f"format: docs/web-configuration.md of github.com/prometheus/exporter-toolkit): {what}"
        )

    return refuse


MovedTls = Annotated[Any, BeforeValidator(_moved_to_web_config("tls_server_config: {cert_file: ..., key_file: ...}"))]
MovedBasicAuth = Annotated[Any, BeforeValidator(_moved_to_web_config("basic_auth_users: {USER: BCRYPT-HASH}"))]


class WebSettings(Strict):
    listen: str = Field(default="0.0.0.0:9469", pattern=r"^(\[[0-9a-fA-F:]+\]|[^:\[\]]*):[0-9]{1,5}$")
    # TLS and basic auth of /metrics: exporter-toolkit's web config file, as every Prometheus
    # exporter reads it (webconfig.py); None: plain HTTP, no authentication.
    config_file: Path | None = None

    @field_validator("config_file", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value  # as the toolkit's --web.config.file "": no file

    # The former `tls` and `basic_auth` sections are refused rather than mapped onto the web
    # config: one place for one setting (two would need an order between them), the format every
    # exporter and the prometheus-community roles share, and a bcrypt hash on disk instead of the
    # plaintext password the old password_file held.
    tls: MovedTls = Field(default=None, exclude=True)
    basic_auth: MovedBasicAuth = Field(default=None, exclude=True)
    # POST /-/reload reloads the config, as SIGHUP does (off by default, like Prometheus's
    # --web.enable-lifecycle: anyone who reaches /metrics could ask for it).
    enable_lifecycle: bool = False
    # The shortest time between two renders of /metrics (web/snapshot.py's Snapshot). Renders are timed for
    # the scrapers' own intervals, but one scraping more often than this reads a snapshot up to this
    # old: set it below a scrape interval shorter than 5 s. Renders stay within 5% of a core whatever it
    # is; at most 15 s, the oldest a snapshot gets (web.snapshot.MAX_AGE_SECONDS).
    refresh_seconds: float = Field(default=5.0, ge=0.1, le=15)

    @field_validator("listen")
    @classmethod
    def _port_in_range(cls, listen: str) -> str:
        if int(listen.rpartition(":")[2]) > 65535:
            raise ValueError(f"port of {listen!r} is above 65535")
        return listen

    def address(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


class BudgetSettings(Strict):
    # Bytes that throughput tests started by this host may move per UTC day.
    daily_bytes: Bytes = Field(default=50 * 10**9)
    state_file: Path = Path("/var/lib/pathprobe/budget.json")
    # Dollars per GB (10^9 bytes) of probe traffic by path class, as the provider bills it
    # (e.g. inter_region: 0.02): pathprobe_probe_cost_dollars_total. Unset classes cost nothing.
    price_per_gb: dict[PathClass, Annotated[float, Field(ge=0, le=100)]] = Field(default_factory=dict)


class EvidenceSettings(Strict):
    """Every throughput test's whole result kept on the host (evidence.py), served at /tests and
    /tests/<id> behind /metrics' authentication and bundled by `pathprobe evidence`: the oldest go
    first once either bound is reached."""

    enabled: bool = True  # false: no record kept, /tests answers 404
    # The store's directory (one JSON file per test); None: `tests/HOST` beside budget.state_file
    # (HOST: host.name; one directory per exporter where several share a state directory).
    directory: Path | None = None
    # The most records kept, and their most bytes together: beyond either, the oldest go
    # (pathprobe_evidence_evicted_total). A record grows with its intervals times its streams.
    max_tests: int = Field(default=1000, ge=1, le=1_000_000)
    max_bytes: Bytes = Field(default=100 * 2**20, ge=2**20)

    def path(self, budget: BudgetSettings, host: str) -> Path:
        return self.directory if self.directory is not None else budget.state_file.parent / "tests" / host


class FlowNetwork(Strict):
    """Networks that are not peers whose flows are counted together, as one destination."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # the `peer` label
    networks: list[IPvAnyNetwork] = Field(min_length=1)
    region: str = Field(min_length=1)  # the `peer_region` label
    zone: str = ""
    path_class: PathClass = PathClass.inter_region


class FlowsSettings(Strict):
    """The host's own TCP flows to its peers (flowreader.py): read from the kernel's sock_diag
    (tcp_info: counters and times, never a payload), labelled per peer and limit only."""

    enabled: bool = True  # false: no reading, no pathprobe_tcp_flows_* series
    # How often the flows are read (each read walks every established socket of the host).
    interval_seconds: float = Field(default=10, ge=1, le=3600)
    # Past this many flows to peers and networks, a stable sample of them (by socket cookie) is
    # read and its counts scaled up: pathprobe_tcp_flows_sampled_ratio says by how much.
    max_sockets: int = Field(default=10000, ge=1, le=10_000_000)
    # Destinations that are not peers (a region's or a zone's networks), each counted as one.
    networks: list[FlowNetwork] = Field(default_factory=list)


class MeshSettings(Strict):
    """Which of the members (this host and `peers`) this host probes: every host derives the
    same links from the same member list (mesh.py). `full_mesh` probes every peer;
    `hierarchical` every peer of the same region (or zone) and `representatives` links per
    region pair, so that a large fleet stays within its series and test budget."""

    rtt: selection.Policy = selection.Policy()  # the RTT, loss and MTU probes
    throughput: selection.Policy | None = None  # the throughput tests; None: as rtt
    # When this member list starts scheduling throughput tests (ISO 8601 with a zone, or Unix
    # seconds), the same on every host: a reload before it keeps the old schedule until then,
    # a fresh start takes no turn until then (schedule.Timetable). None: at once. More than a
    # day ahead is taken for a typo: check-config refuses it, the exporter logs it.
    epoch: AwareDatetime | None = None
    # Peers outside this host's region (or zone) export fewer series (docs/fleet.md): RTT p50
    # and p99 of idle samples, UDP sent and lost, and only the probe outcomes that happened
    # (no series from zero). "none": every peer in full.
    compact_outside: Literal["none", "region", "zone"] = "none"


class Config(Strict):
    host: Host
    # Every other member of the mesh; `mesh` chooses which of them this host probes.
    peers: list[Peer] = Field(min_length=1)
    mesh: MeshSettings = MeshSettings()
    probes: Probes = Probes()
    schedule: ScheduleSettings = ScheduleSettings()
    responders: Responders = Responders()
    iperf3: Iperf3Settings = Iperf3Settings()
    web: WebSettings = WebSettings()
    budget: BudgetSettings = BudgetSettings()
    evidence: EvidenceSettings = EvidenceSettings()
    clock: ClockSettings = ClockSettings()
    flows: FlowsSettings = FlowsSettings()
    # This host's tcp_rmem / tcp_wmem maximum for the buffer bounds; None reads /proc at start.
    tcp_rmem_max_bytes: Bytes | None = None
    tcp_wmem_max_bytes: Bytes | None = None
    # Share of a buffer TCP keeps in flight; None: from the kernel version (limits.window_share).
    tcp_window_share: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _check_mesh(self) -> Config:
        # Counted, not names.count(n) per name: a 20k-peer mesh took seconds (quadratic).
        names = Counter([self.host.name, *(p.name for p in self.peers)])
        dupes = sorted(n for n, k in names.items() if k > 1)
        if dupes:
            raise ValueError(f"host and peer names must be unique; repeated: {_some(dupes)}")
        # As addresses, not strings: ::ffff:198.18.1.2 is 198.18.1.2.
        addrs = Counter(str(_plain(a)) for a in [self.host.address, *(p.address for p in self.peers)])
        dupes = sorted(a for a, k in addrs.items() if k > 1)
        if dupes:
            raise ValueError(f"host and peer addresses must be unique; repeated: {_some(dupes)}")
        # A mesh shares its probe settings: peers open as many RR connections to this host as it does to them.
        if self.probes.rtt.enabled and self.responders.rr_max_connections_per_source < self.probes.rtt.flows:
            raise ValueError(
                f"responders.rr_max_connections_per_source {self.responders.rr_max_connections_per_source} is "
                f"below probes.rtt.flows {self.probes.rtt.flows}: peers' RTT flows beyond it would be refused "
                "and read as failing flows"
            )
        for name, policy in (("rtt", self.mesh.rtt), ("throughput", self.mesh.throughput or self.mesh.rtt)):
            try:
                selection.check(self.members, policy, f"mesh.{name}")
            except selection.MeshError as exc:
                raise ValueError(str(exc)) from None
        need = self.half_slot_need()
        half = self.schedule.slot_seconds / 2
        if need > half:
            raise ValueError(
                f"schedule.slot_seconds {self.schedule.slot_seconds:g} is too short: one host's tests "
                f"need up to {need:g} s per half-slot (tests x (omit + duration + timeout margin) + jitter); "
                f"set slot_seconds >= {2 * need:g} or run fewer stream counts/protocols"
            )
        return self

    @cached_property
    def members(self) -> list[selection.Member]:
        """This host and its peers: the member list every host of the mesh shares."""
        hosts: list[Host | Peer] = [self.host, *self.peers]
        return [selection.Member(m.name, m.region, m.zone) for m in hosts]

    def _selected(self, policy: selection.Policy) -> list[Peer]:
        if policy.kind == "full_mesh":
            return list(self.peers)
        chosen = set(selection.peers(self.members, self.host.name, policy))
        return [p for p in self.peers if p.name in chosen]

    @cached_property
    def rtt_peers(self) -> list[Peer]:
        """The peers this host runs RTT, loss and MTU probes to (mesh.rtt)."""
        return self._selected(self.mesh.rtt)

    @cached_property
    def throughput_peers(self) -> list[Peer]:
        """The peers this host runs throughput tests with (mesh.throughput)."""
        return self._selected(self.mesh.throughput or self.mesh.rtt)

    @cached_property
    def probed_peers(self) -> list[Peer]:
        """Every peer this host probes or answers: whom the responders admit and /metrics names."""
        names = {p.name for p in self.rtt_peers} | {p.name for p in self.throughput_peers}
        return [p for p in self.peers if p.name in names]

    @cached_property
    def compact_peers(self) -> frozenset[str]:
        """Peers exported in compact form (mesh.compact_outside)."""
        where = self.mesh.compact_outside
        if where == "none":
            return frozenset()
        mine = (self.host.region, self.host.zone if where == "zone" else "")
        return frozenset(p.name for p in self.peers if (p.region, p.zone if where == "zone" else "") != mine)

    @cached_property
    def throughput_pairs(self) -> set[tuple[str, str]] | None:
        """The pairs of the whole mesh that run throughput tests (for the schedule); None: all."""
        policy = self.mesh.throughput or self.mesh.rtt
        if policy.kind == "full_mesh":
            return None
        return selection.links(self.members, policy)

    def throughput_for(self, peer: Peer) -> ThroughputSettings:
        """The global throughput settings with this peer's overrides applied."""
        changes = {name: value for name, value in peer.throughput if value is not None}  # models stay models
        return self.probes.throughput.model_copy(update=changes)

    def half_slot_need(self, with_margin: bool = True) -> float:
        """Seconds a half-slot's tests take at most (with the timeout margin of each: what the
        slot must hold) or as run (without it: when a host is in a test, for the RTT's state)."""
        sched = self.schedule
        margin = sched.timeout_margin_seconds if with_margin else 0.0
        worst = 0.0
        for peer in self.throughput_peers:
            t = self.throughput_for(peer)
            if not t.enabled:
                continue
            worst = max(worst, len(t.tests()) * (t.omit_seconds + t.duration_seconds + margin))
        return worst + sched.jitter_seconds if worst else 0.0


def _some(items: list[str], most: int = 10) -> str:
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more


def _plain(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def check_outside(cfg: Config) -> list[tuple[yamlfile.Loc, str]]:
    """What the file alone cannot tell: every file the config names exists and can be
    read (the web config file of /metrics, iperf3's auth files), and web.listen's host
    resolves. (Field path, problem) pairs; `load(path, check_files=True)` reports them."""
    found: list[tuple[yamlfile.Loc, str]] = []
    files: list[tuple[yamlfile.Loc, Path]] = []
    if cfg.web.config_file is not None:
        files.append((("web", "config_file"), cfg.web.config_file))
    if cfg.iperf3.auth is not None:
        files += [(("iperf3", "auth", name), path) for name, path in cfg.iperf3.auth if isinstance(path, Path)]
    for loc, path in files:
        problem = yamlfile.file_problem(path)
        if problem:
            found.append((loc, problem))
    host, port = cfg.web.address()
    try:
        socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        found.append((("web", "listen"), f"cannot resolve {host!r}: {exc}"))
    return found


def load(path: str | Path, check_files: bool = False) -> Config:
    """Load and validate a config file; raises yamlfile.ConfigError listing every problem.

    check_files: also check what lies outside the file (`check_outside`): check-config
    and run ask for it; unit tests that name files they never create do not."""
    return yamlfile.load_model(path, Config, check_outside if check_files else None)
