"""Every probe kind, described once, as blackbox_exporter's `Probers` map names each prober: the
exporter builds its continuous probers from this table, the turns their tests' prober and target,
and the outcomes room counts each kind's runs from it. A kind's name is the `probe` label of
pathprobe_probe_runs_total and the key of its settings under `probes:` in the config.

Adding a kind: its prober module in probes/ (the prober, the sink protocol it hands results to),
its settings model under `Probes` in config.py, the recorder of the room that keeps its results
(metrics/), and its entry below."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .config import Config, Peer
from .expected import RttWindow
from .metrics import Rooms
from .metrics.echo import EchoRecorder, MtuRecorder
from .metrics.rtt import RttRecorder
from .probe_settings import MtuSettings
from .probes import EchoProber, MtuProber, ProberFactory, RttProber, Target, ThroughputProber
from .probes.rtt import RttTee

log = logging.getLogger(__name__)


class Wiring(NamedTuple):
    """What a kind's recorder is built from: the rooms, the config in force and the RTT windows
    that the expected throughput reads."""

    rooms: Rooms
    cfg: Config
    windows: dict[str, RttWindow]


def _section(cfg: Config, peer: Peer, kind: str, local_mtu: int | None) -> Any:
    """A kind's settings: its section under `probes:`."""
    return getattr(cfg.probes, kind)


def _mtu_sizes(cfg: Config, peer: Peer, kind: str, local_mtu: int | None) -> MtuSettings:
    """The MTU probe's settings with the sizes of this path's class that this host's interfaces allow."""
    settings = cfg.probes.mtu
    wanted = settings.sizes_for(peer.path_class.value)
    sizes = [s for s in wanted if local_mtu is None or s <= local_mtu]
    if sizes != wanted:
        log.warning(
            "mtu probes to %s: sizes above this host's largest interface MTU (%s) left out: %s",
            peer.name,
            local_mtu,
            sorted(set(wanted) - set(sizes)),
        )
    return settings.model_copy(update={"sizes": sizes})


def _rr_port(cfg: Config, peer: Peer) -> int:
    return peer.rr_port or cfg.responders.rr_port


def _echo_port(cfg: Config, peer: Peer) -> int:
    return peer.echo_port or cfg.responders.echo_port


def _iperf3_port(cfg: Config, peer: Peer) -> int:
    return peer.iperf3_port or cfg.iperf3.port


def _rtt_recorder(w: Wiring, peer: str) -> RttTee:
    """The RTT room (its failing flows counted by the echo room), and the window the expected values read."""
    rooms = w.rooms
    recorder = RttRecorder(rooms.rtt, rooms.outcomes.ledger("rtt"), rooms.echo, peer, w.cfg.probes.rtt.size_bytes)
    return RttTee(recorder, w.windows[peer])


def _echo_recorder(w: Wiring, peer: str) -> EchoRecorder:
    return EchoRecorder(w.rooms.echo, w.rooms.outcomes.ledger("loss"), peer, w.rooms.owd)


def _mtu_recorder(w: Wiring, peer: str) -> MtuRecorder:
    return MtuRecorder(w.rooms.echo, w.rooms.outcomes.ledger("mtu"), peer)


@dataclass(frozen=True)
class Kind:
    """One probe kind. `continuous`: run per peer until cancelled (else one test per turn of the
    schedule); `peers`: the peers it probes; `port`: the peer's responder it reaches; `prober`:
    built from (target, settings, sink); `recorder`: the sink, of the room that keeps a peer's
    results; `settings`: its settings for a peer, given this host's largest interface MTU."""

    name: str
    continuous: bool
    peers: Callable[[Config], list[Peer]]
    port: Callable[[Config, Peer], int]
    prober: ProberFactory[Any, Any]
    # None: recorded per test by the turns (metrics.throughput.TestRecorder).
    recorder: Callable[[Wiring, str], object] | None = None
    settings_of: Callable[[Config, Peer, str, int | None], Any] = _section

    def settings(self, cfg: Config, peer: Peer, local_mtu: int | None = None) -> Any | None:
        """This kind's settings for `peer` (None: the kind is disabled)."""
        if not getattr(cfg.probes, self.name).enabled:
            return None
        return self.settings_of(cfg, peer, self.name, local_mtu)

    def target(self, cfg: Config, peer: Peer) -> Target:
        """Where this kind's prober sends for `peer`: its responder, from this host's probe source."""
        return Target(str(peer.address), self.port(cfg, peer), cfg.host.probe_source)


THROUGHPUT = Kind("throughput", False, lambda cfg: cfg.throughput_peers, _iperf3_port, ThroughputProber)
# In the order of the outcomes' series on /metrics.
KINDS = {
    kind.name: kind
    for kind in (
        THROUGHPUT,
        Kind("rtt", True, lambda cfg: cfg.rtt_peers, _rr_port, RttProber, _rtt_recorder),
        # The UDP echo probe: loss, and the echo's RTT, one-way delays and clock offset (pathprobe_udp_*).
        Kind("loss", True, lambda cfg: cfg.rtt_peers, _echo_port, EchoProber, _echo_recorder),
        Kind("mtu", True, lambda cfg: cfg.rtt_peers, _echo_port, MtuProber, _mtu_recorder, _mtu_sizes),
    )
}
