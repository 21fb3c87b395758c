"""Capacity review logic on the source article's Tokyo-Osaka table ([DIO-TOKYO-OSAKA] in docs/SOURCES.md)."""

import re

import pytest

from pathprobe.capacity import Review, Row, format_duration, text_report
from pathprobe.config import Peer
from pathprobe.html_report import html_report
from pathprobe.limits import expected

OSAKA = Peer.model_validate(
    {
        "name": "osaka",
        "address": "198.18.2.2",
        "region": "ap-northeast-3",
        "path_class": "inter_region",
        "instance_type": "c6gn.12xlarge",
    }
)
DEFAULT_RMEM = 6291456


def review(rows: dict[int, float], rmem: int = DEFAULT_RMEM) -> Review:
    # The source article's kernel 6.1: half a buffer in flight; its tcp_wmem max was 4 MiB
    # but, sending from a tuned or idle host, the article's table is receive-bound.
    r = Review("osaka", "tcp", "send", [Row(n, g * 1e9) for n, g in rows.items()], 0.008, rmem, None, 0.5, 40e12, 0.02)
    for row in r.rows:
        row.expected = expected(OSAKA, "c6gn.12xlarge", "tcp", row.streams, rmem, 0.008, share=0.5)
    return r


# c6gn.12xlarge, default buffers, Gbps by streams ([DIO-TOKYO-OSAKA]).
ARTICLE = {1: 2.95, 4: 12.2, 8: 24.5, 16: 47.4, 32: 66.4, 64: 71.0, 96: 71.2}


def test_knee_is_the_fewest_streams_within_5_percent_of_the_best() -> None:
    r = review(ARTICLE)
    assert r.best().streams == 96  # type: ignore[union-attr]
    assert r.knee().streams == 64  # type: ignore[union-attr]


def test_one_flow_is_diagnosed_as_receive_window_bound_with_the_fix() -> None:
    d = review(ARTICLE).diagnose(review(ARTICLE).rows[0])
    assert d is not None
    assert d.startswith("one flow is bound by the receive window: tcp_rmem max 6 MiB at 8 ms RTT allows about 3.15")
    # 5 Gbps per flow needs 5e9 * 0.008 / 8 / 0.5 = 10 MB of buffer.
    assert "9.54 MiB (on both ends) would reach the per-flow limit (5 Gbit/s)" in d


def test_above_the_documented_cap_is_not_called_a_problem() -> None:
    # 71 Gbps on a 75 Gbps instance is above the 37.5 Gbps documented 50% cap: the table
    # is a floor; the knee's diagnosis names the cap it exceeds.
    r = review(ARTICLE)
    d = r.diagnose(r.knee())
    assert d == (
        "64 flows reach 71 Gbit/s, above the inter-region cap that AWS documents (37.5 Gbit/s): "
        "documented limits are a floor to plan on, not a ceiling"
    )


def test_rates_below_every_limit_are_flagged() -> None:
    r = review({1: 0.5})
    d = r.diagnose(r.rows[0])
    assert d is not None and "below every known limit" in d


def test_time_and_cost_to_move_40_tb() -> None:
    r = review(ARTICLE)
    t = r.transfer(r.knee())
    assert t is not None
    assert t["seconds"] == pytest.approx(40e12 * 8 / 71.0e9)
    assert t["cost"] == pytest.approx(800.0)
    assert format_duration(t["seconds"]) == "75 min"


def test_text_and_html_reports() -> None:
    r = review(ARTICLE)
    text = text_report(r)
    assert re.search(r"knee: 64 stream\(s\)", text)
    assert "moving 40 TB at the knee: about 75 min, transfer cost $800" in text
    page = html_report(r)
    assert page.startswith("<!doctype html>") and "<svg" in page and "<script" not in page
    assert "40 TB in about 75 min with 64 stream(s) for about $800." in page


def test_the_rtt_a_test_saw_is_reported_beside_its_rate() -> None:
    r = review(ARTICLE)
    r.rows[0].rtt_under_load_seconds = 0.00812
    header, first = text_report(r).split("\n\n")[1].splitlines()[:2]
    assert header.index("RTT ms") + len("RTT ms") == first.index(" 8.12 ") + len(" 8.12"), (header, first)
    assert r.to_json()["rows"][0]["rtt_under_load_seconds"] == 0.00812


def test_failed_rows_are_kept_and_json_has_everything() -> None:
    r = review(ARTICLE)
    r.rows.append(Row(128, None, error="busy: the server is busy"))
    j = r.to_json()
    assert j["knee_streams"] == 64 and j["best_streams"] == 96
    assert j["rows"][-1]["error"].startswith("busy")
    assert j["diagnosis"]["one_stream"].startswith("one flow is bound by the receive window")
    assert j["transfer_at_knee"]["cost"] == pytest.approx(800.0)


def test_a_burst_rate_is_planned_at_the_baseline() -> None:
    # c6gn.medium at both ends in one region: 1.6 Gbps baseline, 16 Gbps peak (DescribeInstanceTypes).
    # A 6-second test runs on network I/O credits; a 40 TB transfer spends them.
    near = Peer.model_validate(
        {
            "name": "b",
            "address": "198.18.2.2",
            "region": "r",
            "path_class": "intra_region",
            "instance_type": "c6gn.medium",
        }
    )
    r = Review("b", "tcp", "send", [Row(4, 11.7e9)], 0.0005, DEFAULT_RMEM, None, 0.78, 40e12, 0.0)
    r.rows[0].expected = expected(near, "c6gn.medium", "tcp", 4, DEFAULT_RMEM, 0.0005, share=0.78)
    assert r.rows[0].expected.limit == "instance" and r.rows[0].expected.bits_per_second == 1.6e9
    assert r.rows[0].expected.peak_bits_per_second == 16e9
    t = r.transfer(r.rows[0])
    assert t is not None and t["seconds"] == pytest.approx(40e12 * 8 / 1.6e9)
    assert format_duration(t["seconds"]) == "2.3 days" and format_duration(t["burst_seconds"]) == "7.6 h"
    text = text_report(r)
    assert (
        "moving 40 TB at the knee: 4 streams reach 11.7 Gbit/s while credits last, then the instance bandwidth "
        "at the baseline (1.6 Gbit/s) binds: about 2.3 days, not 7.6 h" in text
    )
    assert "while burst credits last" in (r.diagnose(r.rows[0]) or "")
    assert r.to_json()["rows"][0]["on_burst"] is True


def test_a_fixed_bandwidth_instance_keeps_its_measured_rate() -> None:
    r = review(ARTICLE)
    assert not r.to_json()["rows"][-1]["on_burst"]
    t = r.transfer(r.knee())
    assert t is not None and "burst_seconds" not in t


def test_an_allowance_that_rose_names_the_instance_not_the_path() -> None:
    r = review({4: 3.1})
    r.rows[0].allowance_exceeded = {"bw_out_allowance_exceeded": 812}
    d = r.diagnose(r.rows[0])
    assert d == (
        "3.1 Gbit/s, bound by the instance's allowance, not the path: "
        "bw_out_allowance_exceeded rose by 812 during the test"
    )
    assert r.to_json()["rows"][0]["allowance_exceeded"] == {"bw_out_allowance_exceeded": 812}


def test_a_test_bound_by_its_own_ends_names_the_host_not_the_path() -> None:
    r = review({1: 2.95, 32: 11.2})
    r.rows[1].ends_bound, r.rows[1].remedy = "receiver_cpu", "one_thread"
    said = r.diagnose(r.rows[1])
    assert said is not None and "bound by the receiving host's CPU, not the path" in said, said
    assert "iperf3 3.16 or later, or more iperf3 processes" in said
    assert "receiver_cpu" in text_report(r)
    # A test whose ends both had headroom is judged against the limits as before.
    r.rows[1].ends_bound = "none"
    assert "not the path" not in (r.diagnose(r.rows[1]) or "")
