"""What the rooms share: the labels of a peer and a test, the scope a room serves (the config
in force and the peers it admits), and the small builders of metric families."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..config import Config, Peer

PEER = ["peer", "peer_region", "path_class"]
TEST = [*PEER, "protocol", "streams", "direction"]
K = TypeVar("K")
V = TypeVar("V")
STATE_DOC = " state=loaded: this host or the peer may be in a throughput test (self-inflicted loss), else idle."


def peer_labels(peer: Peer) -> list[str]:
    return [peer.name, peer.region, peer.path_class.value]


@dataclass(frozen=True)
class Scope:
    """What a room serves: the config in force and the peers it keeps results of (the probed
    ones). A reload replaces the whole object, so that a render reads one config throughout."""

    cfg: Config
    peers: dict[str, Peer]

    @classmethod
    def of(cls, cfg: Config) -> Scope:
        return cls(cfg, {p.name: p for p in cfg.probed_peers})

    def labels(self, peer: str) -> list[str] | None:
        """The peer's labels; None for a peer this config does not probe (its entry is skipped)."""
        found = self.peers.get(peer)
        return None if found is None else peer_labels(found)

    def entries(self, table: Mapping[K, V]) -> Iterator[tuple[list[str], K, V]]:
        """(peer labels, key, value) of a copy of `table` (keyed by a peer's name, or by a key with a
        `peer` field), for the peers this config probes: what a reload forgot since is left out."""
        for key, value in dict(table).items():
            labels = self.labels(key if isinstance(key, str) else key.peer)  # type: ignore[attr-defined]
            if labels is not None:
                yield labels, key, value


class Room:
    """The state of one part of the exporter, its writers and its metrics (a custom collector
    of client_python's registry). Writers run on the event loop and drop what is written for a
    peer the config does not probe; collect() runs on the render thread and copies each table
    before reading it (one C-level copy under the GIL: never a table changed while iterated)."""

    def __init__(self, cfg: Config):
        self.scope = Scope.of(cfg)

    def use(self, cfg: Config) -> None:
        """A reload: serve `cfg` and forget the peers it no longer probes."""
        self.scope = Scope.of(cfg)
        for table in self.tables():
            drop_peers(table, self.scope.peers)

    def admits(self, peer: str) -> bool:
        return peer in self.scope.peers

    def tables(self) -> list[MutableMapping[Any, Any]]:
        """The room's tables keyed by peer (a name, or a key with a `peer` field)."""
        return []

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration: names are fixed in collect()


def drop_peers(table: MutableMapping[Any, Any], keep: Collection[str]) -> None:
    for key in [k for k in table if (k if isinstance(k, str) else k.peer) not in keep]:
        del table[key]


def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def one(kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str, doc: str, value: float) -> Metric:
    """A metric with one unlabelled sample."""
    return kind(name, doc, value=value)
