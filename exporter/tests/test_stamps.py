"""The network's part of a round trip (pure logic)."""

import pytest

from pathprobe.stamps import network_rtt


def test_hold_time_is_taken_out() -> None:
    assert network_rtt(1_000_000_000, 1_008_500_000, 0.009, 500_000) == pytest.approx(0.008)


def test_a_wall_clock_step_falls_back_to_the_monotonic_interval() -> None:
    backwards = network_rtt(2_000_000_000, 1_000_000_000, 0.009, 500_000)
    too_long = network_rtt(0, 5_000_000_000, 0.009, 500_000)
    assert backwards == too_long == pytest.approx(0.0085)


def test_a_hold_beyond_the_round_trip_cannot_make_it_negative() -> None:
    assert network_rtt(0, 8_000_000, 0.009, 50_000_000) == 0.0
    assert network_rtt(0, 8_000_000, 0.009, -5) == pytest.approx(0.008)
