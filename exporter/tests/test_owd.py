"""The one-way delay room: quantiles by direction, exported only while both clocks' bounds
make them worth reading, and why not otherwise."""

from __future__ import annotations

import pytest

from pathprobe.clock import ClockErrorBound
from pathprobe.config import ClockSettings, Config
from pathprobe.metrics.owd import OwdRoom
from pathprobe.probes.echo import OneWay

NOW = 1_800_000_000.0


def room(own_bound: float | None = 20e-6) -> OwdRoom:
    cfg = Config.model_validate(
        {
            "host": {"name": "a", "address": "198.18.1.2", "region": "ap-northeast-1"},
            "peers": [{"name": "b", "address": "198.18.2.2", "region": "ap-northeast-3", "path_class": "inter_region"}],
        }
    )
    bound = ClockErrorBound(ClockSettings(source="stated", error_bound_seconds=own_bound or 1.0))
    bound.seconds = own_bound
    return OwdRoom(cfg, bound, clock=lambda: NOW)


def read(r: OwdRoom) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset((k, v) for k, v in s.labels.items() if k not in ("peer_region", "path_class"))): s.value
        for family in r.collect()
        for s in family.samples
    }


def owd(samples: dict, direction: str) -> float:
    return samples[
        (
            "pathprobe_owd_seconds",
            frozenset({("peer", "b"), ("direction", direction), ("state", "idle"), ("quantile", "0.5")}),
        )
    ]


def feed(
    r: OwdRoom, delays: tuple[float, float], *, peer_bound: float | None = 30e-6, n: int = 20, apart: float = 10e-6
) -> None:
    """n echoes of these (forward, reverse) delays."""
    for _ in range(n):
        r.observe("b", OneWay(*delays, peer_bound, apart), NOW, "idle")


def test_trusted_delays_are_exported_by_direction_with_their_error_bound() -> None:
    r = room()
    feed(r, (0.004, 0.005), apart=10e-6)  # the clocks at least 10 us apart: within the bounds added
    s = read(r)
    assert owd(s, "forward") == pytest.approx(0.004, rel=0.003) and owd(s, "reverse") == pytest.approx(0.005, rel=0.003)
    assert s[("pathprobe_owd_error_bound_seconds", frozenset({("peer", "b")}))] == pytest.approx(50e-6)
    assert s[("pathprobe_owd_trusted", frozenset({("peer", "b")}))] == 1
    assert s[("pathprobe_clock_error_bound_seconds", frozenset({("source", "stated")}))] == 20e-6
    assert not [k for k in s if k[0] == "pathprobe_owd_untrusted_info"]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("the peer states no bound", "no_bound"),
        ("this host knows no bound", "no_bound"),
        ("the echoes put the clocks further apart than their bounds", "clocks_disagree"),
        ("a delay came out negative", "clocks_disagree"),
        ("the bounds are a large share of the delay", "bound_too_wide"),
    ],
)
def test_untrusted_delays_are_withheld_and_say_why(case: str, reason: str) -> None:
    r = room(own_bound=None if case == "this host knows no bound" else 20e-6)
    if case == "the peer states no bound":
        feed(r, (0.004, 0.005), peer_bound=None)
    elif case == "the echoes put the clocks further apart than their bounds":
        feed(r, (0.004, 0.005), apart=0.001)
    elif case == "a delay came out negative":
        feed(r, (0.004, 0.005))
        feed(r, (-0.001, 0.010), n=1)
    elif case == "the bounds are a large share of the delay":
        feed(r, (0.0002, 0.0002))  # 50 us of error on 0.2 ms: above 10% of it
    else:
        feed(r, (0.004, 0.005))
    s = read(r)
    assert s[("pathprobe_owd_trusted", frozenset({("peer", "b")}))] == 0
    assert s[("pathprobe_owd_untrusted_info", frozenset({("peer", "b"), ("reason", reason)}))] == 1
    assert not [k for k in s if k[0].startswith("pathprobe_owd_seconds")]
