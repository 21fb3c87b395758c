"""`pathprobe capacity --predict`: the model's plan, checked against published sweeps
(fixtures/published_sweeps.yaml, each figure cited there)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pathprobe.commands import main
from pathprobe.config import Limits, PathClass
from pathprobe.limits import SEND_SHARE, kernel_window_share
from pathprobe.prediction import Inputs, PredictedRow, against_plan, against_plan_text, predict, read_plan
from pathprobe.units import parse_duration

PUBLISHED = yaml.safe_load((Path(__file__).parent / "fixtures" / "published_sweeps.yaml").read_text("utf-8"))
# A window, a per-flow limit or the receiver's CPU is a ceiling a flow approaches from below (slow
# start, loss), so rows bound by one are predicted within this share, and may fall this much under
# the floor.
WITHIN = 0.10
BOUNDS = {"receive_window", "send_buffer", "per_flow", "receiver_cpu"}
# Each published row's error against the predicted peak (measured / peak - 1), stated: a change of
# the model that moves one shows here. The 1-vCPU rows are bound by the receiver's CPU: 12.4 Gbit/s
# per arm64 vCPU (limits.yaml), which is this very sweep's 11.7 Gbit/s at 93.8% of the vCPU, so
# those two rows check the model's arithmetic, not an independent measurement; the 48-vCPU rows at
# 71 Gbit/s (540.9% of a core's worth: 13.2 per core) are the cross-check. The 16-stream tuned row
# is the worst (-24%): 56.7 Gbit/s against the instance's 75, where no limit the model knows binds.
ROW_ERRORS = {
    ("c6gn.12xlarge, default buffers", 1): -0.062, ("c6gn.12xlarge, default buffers", 4): -0.030,
    ("c6gn.12xlarge, default buffers", 8): -0.026, ("c6gn.12xlarge, default buffers", 16): -0.058,
    ("c6gn.12xlarge, default buffers", 32): -0.115, ("c6gn.12xlarge, default buffers", 64): -0.053,
    ("c6gn.12xlarge, default buffers", 96): -0.051, ("c6gn.12xlarge, tuned buffers", 1): -0.050,
    ("c6gn.12xlarge, tuned buffers", 16): -0.244, ("c6gn.12xlarge, tuned buffers", 32): -0.069,
    ("c6gn.12xlarge, tuned buffers", 64): -0.052, ("c6gn.medium, default buffers", 1): -0.072,
    ("c6gn.medium, tuned buffers", 1): -0.050, ("c6gn.medium, tuned buffers", 4): -0.056,
    ("c6gn.medium, tuned buffers", 8): -0.056,
}  # fmt: skip


def _inputs(s: dict[str, Any], rtt: float | None = None) -> Inputs:
    return Inputs(
        s.get("from", ""),
        s.get("to", ""),
        PathClass(s.get("path_class", "intra_region")),
        rtt or parse_duration(s["rtt"], "rtt"),
        s["rmem_max"],
        s["wmem_max"],
        kernel_window_share(s["kernel"]),
        SEND_SHARE,
        Limits(**s.get("limits", {})),
    )


def _sweep_rows() -> list[tuple[str, int, float, PredictedRow]]:
    out = []
    for s in PUBLISHED["sweeps"]:
        rows = predict(_inputs(s), sorted(s["gbps"]))
        out += [(s["name"], r.streams, s["gbps"][r.streams] * 1e9, r) for r in rows]
    return out


@pytest.mark.parametrize(
    ("name", "streams", "measured", "row"), _sweep_rows(), ids=lambda v: v if isinstance(v, str | int) else ""
)
def test_each_published_figure_lies_between_the_predicted_floor_and_peak(
    name: str, streams: int, measured: float, row: PredictedRow
) -> None:
    assert row.floor * (1 - WITHIN) <= measured <= row.peak, (name, streams, row.floor, row.peak)


def test_each_published_rows_error_is_the_one_stated() -> None:
    errors = {(name, streams): measured / row.peak - 1 for name, streams, measured, row in _sweep_rows()}
    assert errors.keys() == ROW_ERRORS.keys()
    for key, error in errors.items():
        assert error == pytest.approx(ROW_ERRORS[key], abs=0.0006), key


def test_rows_bound_by_a_ceiling_are_predicted_within_10_percent() -> None:
    checked = 0
    for name, streams, measured, row in _sweep_rows():
        if row.expected.ceiling_limit in BOUNDS:
            assert abs(row.peak - measured) <= WITHIN * measured, (name, streams, row.peak, measured)
            checked += 1
    assert checked >= 8  # the default-buffer 1, 4, 8 streams, the tuned single flows, the 1-vCPU receivers


def test_the_published_rows_are_bound_by_what_the_articles_say() -> None:
    limits = {(n, s): r.expected.ceiling_limit for n, s, _, r in _sweep_rows()}
    assert limits["c6gn.12xlarge, default buffers", 1] == "receive_window"  # ~3 Gbps: half of 6 MiB
    assert limits["c6gn.12xlarge, tuned buffers", 1] == "per_flow"  # 4.75: just under 5 Gbps
    assert limits["c6gn.12xlarge, default buffers", 64] == "instance"  # 71 of 75 Gbps
    assert (
        limits["c6gn.medium, tuned buffers", 4] == "receiver_cpu"
    )  # 11.7 at 94% of its one vCPU, not its 16 Gbps peak
    assert limits["c6gn.medium, tuned buffers", 8] == "receiver_cpu"
    floors = {(n, s): r.expected.limit for n, s, _, r in _sweep_rows()}
    assert floors["c6gn.12xlarge, default buffers", 32] == "region_cap"  # 37.5, measured above
    assert floors["c6gn.medium, tuned buffers", 4] == "instance"  # the 1.6 Gbps baseline


def test_the_window_law_rate_falls_as_one_over_rtt() -> None:
    """One flow's rate x RTT is its window: from the 10 ms row's window, the model
    predicts the 1 ms and 100 ms rows within 10%."""
    law = PUBLISHED["window_law"]
    by_rtt = {ms / 1e3: g * 1e9 for ms, g in law["gbps_by_rtt_ms"].items()}
    window = by_rtt[0.010] * 0.010 / 8  # bytes in flight at 10 ms
    for rtt, measured in by_rtt.items():
        inputs = _inputs({**law, "rmem_max": int(window / 0.5), "wmem_max": 2**30}, rtt)
        (row,) = predict(inputs, [1])
        assert row.expected.ceiling_limit == "receive_window"
        assert abs(row.peak - measured) <= WITHIN * measured, (rtt, row.peak, measured)


def test_the_window_law_from_the_kernel_defaults_is_a_ceiling_within_15_percent() -> None:
    """With RHEL 8's default buffers (the article states none): each row at most the
    predicted window bound, and within 15%, not 10: the buffers are assumed."""
    law = PUBLISHED["window_law"]
    for ms, gbps in law["gbps_by_rtt_ms"].items():
        (row,) = predict(_inputs(law, ms / 1e3), [1])
        assert row.expected.ceiling_limit == "receive_window"
        assert gbps * 1e9 <= row.peak <= 1.15 * gbps * 1e9, (ms, row.peak)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["capacity", "--predict", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_json_rows(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys,
        "--from",
        "c6gn.medium",
        "--to",
        "c6gn.medium",
        "--rtt",
        "8ms",
        "--streams",
        "1,4",
        "--rmem-max",
        "1GiB",
        "--wmem-max",
        "1GiB",
        "--json",
    )
    assert code == 0
    doc = json.loads(out)
    one, four = doc["rows"]
    assert {"streams", "floor_bits_per_second", "peak_bits_per_second", "binding_limit"} <= one.keys()
    assert (one["floor_bits_per_second"], one["binding_limit"]) == (1.6e9, "instance")
    assert (one["peak_bits_per_second"], one["peak_binding_limit"]) == (5e9, "per_flow")
    # Four streams' peak: the one arm64 vCPU of the receiver (12.4 Gbit/s), not its 16 Gbit/s peak.
    assert (four["peak_bits_per_second"], four["peak_binding_limit"]) == (12.4e9, "receiver_cpu")
    assert four["floor_candidates"]["receiver_cpu"] == 12.4e9 and doc["iperf3_version"] == "3.16"
    # 40 TB (the default) at the 1.6 Gbit/s baseline, and at the vCPU's 12.4 Gbit/s at best
    assert four["transfer"]["seconds"] == pytest.approx(40e12 * 8 / 1.6e9)
    assert four["transfer"]["peak_seconds"] == pytest.approx(40e12 * 8 / 12.4e9)
    assert four["transfer"]["cost"] == pytest.approx(800)
    assert doc["window_share"] == 0.5  # the default kernel family: before 6.6


def test_one_iperf3_thread_before_3_16_is_a_receivers_limit_more_processes_lift(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        "--from",
        "c6gn.12xlarge",
        "--to",
        "c6gn.12xlarge",
        "--rtt",
        "8ms",
        "--path-class",
        "inter_region",
        "--streams",
        "32",
        "--json",
    ]
    peaks = {}
    for extra in ([], ["--iperf3-version", "3.12"], ["--iperf3-version", "3.12", "--processes", "4"]):
        code, out, _ = _run(capsys, *args, *extra)
        assert code == 0
        row = json.loads(out)["rows"][0]
        peaks[" ".join(extra)] = (row["peak_bits_per_second"], row["peak_binding_limit"])
    assert peaks[""] == (75e9, "instance")  # 32 threads of 48 vCPUs carry more than the instance
    assert peaks["--iperf3-version 3.12"] == (12.4e9, "receiver_cpu")  # one thread: one vCPU
    assert peaks["--iperf3-version 3.12 --processes 4"] == (pytest.approx(49.6e9), "receiver_cpu")
    # x86_64: no published figure, so no CPU limit is guessed.
    code, out, _ = _run(
        capsys,
        "--from",
        "m6i.metal",
        "--to",
        "m6i.metal",
        "--rtt",
        "1ms",
        "--streams",
        "32",
        "--iperf3-version",
        "3.12",
        "--json",
    )
    assert code == 0 and "receiver_cpu" not in json.loads(out)["rows"][0]["floor_candidates"]
    code, _, err = _run(capsys, *args, "--iperf3-version", "three")
    assert code == 2 and "--iperf3-version" in err


def test_predict_text_and_the_kernel_family(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys,
        "--from",
        "c6gn.12xlarge",
        "--to",
        "c6gn.12xlarge",
        "--rtt",
        "8ms",
        "--kernel",
        "6.8.0-1015-aws",
        "--streams",
        "1",
    )
    assert code == 0
    assert "(0.78 advertised)" in out
    assert "send_buffer" in out  # 0.78 of both: the smaller tcp_wmem max binds


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--from", "c6gn.huge", "--to", "c6gn.medium", "--rtt", "8ms"], "--from 'c6gn.huge'"),
        (["--from", "c6gn.medium", "--to", "nope", "--rtt", "8ms"], "--to 'nope'"),
        (["--from", "c6gn.medium", "--to", "c6gn.medium", "--rtt", "8 parsecs"], "--rtt"),
        (["--from", "c6gn.medium", "--to", "c6gn.medium", "--rtt", "0ms"], "--rtt"),
        (["--from", "c6gn.medium", "--to", "c6gn.medium"], "--rtt"),
        (["--from", "c6gn.medium", "--to", "c6gn.medium", "--rtt", "8ms", "--window-share", "2"], "--window-share"),
        (["--from", "c6gn.medium", "--to", "c6gn.medium", "--rtt", "8ms", "--kernel", "new"], "--kernel"),
        (["--from", "c6gn.medium", "--to", "c6gn.medium", "--rtt", "8ms", "--rmem-max", "lots"], "--rmem-max"),
        (["--from", "c6gn.medium", "--to", "c6gn.medium", "--rtt", "8ms", "--streams", "0"], "--streams"),
    ],
)
def test_bad_input_exits_2_naming_the_option(capsys: pytest.CaptureFixture[str], argv: list[str], names: str) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert names in err
    assert out == ""


def test_a_measured_review_beside_its_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    code, out, _ = _run(
        capsys, "--from", "c6gn.12xlarge", "--to", "c6gn.12xlarge", "--rtt", "8ms", "--streams", "1,64", "--json"
    )
    assert code == 0
    plan_file.write_text(out)
    plan = read_plan(plan_file)
    # the published sweep as if measured after the migration: 4 is not in the plan, 64 failed
    beside = against_plan({1: 2.95e9, 4: 12.2e9, 64: None}, plan)
    assert [r["streams"] for r in beside] == [1, 64]
    assert beside[0]["measured_over_planned_peak"] == pytest.approx(2.95e9 / 3.1457e9, rel=1e-3)
    assert beside[0]["planned_binding_limit"] == "receive_window"
    assert beside[1]["measured_over_planned_floor"] is None
    text = against_plan_text(beside)
    assert "94%" in text
    assert "failed" in text


def test_a_plan_that_is_not_a_prediction_exits_2_naming_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"rows": [{"streams": 1}]}')
    assert main(["capacity", "192.0.2.1", "--plan", str(bad)]) == 2
    assert "--plan" in capsys.readouterr().err
