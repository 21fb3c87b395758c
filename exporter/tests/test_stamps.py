"""The network's part of a round trip (pure logic)."""

import pytest

from pathprobe.stamps import clock_offset, network_rtt, sent_time


def test_hold_time_is_taken_out() -> None:
    assert network_rtt(1_000_000_000, 1_008_500_000, 0.009, 500_000) == pytest.approx(0.008)


def test_a_wall_clock_step_falls_back_to_the_monotonic_interval() -> None:
    backwards = network_rtt(2_000_000_000, 1_000_000_000, 0.009, 500_000)
    too_long = network_rtt(0, 5_000_000_000, 0.009, 500_000)
    assert backwards == too_long == pytest.approx(0.0085)


def test_a_hold_at_or_beyond_the_round_trip_makes_no_sample() -> None:
    assert network_rtt(0, 8_000_000, 0.009, 50_000_000) is None
    assert network_rtt(0, 8_000_000, 0.009, 8_000_000) is None  # an RTT of 0 is none either
    assert network_rtt(0, 8_000_000, 0.009, 7_000_000) == pytest.approx(0.001)
    assert network_rtt(0, 8_000_000, 0.009, 0) == pytest.approx(0.008)


def test_the_clock_offset_of_a_symmetric_exchange_is_exact() -> None:
    # 10 ms each way, the peer's clock 2 s ahead, 1 ms held there.
    offset, delay = clock_offset(0, 2_010_000_000, 2_011_000_000, 21_000_000)
    assert offset == pytest.approx(2.0) and delay == pytest.approx(0.020)


def test_an_asymmetric_exchange_errs_by_at_most_half_its_delay() -> None:
    # 30 ms there, 2 ms back, the clocks agree: the offset reads half the difference.
    offset, delay = clock_offset(0, 30_000_000, 30_000_000, 32_000_000)
    assert offset == pytest.approx(0.014) and delay == pytest.approx(0.032)
    assert abs(offset) <= delay / 2


def test_a_transmit_stamp_is_used_only_where_it_fits_its_request() -> None:
    assert sent_time(100, 130, 900) == 130
    assert sent_time(100, None, 900) == 100  # none given
    assert sent_time(100, 90, 900) == 100  # before the clock read: an earlier send's
    assert sent_time(100, 950, 900) == 100  # after the answer: a later send's
