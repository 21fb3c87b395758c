"""A host whose clock is ahead of its peers' (libfaketime): its turns start before its peers'
schedule gives them, so its peers cut its early tests. Real processes on loopback
(loopback_mesh.py), three exporters, h0's clock SKEW seconds ahead (more than the turns'
grace, less than a half slot). The skewed host counts those refusals as `out_of_turn`, not
`error`; its peers count them too; no host is ever in two tests at once; every host reads each
peer's clock offset from the echoes; and a real Prometheus on the shipped rules fires
PathprobeClockOffsetHigh for h0 alone. One-way delays are read between the unskewed hosts and
withheld, as clocks that disagree, against h0."""

import re
from itertools import combinations
from pathlib import Path

import pytest
from loopback_mesh import Samples, api, config, count, exporter, member, prometheus, until, unused_port, wait_for

from pathprobe.monitoring import rules
from pathprobe.monitoring.params import Params

pytestmark = pytest.mark.alone

# A slot of 10 s: each half holds one 1 s test. h0's clock SKEW ahead, its tests arrive 2.5 s
# before their half: 1.5 s after the test of the half before has ended (an earlier arrival meets
# a server still busy with it, refused by iperf3 as "busy", not by the turns), and 1.5 s before
# the turns' grace of 1 s (exporter.TURN_GRACE_SECONDS) would admit them. With a 6 s slot and a
# 2 s skew they arrived as the previous test ended and 1 s before the grace: on a loaded machine
# they met a busy server about as often as the admission check.
SLOT = 10.0
SKEW = 2.5
# The wall clock ahead, as a clock offset is (chrony disciplines CLOCK_REALTIME); the monotonic
# clock stays true (libfaketime would otherwise move it too, and the timed waits break).
# libfaketime is preloaded directly (ld.so expands $LIB), not through the `faketime` wrapper: the
# wrapper makes the exporter and every child share one semaphore, which the library takes around
# file stats (NO_FAKE_STAT: none here), so one killed child could stall the whole tree; and it
# leaves that semaphore and its shared memory in /dev/shm when its group is stopped by a signal.
AHEAD = (
    "env",
    "LD_PRELOAD=/usr/$LIB/faketime/libfaketime.so.1",
    f"FAKETIME=+{SKEW:g}s",
    "FAKETIME_DONT_FAKE_MONOTONIC=1",
    "NO_FAKE_STAT=1",
)
# A test's span in the client's log (its own clock): "throughput test -> PEER SPEC: from T0 to T1 (ran)".
RAN = re.compile(r"throughput test -> (\S+) \S+: from ([0-9.]+) to ([0-9.]+) \(ran\)")


def spans(log: Path, host: str, skew: float) -> list[tuple[frozenset[str], float, float]]:
    """(the two hosts, start, end) of each test `host` ran, in the true clock."""
    return [(frozenset({host, m[1]}), float(m[2]) - skew, float(m[3]) - skew) for m in RAN.finditer(log.read_text())]


def test_a_host_whose_clock_is_ahead_is_refused_as_out_of_turn_and_never_overlaps(tmp_path: Path) -> None:
    hosts = [member(f"h{i}", f"127.0.0.{i + 2}") for i in range(3)]
    webs = [unused_port() for _ in hosts]
    skews = [SKEW, 0.0, 0.0]
    logs = [tmp_path / f"{h['name']}.log" for h in hosts]
    runs, requests = "pathprobe_probe_runs_total", "pathprobe_responder_requests_total"
    with (
        exporter(config(tmp_path, hosts[0], hosts[1:], webs[0], SLOT), logs[0], AHEAD),
        exporter(config(tmp_path, hosts[1], [hosts[0], hosts[2]], webs[1], SLOT), logs[1]),
        exporter(config(tmp_path, hosts[2], hosts[:2], webs[2], SLOT), logs[2]),
    ):

        def refused_twice(got: Samples) -> bool:
            return count(got, runs, probe="throughput", result="out_of_turn") >= 2

        turns = (runs, "pathprobe_throughput_skipped_total", "pathprobe_schedule_turns_total")
        skewed = wait_for(webs[0], "h0 refused as out of turn twice", refused_twice, seconds=8 * SLOT, show=turns)
        assert count(skewed, runs, probe="throughput", result="error") == 0
        peers = [
            wait_for(
                w,
                "a throughput test of the unskewed pair ran",
                lambda g: count(g, runs, probe="throughput", result="ok") > 0,
                seconds=3 * SLOT,
            )
            for w in webs[1:]
        ]
        # Each host's view of its peers' clocks, from the echoes (the peer's clock minus its own).
        offset = "pathprobe_clock_offset_seconds"
        assert count(peers[0], offset, peer="h0") == pytest.approx(SKEW, abs=0.05)
        assert count(peers[1], offset, peer="h0") == pytest.approx(SKEW, abs=0.05)
        assert count(peers[0], offset, peer="h2") == pytest.approx(0, abs=0.01)
        assert count(skewed, offset, peer="h1") == pytest.approx(-SKEW, abs=0.05)
        # One-way delays (every host states a bound of 10 ns: one kernel clock): h1 reads h2's,
        # some microseconds each way; it withholds h0's, whose clock is SKEW off against that bound.
        trusted, delay = "pathprobe_owd_trusted", "pathprobe_owd_seconds"
        assert count(peers[0], trusted, peer="h2") == 1, [k[1] for k in peers[0] if "untrusted" in k[0]]
        for direction in ("forward", "reverse"):
            assert 0 < count(peers[0], delay, peer="h2", direction=direction, state="idle", quantile="0.5") < 0.005
        # libfaketime moves h0's clock reads, not its kernel's packet stamps: h0's responders stamp a
        # request's arrival with the kernel's (true) clock and their answer with the process's (SKEW
        # ahead), so every hold they report is SKEW too long, beyond the round trip. Its peers take no
        # RTT and no one-way delay from those answers (counted), only the clock offset above and how far
        # apart the clocks are, which the hold is not in. (On a host whose clock is really off, both are
        # off alike.)
        for probe in ("rtt", "loss"):
            assert count(peers[0], "pathprobe_probe_answers_rejected_total", probe=probe, peer="h0",
                         reason="hold_beyond_rtt") > 0  # fmt: skip
        assert count(peers[0], trusted, peer="h0") == 0
        assert count(peers[0], "pathprobe_owd_untrusted_info", peer="h0", reason="clocks_disagree") == 1
        assert count(peers[0], delay + "_count", peer="h0") == 0
        # The alert that names the host whose clock is off, evaluated by a real Prometheus on the
        # shipped rules (only `for:` and the evaluation interval shortened): h0 differs from both
        # its peers; h1 and h2 agree with each other, so neither is named.
        rules_file = tmp_path / "rules.yml"
        rules_file.write_text(rules.dump(Params(clock_offset_for="2s", evaluation_interval="1s")))
        scrape = {
            "job_name": "pathprobe",
            "static_configs": [
                {"targets": [f"127.0.0.1:{w}"], "labels": {"host": h["name"], "region": h["region"]}}
                for h, w in zip(hosts, webs, strict=True)
            ],
        }
        with prometheus(tmp_path, [scrape], (rules_file,)) as url:

            def named() -> list[str]:
                alerts = api(url, "alerts")["alerts"]
                firing = [a["labels"] for a in alerts if a["state"] == "firing"]
                return sorted(labels["host"] for labels in firing if labels["alertname"] == "PathprobeClockOffsetHigh")

            assert until("PathprobeClockOffsetHigh firing", named) == ["h0"]
    assert sum(count(g, requests, responder="iperf3", result="out_of_turn") for g in peers) >= 2
    ran = [s for log, h, skew in zip(logs, hosts, skews, strict=True) for s in spans(log, h["name"], skew)]
    assert ran, "no test ran"
    overlapping = [(a, b) for a, b in combinations(ran, 2) if a[0] & b[0] and a[1] < b[2] and b[1] < a[2]]
    assert overlapping == []
