"""The keys that the control code (turns, expected values) and the rooms share: one throughput
test of one peer. Apart from metrics/, so that what writes results and what reads them name a
test alike without the one importing the other."""

from __future__ import annotations

from typing import NamedTuple

from .probe_settings import TestSpec


class TestKey(NamedTuple):
    """One throughput test of one peer."""

    peer: str
    protocol: str
    streams: str
    direction: str

    @classmethod
    def of(cls, peer: str, spec: TestSpec) -> TestKey:
        protocol, streams, direction = spec
        return cls(peer, protocol, streams, direction)

    @property
    def spec(self) -> TestSpec:
        return TestSpec(self.protocol, self.streams, self.direction)
