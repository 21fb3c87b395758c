"""The rooms (metrics/): what /metrics shows for what the probes recorded."""

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from virtual_time import VirtualTime

from pathprobe import turns
from pathprobe.config import Config
from pathprobe.exporter import Exporter, schedule_of
from pathprobe.keys import TestKey
from pathprobe.metrics import registry
from pathprobe.metrics.owd import OwdKey
from pathprobe.metrics.throughput import TestRecorder
from pathprobe.probe_settings import TestSpec as Spec
from pathprobe.probes import Reason, Target, ThroughputResult, ThroughputTest
from pathprobe.probes.echo import OneWay
from pathprobe.probes.pacer import Pacer
from pathprobe.probes.report import Summary


def config(tmp_path: Path, **extra: object) -> Config:
    return Config.model_validate(
        {
            "host": {"name": "a", "address": "198.18.1.2", "region": "r1"},
            "peers": [
                {"name": "b", "address": "198.18.2.2", "region": "r2", "path_class": "inter_region"},
                {"name": "c", "address": "198.18.3.2", "region": "r1", "path_class": "intra_region"},
            ],
            "budget": {"state_file": str(tmp_path / "budget.json")},
            "tcp_rmem_max_bytes": 6291456,
            "tcp_wmem_max_bytes": 4194304,
            "tcp_window_share": 0.5,
            **extra,
        }
    )


def samples(exporter: Exporter) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry(exporter.rooms)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    matches = [v for (n, ls), v in got.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(matches) == 1, f"{name} {labels}: {len(matches)} series"
    return matches[0]


def result(rtt: float | None = None) -> ThroughputResult:
    return ThroughputResult(
        "tcp",
        1,
        "send",
        5,
        1,
        None,
        None,
        50e6,
        51e6,
        250 * 10**6,
        retransmits=7,
        sender_rtt_seconds=rtt,
        timestamp=1000.0,
    )


def test_a_kind_turned_off_has_no_outcome_series_until_it_runs(tmp_path: Path) -> None:
    cfg = config(tmp_path, probes={"mtu": {"enabled": False}, "throughput": {"enabled": False}})
    e = Exporter(cfg)
    got = samples(e)
    probes = {dict(ls)["probe"] for n, ls in got if n == "pathprobe_probe_runs_total"}
    assert probes == {"rtt", "loss"}  # the enabled kinds, every outcome from zero
    assert value(got, "pathprobe_probe_runs_total", probe="loss", peer="b", result="timeout") == 0
    e.rooms.outcomes.failure("mtu", "b", "timeout")  # e.g. a run that ended as a reload turned it off
    got = samples(e)
    assert value(got, "pathprobe_probe_runs_total", probe="mtu", peer="b", result="timeout") == 1
    assert not [
        ls for n, ls in got if n == "pathprobe_probe_runs_total" and ("result", "ok") in ls and ("probe", "mtu") in ls
    ]


def test_every_outcome_starts_at_zero_and_no_created_series(tmp_path: Path) -> None:
    got = samples(Exporter(config(tmp_path)))
    assert value(got, "pathprobe_probe_runs_total", probe="rtt", peer="b", result="timeout") == 0
    assert value(got, "pathprobe_udp_packets_lost_total", peer="c", state="idle") == 0
    assert value(got, "pathprobe_udp_packets_lost_total", peer="c", state="loaded") == 0
    assert not [n for n, _ in got if n.endswith("_created")]
    assert value(got, "pathprobe_schedule_members") == 3
    # Before any test, the expected value has no RTT: the inter-region per-flow limit binds.
    assert value(got, "pathprobe_throughput_expected_bytes_per_second", peer="b", streams="1", limit="per_flow") > 0


def test_probe_outcomes_reach_metrics_with_the_injected_clock(tmp_path: Path) -> None:
    e = Exporter(config(tmp_path), clock=lambda: 1234.5)
    rtt = e.recorder("rtt", "b")
    for seconds in (0.0071, 0.0072, 0.009):
        rtt.rtt(seconds)
    rtt.failure("refused")
    echo = e.recorder("loss", "c")
    echo.sent(64)
    echo.received(0.0004)
    echo.lost(0.0)
    got = samples(e)
    assert value(got, "pathprobe_rtt_seconds_count", peer="b", protocol="tcp", state="idle") == 3
    raw = Summary.of([0.0071, 0.0072, 0.009])  # the one-shot probe's own quantiles
    assert raw is not None
    for q, want in (("0.5", raw.p50), ("0.99", raw.p99)):
        assert value(got, "pathprobe_rtt_seconds", peer="b", protocol="tcp", quantile=q) == pytest.approx(
            want, rel=0.003
        )
    assert value(got, "pathprobe_rtt_seconds_sum", peer="b", protocol="tcp") == 0.0071 + 0.0072 + 0.009
    assert value(got, "pathprobe_probe_runs_total", probe="rtt", peer="b", result="refused") == 1
    assert value(got, "pathprobe_probe_last_success_timestamp_seconds", probe="rtt", peer="b") == 1234.5
    assert value(got, "pathprobe_probe_bytes_sent_total", probe="rtt", peer="b") == 3 * e.cfg.probes.rtt.size_bytes
    assert value(got, "pathprobe_udp_packets_lost_total", peer="c", state="idle") == 1
    assert value(got, "pathprobe_probe_runs_total", probe="loss", peer="c", result="timeout") == 1
    # While a throughput test of this host or the peer may run, loss is counted apart.
    e.load.of = lambda peer, now: "loaded"
    echo.sent(64)
    echo.lost(0.0)
    got = samples(e)
    assert value(got, "pathprobe_udp_packets_lost_total", peer="c", state="idle") == 1
    assert value(got, "pathprobe_udp_packets_lost_total", peer="c", state="loaded") == 1
    assert value(got, "pathprobe_udp_packets_sent_total", peer="c", state="loaded") == 1


def test_a_followed_up_sample_counts_as_idle_or_loaded_by_when_it_was_taken(tmp_path: Path) -> None:
    """A two-step responder's follow-up comes with the next answer (seconds later): the sample it
    completes is recorded then, under the time it was taken, before a test that started since."""
    e = Exporter(config(tmp_path), clock=lambda: 1000.0)
    e.load.of = lambda peer, now: "loaded" if now >= 995.0 else "idle"  # a test from 995 on
    e.recorder("rtt", "b").rtt(0.007, age=8.0)
    echo = e.recorder("loss", "c")
    echo.received(0.0004, age=8.0, one_way=OneWay(0.0002, 0.0002, None, 0.0))
    echo.received(0.0005, one_way=OneWay(0.0002, 0.0003, None, 0.0))
    got = samples(e)
    assert value(got, "pathprobe_rtt_seconds_count", peer="b", protocol="tcp", state="idle") == 1
    for state, reverse in (("idle", 0.0002), ("loaded", 0.0003)):  # an echo's RTT and delays in one state
        assert value(got, "pathprobe_udp_packets_received_total", peer="c", state=state) == 1
        assert value(got, "pathprobe_rtt_seconds_count", peer="c", protocol="udp", state=state) == 1
        assert e.rooms.owd.windows[OwdKey("c", "reverse", state)].total == reverse


def test_loaded_packets_of_a_peer_without_tests_are_exported(tmp_path: Path) -> None:
    # c is never tested, but this host's tests with b load c's packets too: they must show.
    cfg = config(tmp_path).model_dump(mode="json")
    cfg["peers"][1]["throughput"] = {"enabled": False}
    e = Exporter(Config.model_validate(cfg))
    e.load.of = lambda peer, now: "loaded"
    echo = e.recorder("loss", "c")
    echo.sent(64)
    echo.received(0.0004)
    got = samples(e)
    assert value(got, "pathprobe_udp_packets_sent_total", peer="c", state="loaded") == 1
    assert value(got, "pathprobe_udp_packets_received_total", peer="c", state="loaded") == 1
    assert value(got, "pathprobe_udp_packets_sent_total", peer="c", state="idle") == 0


def test_a_result_is_rated_with_an_rtt_from_its_own_time(tmp_path: Path) -> None:
    e = Exporter(config(tmp_path))
    peer = e.cfg.peers[0]
    e.tracker.rate(peer, ("tcp", "1", "send"), result(rtt=0.074))  # no RTT window yet: the test's RTT
    e.rooms.throughput.record(TestKey("b", "tcp", "1", "send"), result(rtt=0.074))
    got = samples(e)
    expected = value(got, "pathprobe_throughput_expected_bytes_per_second", peer="b", streams="1")
    # The send buffer (4 MiB x 0.5 / 74 ms) binds, not the 5 Gbps per-flow limit.
    assert expected == 4194304 * 0.5 / 0.074
    assert (
        value(got, "pathprobe_throughput_expected_bytes_per_second", peer="b", streams="1", limit="send_buffer")
        == expected
    )
    assert value(got, "pathprobe_throughput_bytes_per_second", peer="b", streams="1") == 50e6
    assert value(got, "pathprobe_probe_bytes_sent_total", probe="throughput", peer="b") == 300 * 10**6


def test_the_rate_of_the_test_before_the_last_shows_from_the_second_result_and_goes_with_its_peer(
    tmp_path: Path,
) -> None:
    e = Exporter(config(tmp_path))
    throughput, key = e.rooms.throughput, TestKey("b", "tcp", "1", "send")
    throughput.record(key, result())
    assert not [n for n, _ in samples(e) if n == "pathprobe_throughput_previous_bytes_per_second"]
    throughput.record(key, dataclasses.replace(result(), receiver_bytes_per_second=20e6))
    got = samples(e)
    assert value(got, "pathprobe_throughput_previous_bytes_per_second", peer="b", streams="1") == 50e6
    assert value(got, "pathprobe_throughput_bytes_per_second", peer="b", streams="1") == 20e6
    cfg = e.cfg.model_dump(mode="json")
    cfg["peers"] = cfg["peers"][1:]
    e.reload(Config.model_validate(cfg))
    assert key not in throughput.previous


class StandInRun:
    def __init__(
        self, outcome: Callable[[ThroughputTest], ThroughputResult | Reason], test: ThroughputTest, sink: TestRecorder
    ):
        self.outcome, self.test, self.sink = outcome, test, sink

    async def run(self) -> ThroughputResult | Reason:
        outcome = self.outcome(self.test)
        if isinstance(outcome, ThroughputResult):
            self.sink.result(outcome)
        else:
            self.sink.failure(outcome, "stand-in")
        return outcome


class StandIn:
    """Stands in for iperf3 (the throughput prober's shape): `outcome(test)` gives each test's
    result, raises, or names the reason it failed."""

    def __init__(self, outcome: Callable[[ThroughputTest], ThroughputResult | Reason]):
        self.outcome = outcome

    def __call__(self, target: Target, test: ThroughputTest, sink: TestRecorder) -> StandInRun:
        return StandInRun(self.outcome, test, sink)


class FailingProber:
    """Raises what a broken binary or output once made escape the loop, or fails."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, test: ThroughputTest) -> Reason:
        self.calls += 1
        if self.calls % 2:
            raise OverflowError("int too large to convert to float")
        return "error"


def run_turns_until(e: Exporter, virtual: VirtualTime, done: Callable[[], bool]) -> None:
    """Run the exporter's throughput turns in the virtual time it was given until `done()`."""

    async def scenario() -> None:
        task = asyncio.create_task(e.turns.run(asyncio.Event()))
        await virtual.drive([task], done)
        task.cancel()

    asyncio.run(scenario())


def test_the_throughput_loop_survives_unexpected_errors(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        schedule={"slot_seconds": 4, "jitter_seconds": 0, "timeout_margin_seconds": 1},
        probes={"throughput": {"streams": [1], "duration_seconds": 0.5, "omit_seconds": 0}},
    )
    virtual = VirtualTime()
    e = Exporter(cfg, clock=virtual.time, sleep=virtual.sleep)
    prober = FailingProber()
    e.turns.make_prober = StandIn(prober)

    run_turns_until(e, virtual, lambda: prober.calls >= 2)  # the second call comes from a turn after the first error
    assert e.rooms.host.turn_errors["OverflowError"] >= 1
    assert e.rooms.outcomes.runs["throughput", "b", "error"] + e.rooms.outcomes.runs["throughput", "c", "error"] >= 1


@pytest.mark.parametrize("step", [-3600.0, -1.5, 3600.0])
def test_a_stepped_clock_costs_at_most_a_few_seconds_of_turns(tmp_path: Path, step: float) -> None:
    # NTP steps the wall clock; the schedule follows it. Back an hour: turns go on from the new
    # time (not after an hour's wait); back 1.5 s: the turn just taken is not taken again.
    cfg = config(
        tmp_path,
        schedule={"slot_seconds": 4, "jitter_seconds": 0, "timeout_margin_seconds": 1},
        probes={"throughput": {"streams": [1], "duration_seconds": 0.2, "omit_seconds": 0}},
    )
    virtual, offset = VirtualTime(), [0.0]
    e = Exporter(cfg, clock=lambda: virtual.time() + offset[0], sleep=virtual.sleep)
    slots: list[int] = []
    taken_at: list[float] = []  # when each test ran, by the unstepped clock

    def recording(test: ThroughputTest) -> ThroughputResult:
        slots.append(int(e.turns.clock() // 4))
        taken_at.append(virtual.time())
        if len(slots) == 1:
            offset[0] += step  # while the test runs
        return result()

    e.turns.make_prober = StandIn(recording)

    run_turns_until(e, virtual, lambda: len(slots) >= 2)
    assert slots[1] != slots[0]  # never the same turn twice
    # 3 hosts: a has a turn in 2 of every 3 slots of 4 s, so from wherever the schedule is taken
    # again its next turn starts within 2 slots; a clock stepped back 1.5 s first waits those out
    # (the turn just taken ends). Not the hour a wait for the stepped time would cost.
    assert taken_at[1] - taken_at[0] <= 2 * 4 + 1.5


def test_a_turns_test_is_to_be_killed_by_its_turns_end(tmp_path: Path) -> None:
    """The turn hands its test the monotonic time its processes must be gone by: the turn's end, by
    the exporter's clock, less the guard that lets the next half's test start clean."""
    cfg = config(
        tmp_path,
        schedule={"slot_seconds": 60, "jitter_seconds": 5, "timeout_margin_seconds": 1},
        probes={"throughput": {"streams": [1], "duration_seconds": 0.2, "omit_seconds": 0}},
    )
    virtual = VirtualTime()
    e = Exporter(cfg, clock=virtual.time, sleep=virtual.sleep)
    left: list[tuple[float, float]] = []  # (kill_at - now, the turn's end - guard - now), per test

    def recording(test: ThroughputTest) -> ThroughputResult:
        assert test.kill_at is not None
        now = e.turns.clock()
        turn = e.turns.timetable.next_turn("a", now)
        assert turn is not None and turn.start <= now < turn.end
        left.append((test.kill_at - time.monotonic(), turn.end - turns.TURN_END_GUARD_SECONDS - now))
        return result()

    e.turns.make_prober = StandIn(recording)
    run_turns_until(e, virtual, lambda: len(left) >= 2)
    for kill_in, turn_left in left:
        assert kill_in == pytest.approx(turn_left, abs=0.5)  # the real time between the two reads
        assert 0 < turn_left < 30  # within the half: the jitter is 5 s at most


@pytest.mark.parametrize("step", [-3600.0, 3600.0])
def test_a_clock_stepped_during_a_wait_for_a_turn_is_read_at_the_next_check(tmp_path: Path, step: float) -> None:
    # The step comes while the loop waits for its next turn (60 s slots: a wait of up to two).
    # Back an hour: the wait ends at its next read of the clock (CLOCK_CHECK_SECONDS), and the
    # schedule goes on from the new time; a wait for the old time would last an hour more.
    # Forward an hour: the wait ends at its next read too, and no test runs outside a turn of a's.
    slot = 60
    cfg = config(
        tmp_path,
        schedule={"slot_seconds": slot, "jitter_seconds": 0, "timeout_margin_seconds": 1},
        probes={"throughput": {"streams": [1], "duration_seconds": 0.2, "omit_seconds": 0}},
    )
    virtual, offset = VirtualTime(), [0.0]

    async def stepping_sleep(seconds: float) -> None:
        await virtual.sleep(seconds)
        if len(taken_at) == 1 and not offset[0]:  # the first wait after the first test
            offset[0] = step

    e = Exporter(cfg, clock=lambda: virtual.time() + offset[0], sleep=stepping_sleep)
    taken_at: list[float] = []  # when each test ran, by the unstepped clock
    in_turn: list[bool] = []  # whether the (stepped) clock was then inside a turn of a's

    def recording(test: ThroughputTest) -> ThroughputResult:
        taken_at.append(virtual.time())
        now = e.turns.clock()
        turn = e.turns.timetable.next_turn("a", now)
        in_turn.append(turn is not None and turn.start <= now < turn.end)
        return result()

    e.turns.make_prober = StandIn(recording)

    run_turns_until(e, virtual, lambda: len(taken_at) >= 2)
    assert in_turn == [True, True]
    # From wherever the schedule is taken again, a's next turn starts within 2 slots (3 hosts: a
    # has a turn in 2 of every 3); the step is read at most one clock check after it came.
    assert taken_at[1] - taken_at[0] <= 2 * slot + turns.CLOCK_CHECK_SECONDS


def test_quantiles_cover_a_sliding_window_and_keep_loaded_samples_apart(tmp_path: Path) -> None:
    now = [10_000.0]
    e = Exporter(config(tmp_path), clock=lambda: now[0])
    e.load.of = lambda peer, t: "loaded" if 10_100 <= t < 10_110 else "idle"
    sink = e.recorder("rtt", "b")
    for i in range(100):  # 100 s of 74-75 ms, then 10 s of 300 ms behind a test's queue
        now[0] = 10_000 + i
        sink.rtt(0.074 + i * 1e-5)
    for i in range(10):
        now[0] = 10_100 + i
        sink.rtt(0.300)
    now[0] = 10_110
    got = samples(e)
    idle_p99 = value(got, "pathprobe_rtt_seconds", peer="b", state="idle", quantile="0.99")
    assert idle_p99 == pytest.approx(0.074 + 98e-5, rel=0.003)
    assert value(got, "pathprobe_rtt_seconds", peer="b", state="loaded", quantile="0.5") == pytest.approx(
        0.3, rel=0.003
    )
    now[0] = 10_000 + 400  # the idle samples have left the 300 s window; the counts stay
    got = samples(e)
    assert not [k for k in got if k[0] == "pathprobe_rtt_seconds" and ("state", "idle") in k[1]]
    assert value(got, "pathprobe_rtt_seconds_count", peer="b", state="idle") == 100


def test_the_quantile_window_is_a_setting_and_a_reload_that_changes_it_starts_it_over(tmp_path: Path) -> None:
    now = [10_000.0]
    e = Exporter(config(tmp_path, probes={"rtt": {"quantile_window_seconds": 60}}), clock=lambda: now[0])
    e.load.of = lambda peer, t: "idle"
    sink = e.recorder("rtt", "b")

    def idle_p50() -> float | None:
        got = samples(e)
        key = [k for k in got if k[0] == "pathprobe_rtt_seconds" and ("quantile", "0.5") in k[1]]
        return got[key[0]] if key else None

    for i in range(60):  # a minute of 10 ms, then a minute of 30 ms
        now[0] = 10_000 + i
        sink.rtt(0.010)
    for i in range(60):
        now[0] = 10_060 + i
        sink.rtt(0.030)
    assert idle_p50() == pytest.approx(0.030, rel=0.003)  # 60 s back: the 30 ms minute only (300 s: 10-30 ms)
    assert "over the last 60 s" in generate_latest(registry(e.rooms)).decode()
    e.reload(config(tmp_path, probes={"rtt": {"quantile_window_seconds": 300}}))
    assert idle_p50() is None  # samples of the old window are not passed off as the new one's
    sink = e.recorder("rtt", "b")
    sink.rtt(0.020)
    assert idle_p50() == pytest.approx(0.020, rel=0.003)
    assert value(samples(e), "pathprobe_rtt_seconds_count", peer="b", state="idle") == 121


@pytest.mark.parametrize("admit", ["turn", "peers", "anyone"])
def test_iperf3_admits_a_peer_in_its_turn_and_counts_every_outcome(tmp_path: Path, admit: str) -> None:
    now = [0.0]
    cfg = config(tmp_path, iperf3={"admit": admit}, responders={"allow": ["203.0.113.0/24"]})
    e = Exporter(cfg, clock=lambda: now[0])
    slot = 1000
    while e.schedule.partner("a", slot) != "b":
        slot += 1
    b_turn = e.schedule.turn("b", slot)
    a_turn = e.schedule.turn("a", slot)
    assert b_turn is not None and a_turn is not None
    now[0] = b_turn.start + 1
    assert e.iperf3_admission("198.18.2.2") == "ok"  # b, in its turn against a
    assert e.iperf3_admission("::ffff:198.18.2.2") == "ok"  # the same, as a dual-stack socket shows it
    assert e.iperf3_admission("198.18.3.2") == ("ok" if admit == "peers" else "out_of_turn")  # c: not its turn
    assert e.iperf3_admission("192.0.2.7") == "not_allowed"  # a stranger
    assert e.iperf3_admission("203.0.113.9") == "ok"  # responders.allow: any time
    with e.turns._in_test("c", Spec("tcp", "1", "send")):  # a's own test runs (its clock is behind b's)
        assert e.iperf3_admission("198.18.2.2") == ("ok" if admit == "peers" else "out_of_turn")
        assert e.iperf3_admission("203.0.113.9") == "ok"
    assert e.iperf3_admission("198.18.2.2") == "ok"
    now[0] = a_turn.start + 1  # a is the client now: nobody may test it
    assert e.iperf3_admission("198.18.2.2") == ("ok" if admit == "peers" else "out_of_turn")
    got = samples(e)
    assert value(got, "pathprobe_iperf3_admission_info", admit=admit) == 1
    requests = {
        dict(ls)["result"]: v
        for (n, ls), v in got.items()
        if n == "pathprobe_responder_requests_total" and dict(ls)["responder"] == "iperf3"
    }
    assert requests == ({} if admit == "anyone" else {"ok": 0, "not_allowed": 0, "out_of_turn": 0})


def test_rtt_samples_are_loaded_while_a_test_may_run_and_idle_after(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        schedule={"slot_seconds": 30, "jitter_seconds": 1, "timeout_margin_seconds": 3},
        probes={"throughput": {"streams": [1, 4], "duration_seconds": 3, "omit_seconds": 1}},
    )
    e = Exporter(cfg)
    slot = 30 * 1000  # a slot in which host a has a partner (3 hosts: one sits out each slot)
    while e.schedule.partner("a", slot // 30) is None:
        slot += 30
    # The half's tests run 1 s of jitter + 2 x (1 + 3) s: loaded for 9 s, then idle.
    assert e.load.of("b", slot + 5) == "loaded"
    assert e.load.of("b", slot + 15 + 5) == "loaded"  # the other half: the partner's turn
    partner = e.schedule.partner("a", slot // 30)
    other = ({"b", "c"} - {partner}).pop()  # sits out this slot: only a's own turns make it loaded
    assert e.load.of(other, slot + 12) == "idle"


def test_an_own_test_that_runs_past_the_window_keeps_samples_loaded(tmp_path: Path) -> None:
    from pathprobe.load import DRAIN_SECONDS

    cfg = config(
        tmp_path,
        schedule={"slot_seconds": 30, "jitter_seconds": 1, "timeout_margin_seconds": 3},
        probes={"throughput": {"streams": [1], "duration_seconds": 3, "omit_seconds": 1}},
    )
    now = [0.0]
    e = Exporter(cfg, clock=lambda: now[0])
    slot = 30 * 1000
    while e.schedule.partner("a", slot // 30) is None:
        slot += 30
    other = ({"b", "c"} - {e.schedule.partner("a", slot // 30)}).pop()
    late = slot + 8.0  # a retried test starts 3 s after the 5 s window (1 s jitter + 1 + 3 s)
    assert e.load.of(other, late + 1) == "idle"  # by the schedule alone

    def slow(test: ThroughputTest) -> ThroughputResult:
        assert now[0] == late
        assert e.load.of(other, late + 1) == "loaded"  # while it runs
        now[0] = late + 4
        return result()

    e.turns.make_prober = StandIn(slow)
    peer = next(p for p in cfg.peers if p.name == "b")
    now[0] = late
    asyncio.run(e.turns.run_turn(peer, cfg.throughput_for(peer), deadline=slot + 15))
    assert e.load.of(other, late + 1) == "loaded"  # looking back: it ran then
    assert e.load.of(other, late + 4 + DRAIN_SECONDS / 2) == "loaded"  # its queue drains
    assert e.load.of(other, late + 4 + DRAIN_SECONDS + 0.1) == "idle"


@pytest.mark.parametrize("center", [0.0001, 0.0005, 0.008, 0.074, 0.150, 0.300])
def test_exported_quantiles_are_within_half_a_percent_of_the_raw_ones(center: float) -> None:
    # The target: the exported p50/p99 within max(0.5%, 0.05 ms) of the raw samples'
    # (the one-shot probe's own summary) over the same window, at any RTT from 0.1 to 300 ms.
    import random

    from pathprobe.metrics.rtt import WindowedQuantiles

    rng = random.Random(center)
    raw = [center * (1 + rng.expovariate(20)) for _ in range(3000)]  # a tail of a few percent
    window = WindowedQuantiles(300)
    for i, rtt in enumerate(raw):
        window.observe(rtt, 1000 + i * 0.05)
    got = window.quantiles(1000 + len(raw) * 0.05)
    want = Summary.of(raw)
    assert want is not None
    for q, exact in ((0.5, want.p50), (0.99, want.p99)):
        assert abs(got[q] - exact) <= max(0.005 * exact, 0.00005), (q, got[q], exact)


def test_quantiles_read_between_samples_equal_a_window_merged_afresh() -> None:
    # A read reuses the merge of the window's earlier steps: reads interleaved with samples, in one
    # step, across steps, and after a sample lands in an earlier step (the wall clock stepped back)
    # must give what merging every step of the window afresh gives.
    import random

    from pathprobe.metrics.rtt import WindowedQuantiles

    rng = random.Random(7)
    cached = WindowedQuantiles(100)  # steps of 10 s
    times = [1000 + i * 0.7 for i in range(400)]
    times[300] = times[250]  # a sample 35 s back, into a step already merged
    for n, at in enumerate(times, 1):
        cached.observe(0.074 * (1 + rng.expovariate(20)), at)
        read_at = max(times[:n])
        fresh = WindowedQuantiles(100)
        fresh.steps = cached.steps  # the same samples, nothing merged before
        assert cached.quantiles(read_at) == fresh.quantiles(read_at), n


def test_an_unknown_instance_type_is_a_labelled_metric_never_a_silent_default(tmp_path: Path) -> None:
    cfg = config(tmp_path).model_dump(mode="json")
    cfg["host"]["instance_type"] = "m9z.huge"
    cfg["peers"][0]["instance_type"] = "c6gn.xlarge"
    got = samples(Exporter(Config.model_validate(cfg)))
    assert value(got, "pathprobe_instance_type_unknown", peer="", instance_type="m9z.huge") == 1
    assert not [k for k in got if k[0] == "pathprobe_instance_type_unknown" and ("peer", "b") in k[1]]
    # Its bandwidth is left out of the expected values, named: per_flow binds, not an invented instance figure.
    assert value(got, "pathprobe_throughput_expected_bytes_per_second", peer="b", streams="1", limit="per_flow") > 0


def allowance_spending(counter: Path) -> StandIn:
    """Each test raises the fake ethtool's bw_out counter by 500."""

    def spend(test: ThroughputTest) -> ThroughputResult:
        counter.write_text(str(int(counter.read_text()) + 500))
        return result(rtt=0.01)

    return StandIn(spend)


def test_allowance_counters_that_rise_during_a_test_name_the_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The exporter's own path (turns -> store -> metrics) with the recorded `ethtool -S` of an
    # ENA interface, whose bw_out counter the stand-in test raises.
    recorded = (Path(__file__).parent / "fixtures" / "ethtool-S-ena.txt").read_text()
    counter = tmp_path / "bw_out"
    counter.write_text("1278")
    (tmp_path / "recorded.txt").write_text(recorded)
    ethtool = tmp_path / "bin" / "ethtool"
    ethtool.parent.mkdir()
    ethtool.write_text(
        f'#!/bin/sh\nsed "s/bw_out_allowance_exceeded: 1278/bw_out_allowance_exceeded: $(cat {counter})/" '
        f"{tmp_path / 'recorded.txt'}\n"
    )
    ethtool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{ethtool.parent}:{os.environ['PATH']}")
    e = Exporter(config(tmp_path, host={"name": "a", "address": "198.18.1.2", "region": "r1", "interface": "eth0"}))
    e.turns.make_prober = allowance_spending(counter)
    peer = e.cfg.peers[0]
    asyncio.run(e.turns.run_turn(peer, e.cfg.throughput_for(peer), deadline=e.turns.clock() + 600))
    got = samples(e)
    rose = value(
        got,
        "pathprobe_throughput_allowance_exceeded_during_last_test",
        peer="b",
        streams="1",
        counter="bw_out_allowance_exceeded",
    )
    assert rose == 500
    tests = len(e.cfg.throughput_for(peer).tests())
    total = value(got, "pathprobe_ena_allowance_exceeded_total", interface="eth0", counter="bw_out_allowance_exceeded")
    assert total == 1278 + 500 * tests


def test_a_lost_packet_counts_in_the_state_it_was_sent_in(tmp_path: Path) -> None:
    now = [112.0]
    e = Exporter(config(tmp_path), clock=lambda: now[0])
    e.load.of = lambda peer, t: "loaded" if 100 <= t < 110 else "idle"
    echo = e.recorder("loss", "c")
    echo.lost(7.0)  # sent at 105, under a test; its timeout ran out after the test
    got = samples(e)
    assert value(got, "pathprobe_udp_packets_lost_total", peer="c", state="loaded") == 1
    assert value(got, "pathprobe_udp_packets_lost_total", peer="c", state="idle") == 0


def test_steady_state_results_and_probe_cost_reach_metrics(tmp_path: Path) -> None:
    cfg = config(tmp_path, budget={"state_file": str(tmp_path / "b.json"), "price_per_gb": {"inter_region": 0.02}})
    e = Exporter(cfg)
    steady = result()
    steady.duration_seconds, steady.omit_seconds, steady.converged = 1.7, 0, True
    e.rooms.throughput.record(TestKey("b", "tcp", "1", "send"), steady)
    e.rooms.throughput.record(TestKey("c", "tcp", "1", "send"), result())  # fixed length: no converged series
    got = samples(e)
    assert value(got, "pathprobe_throughput_converged", peer="b", streams="1") == 1
    assert not [k for k in got if k[0] == "pathprobe_throughput_converged" and ("peer", "c") in k[1]]
    assert value(got, "pathprobe_throughput_test_duration_seconds", peer="b", streams="1") == 1.7
    assert value(got, "pathprobe_throughput_test_duration_seconds", peer="c", streams="1") == 6
    moved = value(got, "pathprobe_probe_bytes_sent_total", probe="throughput", peer="b")
    assert value(got, "pathprobe_probe_cost_dollars_total", probe="throughput", peer="b") == pytest.approx(
        moved / 1e9 * 0.02
    )
    # c is intra-region, which has no price here: no cost series rather than a made-up zero.
    assert not [k for k in got if k[0] == "pathprobe_probe_cost_dollars_total" and ("peer", "c") in k[1]]


def test_a_peer_can_keep_fixed_length_tests_when_the_mesh_stops_at_steady_state(tmp_path: Path) -> None:
    cfg = config(tmp_path, probes={"throughput": {"steady_state": {"enabled": True}}}).model_dump(mode="json")
    cfg["peers"][1]["throughput"] = {"steady_state": {"enabled": False}}
    e = Exporter(Config.model_validate(cfg))
    b, c = e.cfg.peers
    assert e.turns.test(b, e.cfg.throughput_for(b), ("tcp", "1", "send")).steady is not None
    assert e.turns.test(c, e.cfg.throughput_for(c), ("tcp", "1", "send")).steady is None
    assert e.turns.test(b, e.cfg.throughput_for(b), ("udp", "1", "send")).steady is None  # TCP only


def fleet_config(tmp_path: Path, host: str, throughput: dict[str, object] | None = None, **mesh: object) -> Config:
    """Host `host` of a 3-region, 4-hosts-per-region fleet with a hierarchical RTT mesh (k=1)."""
    members = [(f"r{r}-h{h}", f"r{r}", f"198.18.{r}.{h + 2}") for r in range(3) for h in range(4)]
    me = next(m for m in members if m[0] == host)
    peers = [
        {"name": n, "address": a, "region": r, "path_class": "intra_region" if r == me[1] else "inter_region"}
        for n, r, a in members
        if n != host
    ]
    mesh = {"rtt": {"kind": "hierarchical", "representatives": 1}, "throughput": throughput, **mesh}
    return config(tmp_path, host={"name": host, "address": me[2], "region": me[1]}, peers=peers, mesh=mesh)


def test_a_hierarchical_mesh_probes_and_exports_only_its_links(tmp_path: Path) -> None:
    hosts = [f"r{r}-h{h}" for r in range(3) for h in range(4)]
    cfgs = {h: fleet_config(tmp_path, h) for h in hosts}
    for h, cfg in cfgs.items():  # links are symmetric: every host derives the same mesh
        for p in cfg.rtt_peers:
            assert h in {q.name for q in cfgs[p.name].rtt_peers}
        assert {p.name for p in cfg.rtt_peers} >= {x for x in hosts if x[:2] == h[:2] and x != h}
    # 3 region pairs, one link each
    inter = {tuple(sorted((h, p.name))) for h, c in cfgs.items() for p in c.rtt_peers if p.region != c.host.region}
    assert len(inter) == 3
    ex = Exporter(cfgs["r0-h0"])
    got = samples(ex)
    probed = {p.name for p in cfgs["r0-h0"].rtt_peers}
    exported = {dict(ls)["peer"] for n, ls in got if n == "pathprobe_probe_runs_total"}
    assert exported == probed
    assert {name.split("-", 1)[1] for name, _ in ex.probers()} == probed
    assert {p.name for p in cfgs["r0-h0"].probed_peers} == probed
    assert ex.allowed.allows("198.18.0.3") and not ex.allowed.allows(
        next(str(p.address) for p in cfgs["r0-h0"].peers if p.name not in probed)
    )


def test_a_sampled_throughput_mesh_schedules_only_its_links_and_no_host_twice(tmp_path: Path) -> None:
    hosts = [f"r{r}-h{h}" for r in range(3) for h in range(4)]
    cfgs = {h: fleet_config(tmp_path, h, {"kind": "hierarchical", "representatives": 1}) for h in hosts}
    schedules = {h: Exporter(cfgs[h]).schedule for h in hosts}  # each host's view of the mesh's schedule
    assert len({s.fingerprint for s in schedules.values()}) == 1
    s = schedule_of(cfgs["r0-h0"])  # the whole mesh's
    assert all(schedules[h].turn(h, k) == s.turn(h, k) for h in hosts for k in range(len(s.rounds)))
    tested = {tuple(sorted((h, t.peer))) for h in hosts for k in range(len(s.rounds)) if (t := schedules[h].turn(h, k))}
    assert tested == set(cfgs["r0-h0"].throughput_pairs or ())
    for k in range(len(s.rounds)):
        busy = [h for pair in s.rounds[k] for h in pair]
        assert len(busy) == len(set(busy))
    # A full mesh would need 11 rounds; this one needs the largest degree (3 in-region + up to 2 out).
    assert len(s.rounds) < 11


def test_compact_peers_export_what_the_rules_read_and_fewer_series(tmp_path: Path) -> None:
    cfg = fleet_config(tmp_path, "r0-h0", compact_outside="region")
    ex = Exporter(cfg)
    remote = next(p.name for p in cfg.rtt_peers if p.region != "r0")
    local = next(p.name for p in cfg.rtt_peers if p.region == "r0")
    assert cfg.compact_peers == {p.name for p in cfg.peers if p.region != "r0"}
    for name in (remote, local):
        for state in ("idle", "loaded"):
            ex.load.of = lambda peer, now, state=state: state
            for protocol in ("tcp", "udp"):
                for ms in range(1, 50):
                    ex.rooms.rtt.observe(name, protocol, ms / 1000)
        ex.rooms.outcomes.success("rtt", name)
    got = samples(ex)

    def series(peer: str) -> set[tuple[str, frozenset[tuple[str, str]]]]:
        return {(n, frozenset(ls)) for n, ls in got if ("peer", peer) in ls}

    assert len(series(remote)) < len(series(local)) / 2, (len(series(remote)), len(series(local)))
    # what the rules read is there
    assert value(got, "pathprobe_rtt_seconds", peer=remote, protocol="tcp", state="idle", quantile="0.99") > 0
    assert value(got, "pathprobe_rtt_seconds", peer=remote, protocol="tcp", state="idle", quantile="0.5") > 0
    assert value(got, "pathprobe_udp_packets_sent_total", peer=remote, state="idle") == 0
    assert value(got, "pathprobe_udp_packets_lost_total", peer=remote, state="idle") == 0
    assert value(got, "pathprobe_probe_runs_total", peer=remote, probe="rtt", result="ok") == 1
    # and not the rest
    assert not [ls for n, ls in series(remote) if ("state", "loaded") in ls or ("quantile", "0.9") in ls]
    assert not [ls for n, ls in series(remote) if n == "pathprobe_probe_runs_total" and ("result", "ok") not in ls]


def test_what_arrives_for_a_peer_a_reload_removed_is_dropped_at_the_door(tmp_path: Path) -> None:
    # A test against b runs while a reload removes b: its result, expected value, allowance
    # counters and every continuous probe's outcome still arrive, and none may reach /metrics.
    e = Exporter(config(tmp_path))
    b = e.cfg.peers[0]
    rtt, echo, mtu = e.recorder("rtt", "b"), e.recorder("loss", "b"), e.recorder("mtu", "b")
    rtt.rtt(0.01)
    planned = e.tracker  # the tracker of the turn under way
    cfg = config(tmp_path).model_dump(mode="json")
    cfg["peers"] = cfg["peers"][1:]
    e.reload(Config.model_validate(cfg))
    key = TestKey("b", "tcp", "1", "send")
    e.rooms.throughput.record(key, result())
    planned.rate(b, key.spec, result())
    e.rooms.throughput.allowances_rose(key, {"bw_out_allowance_exceeded": 1})
    e.rooms.throughput.skip("b", "budget")
    rtt.rtt(0.01)
    rtt.failure("timeout")
    rtt.flows_failing(1)
    echo.sent(64)
    echo.received(0.01, jitter=0.001)
    echo.flows_failing(1, 0.5)
    echo.lost_by_direction(1, 1)
    mtu.mtu(1500, True, None)
    got = samples(e)
    assert not [ls for _, ls in got if ("peer", "b") in ls]
    assert value(got, "pathprobe_peer_info", peer="c") == 1


def test_a_reload_that_leaves_fewer_than_half_the_peers_is_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    e = Exporter(config(tmp_path))  # b and c
    name = "pathprobe_config_reloads_dropping_most_peers_total"
    peers = config(tmp_path).model_dump(mode="json")["peers"]
    peers[0] |= {"name": "d", "address": "198.18.4.2"}  # b replaced by d: a rollout, not counted
    e.reload(config(tmp_path, peers=peers))
    assert value(samples(e), name) == 0
    more = [
        {"name": f"x{i}", "address": f"198.18.5.{i + 2}", "region": "r2", "path_class": "inter_region"}
        for i in range(3)
    ]
    e.reload(config(tmp_path, peers=[*peers, *more]))
    e.reload(config(tmp_path, peers=peers))  # 5 peers -> 2: a file cut short?
    assert value(samples(e), name) == 1
    assert "config reload left 2 of 5 probed peers (dropped: x0, x1, x2)" in caplog.text


def test_a_held_event_loop_shows_in_the_lateness_of_the_probes_passes(tmp_path: Path) -> None:
    """Three passes of the probes' timer, 50 ms apart; the first holds the loop for 0.3 s (as a busy
    host would): the second runs about 0.25 s late, and the histogram says so."""
    e = Exporter(config(tmp_path))

    async def main() -> None:
        pacer = Pacer.of(asyncio.get_running_loop())
        pacer.late = e.rooms.host
        held = iter([0.3, 0.0, 0.0])
        await pacer.repeat(0.05, lambda: time.sleep(next(held)), count=3)

    asyncio.run(main())
    got = samples(e)
    name = "pathprobe_event_loop_lateness_seconds"
    assert value(got, f"{name}_count") == 3
    assert value(got, f"{name}_bucket", le="0.1") <= 2  # the held one: late by more than 0.1 s
    assert 0.2 <= value(got, f"{name}_sum") < 3
    buckets = [v for (n, _), v in sorted(got.items(), key=lambda kv: kv[0]) if n == f"{name}_bucket"]
    assert len(buckets) == 9 and value(got, f"{name}_bucket", le="+Inf") == 3


def test_readiness_says_why_until_the_responders_listen_and_iperf3_runs(tmp_path: Path) -> None:
    e = Exporter(config(tmp_path))
    assert e.unready() == "the responders are not listening yet"  # GET /-/ready: 503 with this
    e.responders_listening = True
    problem = e.unready()
    assert problem is not None and problem.startswith("the iperf3 server is not running")
    e.iperf3.set_up(True)  # as the responders report it
    assert e.unready() is None
    info = {
        s.name: s.labels
        for f in text_string_to_metric_families(generate_latest(registry(e.rooms)).decode())
        for s in f.samples
        if s.name == "pathprobe_build_info"
    }
    assert set(info["pathprobe_build_info"]) == {"version", "revision", "python_version"}
