"""What the config says, as metrics: the build, the peers, the probes' settings, and the
instance types the limits table does not know. No state: all from the config in force."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import InfoMetricFamily, Metric

from .. import build, instance_types
from ..config import Config, PathClass, Peer
from ..probe_settings import ThroughputSettings
from .common import PEER, TEST, gauge, peer_labels


def settings_labels(t: ThroughputSettings, protocol: str) -> list[str]:
    return [
        f"{t.duration_seconds:g}",
        f"{t.omit_seconds:g}",
        (t.congestion or "default") if protocol == "tcp" else "",
        f"{t.udp_bitrate:.0f}" if protocol == "udp" else "",
        str(t.window_bytes or ""),
    ]


class ConfigInfo:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.types = instance_types.load()

    def use(self, cfg: Config) -> None:
        self.cfg = cfg

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        cfg = self.cfg
        info = InfoMetricFamily(
            "pathprobe_build", "The pathprobe exporter's version, the git commit it was built from, its Python."
        )
        info.add_metric([], build.labels())
        yield info
        yield from self._peers(cfg)
        yield from self._instance_types(cfg)

    def _peers(self, cfg: Config) -> Iterator[Metric]:
        info = gauge(
            "pathprobe_peer_info",
            "A configured peer (value 1).",
            ["peer", "peer_region", "peer_zone", "path_class", "address", "attachment", "peer_attachment"],
        )
        ceiling = gauge(
            "pathprobe_rtt_ceiling_seconds",
            "Configured RTT ceiling of a path (peers[].rtt_ceiling_seconds), for alerting.",
            PEER,
        )
        rtt_settings = gauge(
            "pathprobe_rtt_settings_info",
            "Settings of the RTT probes (value 1): interval between requests, size, timeout.",
            [*PEER, "protocol", "interval_seconds", "size_bytes", "timeout_seconds", "flows"],
        )
        tput_settings = gauge(
            "pathprobe_throughput_settings_info",
            "Settings of the throughput tests behind each result (value 1).",
            [*TEST, "duration_seconds", "omit_seconds", "congestion", "target_bits_per_second", "window_bytes"],
        )
        rtt_peers = {p.name for p in cfg.rtt_peers}
        throughput_peers = {p.name for p in cfg.throughput_peers}
        for peer in cfg.probed_peers:
            labels = peer_labels(peer)
            # The Transit Gateway attachments at both ends, on the paths that cross them only.
            tgw = peer.path_class == PathClass.transit_gateway
            attachments = [cfg.host.transit_gateway_attachment, peer.transit_gateway_attachment] if tgw else ["", ""]
            info.add_metric(
                [peer.name, peer.region, peer.zone, peer.path_class.value, str(peer.address), *attachments], 1
            )
            if peer.rtt_ceiling_seconds:
                ceiling.add_metric(labels, peer.rtt_ceiling_seconds)
            if peer.name in rtt_peers:
                for row in _rtt_settings(cfg):
                    rtt_settings.add_metric([*labels, *row], 1)
            if peer.name in throughput_peers:
                for row in _throughput_settings(cfg, peer):
                    tput_settings.add_metric([*labels, *row], 1)
        yield from (info, ceiling, rtt_settings, tput_settings)

    def _instance_types(self, cfg: Config) -> Iterator[Metric]:
        unknown = gauge(
            "pathprobe_instance_type_unknown",
            'An instance type named in the config (of this host, peer="", or of a peer) that the instance-type '
            "table does not know (value 1): its bandwidth limits are left out of the expected values.",
            ["peer", "instance_type"],
        )
        ends = [("", cfg.host.instance_type)] + [(p.name, p.instance_type) for p in cfg.peers]
        for peer_name, instance_type in ends:
            if instance_type and self.types.get(instance_type) is None:
                unknown.add_metric([peer_name, instance_type], 1)
        yield unknown
        table = InfoMetricFamily(
            "pathprobe_instance_types_table", "The instance-type table the expected limits use: source and date."
        )
        table.add_metric([], {"source": self.types.source, "as_of": self.types.as_of.isoformat()})
        yield table


def _rtt_settings(cfg: Config) -> list[list[str]]:
    """The rows of pathprobe_rtt_settings_info of an RTT peer: request/response, then echo."""
    rtt, loss = cfg.probes.rtt, cfg.probes.loss
    rows = []
    if rtt.enabled:
        rows.append(
            ["tcp", f"{rtt.interval_seconds:g}", str(rtt.size_bytes), f"{rtt.timeout_seconds:g}", str(rtt.flows)]
        )
    if loss.enabled:
        rows.append(
            ["udp", f"{1 / loss.rate_pps:g}", str(loss.size_bytes), f"{loss.timeout_seconds:g}", str(loss.flows)]
        )
    return rows


def _throughput_settings(cfg: Config, peer: Peer) -> list[list[str]]:
    tput = cfg.throughput_for(peer)
    if not tput.enabled:
        return []
    return [[*key, *settings_labels(tput, key.protocol)] for key in tput.tests()]
