"""What a path does to a packet, per direction, in the lab. One-way delays: the hosts share one
kernel clock (offset zero, a bound of 1 us stated), so the exporters' forward and reverse
delays can be held against the delay line's: an asymmetric path (30 ms out, 44 ms back) reads
within 0.2 ms each way, and 10 ms added live to one direction moves that direction only. DSCP:
the echoes leave marked EF (46); a router rule that bleaches marks from east to west is seen
by east's probes on the way out and by west's on the way back, and nowhere else. A clock off:
a third host's exporter runs with its wall clock SKEW ahead (libfaketime) and states the lab's
bound of 1 us; its peers flag its one-way delays as clocks that disagree instead of reading them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import (
    Samples,
    clear_router_nft,
    clock_ahead,
    router_nft,
    scrape,
    start_exporter,
    topology,
    value,
    wait_for,
)
from pathprobe_lab import net, shaping
from pathprobe_lab.configs import METRICS_PORT, exporter_config
from pathprobe_lab.state import State
from pathprobe_lab.topology import PathSpec, address

pytestmark = pytest.mark.lab

TOPO = topology("""
hosts:
  - {name: east, region: ap-northeast-1, zone: ap-northeast-1a}
  - {name: west, region: ap-southeast-1, zone: ap-southeast-1a}
  - {name: skewed, region: ap-northeast-3, zone: ap-northeast-3a}
paths:
  - {between: [east, west], one_way_delay: 30ms}
  - {between: [east, skewed], one_way_delay: 4ms}
  - {between: [west, skewed], one_way_delay: 34ms}
""")
OUT, BACK, ADDED = 0.030, 0.044, 0.010
EF = 46
WINDOW = 20  # the exporters' quantile window: a live change moves the median within 10 s
TOLERANCE = 0.0002
SKEW = 2.5  # skewed's wall clock ahead, seconds: far beyond the delays it could hide in


def set_delay(src: str, dst: str, seconds: float) -> None:
    state = State.load()
    assert state is not None
    spec = state.spec(src, dst)
    shaping.set_path(state, src, dst, PathSpec(spec.rate, seconds, spec.loss, spec.path_class))


@pytest.fixture(scope="module")
def east(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """east's metrics address, with east and west probing each other (no throughput tests)."""
    work: Path = tmp_path_factory.mktemp("owd")
    net.up(TOPO)
    set_delay("west", "east", BACK)
    for h in TOPO.hosts:
        cfg = exporter_config(
            TOPO,
            h.name,
            work,
            20,
            {"throughput": {"enabled": False}, "rtt": {"quantile_window_seconds": WINDOW}, "loss": {"dscp": EF}},
        )
        start_exporter(h.name, cfg, work, clock_ahead(SKEW) if h.name == "skewed" else ())
    yield f"{address(1)}:{METRICS_PORT}"
    net.down()


def medians(metrics: str) -> tuple[float, float] | None:
    """east's idle forward and reverse one-way delay medians to west, once trusted."""
    s = scrape(metrics)
    if value(s, "pathprobe_owd_trusted", peer="west") != 1:
        return None
    found = [
        value(s, "pathprobe_owd_seconds", peer="west", direction=d, state="idle", quantile="0.5")
        for d in ("forward", "reverse")
    ]
    return (found[0], found[1]) if found[0] is not None and found[1] is not None else None


def test_an_asymmetric_path_reads_each_way_and_a_live_change_moves_one(east: str) -> None:
    forward, reverse = wait_for("both directions' delays", lambda: medians(east), timeout=60)
    assert forward == pytest.approx(OUT, abs=TOLERANCE) and reverse == pytest.approx(BACK, abs=TOLERANCE)
    s = scrape(east)
    assert value(s, "pathprobe_owd_error_bound_seconds", peer="west") == pytest.approx(2e-6)
    set_delay("east", "west", OUT + ADDED)

    def moved() -> tuple[float, float] | None:
        got = medians(east)
        return got if got and got[0] == pytest.approx(OUT + ADDED, abs=TOLERANCE) else None

    forward, reverse = wait_for("the forward delay to move", moved, timeout=60)
    assert reverse == pytest.approx(BACK, abs=TOLERANCE)


def changed(metrics: str, direction: str) -> float:
    return value(scrape(metrics), "pathprobe_dscp_changed_total", direction=direction) or 0.0


def test_a_router_that_bleaches_marks_one_way_is_seen_that_way_only(east: str) -> None:
    west = f"{address(2)}:{METRICS_PORT}"
    s = scrape(east)
    for direction in ("forward", "reverse"):
        assert value(s, "pathprobe_dscp_received_info", peer="west", direction=direction, sent="46", received="46") == 1
    assert changed(east, "forward") == changed(east, "reverse") == changed(west, "forward") == 0
    rule = (
        f"table inet bleach {{\n chain marks {{\n type filter hook forward priority 0\n"
        f" ip saddr {address(1)} ip daddr {address(2)} ip dscp set cs0\n }}\n}}\n"
    )
    router_nft(rule)
    try:
        # east's echoes reach west as CS0 (its answers, sent with that, come back as CS0: unchanged);
        # west's echoes arrive marked, and its answers from east are bleached on their way back.
        wait_for("east's echoes seen bleached", lambda: changed(east, "forward") > 0, timeout=30)
        wait_for("west's answers seen bleached", lambda: changed(west, "reverse") > 0, timeout=30)
        s = scrape(east)
        assert value(s, "pathprobe_dscp_received_info", peer="west", direction="forward", sent="46", received="0") == 1
    finally:
        clear_router_nft("bleach")
    assert changed(east, "reverse") == 0 and changed(west, "forward") == 0


def test_a_clock_off_by_more_than_its_stated_bound_is_flagged_not_read_as_delay(east: str) -> None:
    def flagged() -> Samples | None:
        s = scrape(east)
        return s if value(s, "pathprobe_owd_untrusted_info", peer="skewed", reason="clocks_disagree") == 1 else None

    s = wait_for("skewed's clock flagged", flagged, timeout=60)
    assert value(s, "pathprobe_clock_offset_seconds", peer="skewed") == pytest.approx(SKEW, abs=0.05)
    assert value(s, "pathprobe_owd_trusted", peer="skewed") == 0
    assert value(s, "pathprobe_owd_seconds_count", peer="skewed") is None  # no delay read
    assert value(s, "pathprobe_owd_trusted", peer="west") == 1  # the pair whose clocks agree still is
    # and skewed sees east's clock as far behind its own
    skewed = scrape(f"{address(3)}:{METRICS_PORT}")
    assert value(skewed, "pathprobe_clock_offset_seconds", peer="east") == pytest.approx(-SKEW, abs=0.05)
    assert value(skewed, "pathprobe_owd_untrusted_info", peer="east", reason="clocks_disagree") == 1
