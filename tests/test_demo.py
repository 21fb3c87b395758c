"""`pathprobe demo` brings up the whole stack and Prometheus holds every path."""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from helpers import PATHPROBE, dashboards, panels, root_leftovers, wait_for
from pathprobe import procs, promql
from pathprobe.monitoring import common, culprits, rules
from pathprobe.monitoring.params import Params
from pathprobe.probe_settings import RttSettings
from pathprobe_lab import topology
from pathprobe_lab.configs import LAB_CLOCK_ERROR_BOUND, lab_alert_params, rotation_seconds
from pathprobe_lab.demo import SLOT_SECONDS, idle_tail_bound
from pathprobe_lab.state import PREFIX, STATE_DIR, State

pytestmark = pytest.mark.lab

PROM = "http://127.0.0.1:19090"
ROUTING = Path(__file__).parents[1] / "alerts" / "alertmanager.yml"


def query(expr: str) -> list[dict]:
    return promql.query(PROM, expr, timeout=5)


# Grafana's variables as "All" selects them, and its interval macros.
SUBSTITUTE = {
    "$job": ".+",
    "$instance": ".+",
    "$region": ".*",
    "$host": ".*",
    "$peer_region": ".*",  # before $peer, its prefix
    "$peer": ".*",
    "$__rate_interval": "1m",
    "$volume_tb": "40",
    "$price_per_gb": "0.02",
}
# A healthy lab fires and names nothing; the default demo's tests are TCP's, and the UDP tests'
# panel has data only where UDP tests run; its hosts run no applications, so the panel of the
# applications' flows alone (without the probes beside them) has none either.
NO_DATA_EXPECTED = {
    "Firing pathprobe alerts",
    "Culprits now",
    "UDP tests: the path's loss and the receiver's drops",
    "Applications' bytes sent window- or buffer-limited, by peer region",
}
# The default demo (40 s slots: a 120 s rotation) stays silent this long from its start: five rotations.
SILENT_SECONDS = 600
# Every test of every path reaches this share of its floor at its best in the window.
BEST_RATIO = 0.9


def check_dashboard_queries() -> None:
    """Every panel query of every dashboard runs without error, with data where the lab has it."""
    for name, d in dashboards().items():
        for var in d["templating"]["list"]:
            if var["type"] == "query":  # label_values(METRIC, LABEL)
                metric, label = var["query"].removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
                for ref, value in SUBSTITUTE.items():
                    metric = metric.replace(ref, value)
                url = f"{PROM}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": metric})
                with urllib.request.urlopen(url, timeout=5) as r:
                    assert json.load(r)["data"], f"{name}: variable {var['name']} has no values"
        for panel in panels(d):
            found = []
            for target in panel["targets"]:
                expr = target["expr"]
                for var, value in SUBSTITUTE.items():
                    expr = expr.replace(var, value)
                try:
                    found.append(query(expr))
                except urllib.error.HTTPError as exc:
                    raise AssertionError(f"{name}/{panel['title']}: {expr}: {exc.read().decode()}") from exc
            if panel["title"] not in NO_DATA_EXPECTED:
                assert any(found), f"{name}/{panel['title']}: no data from the lab"


# Every alert but one: a test whose VM's hypervisor took a tenth of its CPU measured the VM, and the
# host-bound warning naming it (remedy "steal") is the culprit named, the one thing the lab's VM may
# not give it. Every other alert, and so every path and culprit alert, is a failure.
STOLEN = 'ALERTS{alertstate="firing", alertname="PathprobeThroughputTestHostBound", remedy="steal"}'
FIRING = f'ALERTS{{alertstate="firing"}} unless {STOLEN}'


def firing_alerts() -> list[dict[str, str]]:
    return [s["metric"] for s in query(FIRING)]


def stays_silent(started: float) -> list[tuple[float, list[int]]]:
    """Polls the firing alerts until SILENT_SECONDS into the demo (none may fire), and returns the
    machine's CPU time at each poll: a failure then says whether this VM's host took its CPU (steal)
    at that time, since the lab's shapers, delay line and iperf3 run only while it gives it."""
    polls = [(time.monotonic() - started, cpu_times())]
    while time.monotonic() - started < SILENT_SECONDS:
        assert not firing_alerts(), (firing_alerts(), steal_per_poll(polls), bad_paths())
        time.sleep(15)
        polls.append((time.monotonic() - started, cpu_times()))
    return polls


def test_the_default_demo_fills_prometheus_for_every_path_stays_silent_then_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = [h.name for h in topology.load(None).hosts]
    paths = {(a, b) for a in hosts for b in hosts if a != b}
    delay_log = STATE_DIR / "delay-line.log"
    delay_log_size = delay_log.stat().st_size if delay_log.exists() else 0
    cpu_before = cpu_times()
    started = time.monotonic()
    demo = subprocess.Popen(
        [*PATHPROBE, "demo", "--alertmanager-routing", str(ROUTING), "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def measured(metric: str) -> set[tuple[str, str]]:
            return {(s["metric"]["host"], s["metric"]["peer"]) for s in query(metric)}

        # Every directed path: RTT at once, throughput within one rotation (3 slots of 40 s).
        wait_for("RTT for every path", lambda: measured("pathprobe_rtt_seconds_count") >= paths, timeout=60)

        # Both stream counts: a turn runs them one after the other, so the first alone is not enough.
        def measured_streams() -> set[tuple[str, str, str]]:
            series = query('pathprobe_throughput_bytes_per_second{direction="send"}')
            return {(s["metric"]["host"], s["metric"]["peer"], s["metric"]["streams"]) for s in series}

        wait_for(
            "throughput for every path at 1 and 4 streams",
            lambda: measured_streams() >= {(a, b, n) for a, b in paths for n in ("1", "4")},
            timeout=240,
        )
        targets = json.load(urllib.request.urlopen(f"{PROM}/api/v1/targets", timeout=5))["data"]["activeTargets"]
        assert {t["labels"]["host"] for t in targets} == set(hosts)
        assert all(t["health"] == "up" and t["labels"]["region"] for t in targets)
        check_dashboard_queries()
        # Healthy is silent: nothing impaired, no alert of any severity fires in the window but STOLEN (the
        # lab's rule windows are minutes long: see lab_alert_params), polled and from Prometheus's own record.
        polls = stays_silent(started)
        window = f"[{SILENT_SECONDS + 60}s]"
        fired = query(f'max_over_time(ALERTS{{alertstate="firing"}}{window}) unless max_over_time({STOLEN}{window})')
        assert not fired, ([s["metric"] for s in fired], steal_per_poll(polls))
        stolen = [(s["metric"]["host"], s["metric"]["peer"]) for s in query(f"max_over_time({STOLEN}{window})")]
        # Every test of every path reaches its floor (the instance baseline, the per-flow or inter-region
        # cap, or the TCP window at the path's RTT) at its best in the window, under the demo's own load.
        best = {
            (r["metric"]["host"], r["metric"]["peer"], r["metric"]["streams"]): float(r["value"][1])
            for r in query(f"max_over_time(path:pathprobe_throughput_expected_ratio:last[{SILENT_SECONDS}s])")
        }
        with capsys.disabled():
            print(
                f"\ndemo: silent for {SILENT_SECONDS} s; best ratio to the floor per test: lowest "
                f"{min(best.values()):.3f} ({min(best, key=best.__getitem__)}), of {len(best)} tests; "
                f"{throughput_alerts_margin()}; tests whose VM's hypervisor took their CPU: {stolen or 'none'}"
            )
        assert len(best) == 2 * len(paths) and min(best.values()) >= BEST_RATIO, best
        cpu_share = cpu_shares(cpu_before, cpu_times())
        tails = idle_rtt_tails()
        polls.append((time.monotonic() - started, cpu_times()))
        stolen_most = most_stolen(polls, polls[-1][0] - RTT_WINDOW_SECONDS)
        wide = {k: (p50, p99) for k, (p50, p99, bound) in tails.items() if p99 - p50 > bound}
        closest = max(tails, key=lambda k: (tails[k][1] - tails[k][0]) / tails[k][2])
        with capsys.disabled():
            p50, p99, bound = tails[closest]
            print(
                f"demo: idle RTT series with p99 beyond the target: {wide or 'none'}; closest to it: {closest} "
                f"p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms (+{(p99 - p50) * 1e3:.3f}, bound {bound * 1e3:.3f})"
            )
        review_stolen = check_capacity_review()
    finally:
        demo.send_signal(signal.SIGINT)
        out, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, out[-2000:]
    assert "removed namespace pp-router" in out
    assert root_leftovers() == []
    # Where a tail would come from: the machine's time over the silent window (a hypervisor's steal,
    # softirq) and how late the delay line released packets (its summary, written as the lab stops it).
    with delay_log.open("rb") as f:
        f.seek(delay_log_size)
        delay_line = [x for x in f.read().decode(errors="replace").splitlines() if "releases late" in x]
    with capsys.disabled():
        summary = delay_line[-1] if delay_line else "no delay line summary"
        print(
            f"demo: the machine's CPU over the silent window, % of all cores: {cpu_share}; {summary}; "
            f"steal per poll: {steal_per_poll(polls)}; capacity review rows without a result for steal "
            f"(streams): {review_stolen or 'none'}"
        )
    check_idle_tails(wide, stolen_most, cpu_share["steal"], capsys)


def check_idle_tails(
    wide: dict[tuple[str, str, str], tuple[float, float]],
    stolen_most: float,
    steal: float,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Idle RTT tails as tight as the path. While the delay line woke for each arrival as well as each
    release, the widest tail was 0.12-0.135 ms above p50 on the 0.15 ms bound, and one run in seven
    missed by 0.01 ms; since it wakes for releases only, 0.056-0.079 ms in eleven runs. The lab's paths
    are as tight as that only while this VM runs: a vCPU its hypervisor took holds every packet in the
    lab, and the probes measure that as it is (a run with 15-23% steal in the window's last 75 s had
    every idle p99 7-12 ms above its p50). So the tails are asserted where the quantiles' window was
    quiet (`stolen_most`: the most steal in one of its polls, %), and printed otherwise."""
    if stolen_most > QUIET_STEAL_PERCENT:
        with capsys.disabled():
            print(
                f"demo: idle RTT tails not asserted: this VM's hypervisor took up to {stolen_most}% of its CPU "
                f"in a poll of the quantiles' last {RTT_WINDOW_SECONDS:g} s (quiet: {QUIET_STEAL_PERCENT}% at most)"
            )
        return
    assert not wide, f"idle RTT tails beyond the target ({steal}% steal): {wide}"


# The exporters' RTT quantile window (probes.rtt.quantile_window_seconds), and the most steal in one
# poll of it for the idle tails to be asserted: above the 0.1-0.7% this VM reads with nothing running.
RTT_WINDOW_SECONDS = RttSettings().quantile_window_seconds
QUIET_STEAL_PERCENT = 2.0


def most_stolen(polls: list[tuple[float, list[int]]], since: float) -> float:
    """The largest share of both cores (%) the hypervisor took in one poll that ended after `since`
    (seconds into the demo)."""
    return max(
        (cpu_shares(before, after)["steal"] for (_, before), (end, after) in itertools.pairwise(polls) if end > since),
        default=0.0,
    )


def throughput_alerts_margin() -> str:
    """How close the throughput alerts came in the silent window: their expression's lowest value
    (the better of a test's last two results; below the warning ratio, they fire), and the worst test.
    The expression's series carry either ratio's name, so the subquery takes their minimum first."""
    params = lab_alert_params(rotation_seconds(topology.load(None), SLOT_SECONDS))
    best, recent = rules.throughput_best_of_two(params)
    closest = min(float(r["value"][1]) for r in query(f"min_over_time(min({best}\n{recent})[{SILENT_SECONDS}s:15s])"))
    ratio = "path:pathprobe_throughput_expected_ratio:last"
    worst = min(query(f"min_over_time({ratio}[{SILENT_SECONDS}s])"), key=lambda r: float(r["value"][1]))
    test = {k: v for k, v in worst["metric"].items() if k in ("host", "peer", "protocol", "streams", "direction")}
    return (
        f"the throughput alerts' lowest value (best of two tests) {closest:.3f}, the worst test "
        f"{float(worst['value'][1]):.3f} ({test}: {how_it_ran(ratio, test)})"
    )


def how_it_ran(ratio: str, test: dict[str, str]) -> str:
    """How the test behind a series' lowest ratio in the silent window ran: whether it stopped at a
    settled rate, how long it took, its retransmits, and what held its sender back (the shares of its
    sending time limited by the receiver's window and by the send buffer), and the RTT its sender saw
    (each a test's last result, held until the next)."""
    matchers = ",".join(f'{k}="{v}"' for k, v in test.items())
    ratios = query(f"{ratio}{{{matchers}}}[{SILENT_SECONDS}s]")
    if not ratios:
        return "its samples not found"
    lowest_at = min(ratios[0]["values"], key=lambda s: float(s[1]))[0]
    found = []
    for name in (
        "pathprobe_throughput_converged",
        "pathprobe_throughput_test_duration_seconds",
        "pathprobe_throughput_retransmits",
        "pathprobe_throughput_receive_window_limited_ratio",
        "pathprobe_throughput_send_buffer_limited_ratio",
        "pathprobe_throughput_sender_rtt_seconds",
    ):
        # A minute further back than the ratio's window: the result behind a ratio recorded early in the
        # window was scraped before it began.
        series = query(f"{name}{{{matchers}}}[{SILENT_SECONDS + 60}s]")
        then = [v for t, v in series[0]["values"] if t <= lowest_at] if series else []
        found.append(f"{name.removeprefix('pathprobe_throughput_')} {then[-1] if then else 'absent'}")
    return ", ".join(found)


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> list[int]:
    """The machine's CPU time so far by kind (/proc/stat's first line, in ticks)."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1 : 1 + len(CPU_FIELDS)]]


def cpu_shares(before: list[int], after: list[int]) -> dict[str, float]:
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return {name: round(100 * t / sum(spent), 1) for name, t in zip(CPU_FIELDS, spent, strict=True)}


# What a culprit or a path alert rose on, for a failure's message: each signal's bad paths as the
# culprit rules see them (monitoring/culprits.py's path_signals reads these series).
BAD_PATH_QUERIES = {
    "bad level": f"{culprits.BAD} >= 1",
    "throughput ratio": f'{common.EXPECTED_RATIO}{{direction="send"}} < {Params().throughput_ratio_warning:g}',
    "idle loss": f"{culprits.PATH_IDLE_LOSS} > 0",
}


def bad_paths() -> dict[str, list[tuple[str, str, str, float]]]:
    """Each signal's bad paths (host, peer, streams, value) at the moment of the failure."""
    return {
        what: [
            (
                s["metric"].get("host", ""),
                s["metric"].get("peer", ""),
                s["metric"].get("streams", ""),
                float(s["value"][1]),
            )
            for s in query(q)
        ]
        for what, q in BAD_PATH_QUERIES.items()
    }


def steal_per_poll(polls: list[tuple[float, list[int]]]) -> str:
    """Each poll's end (s into the demo) and the share of both cores the hypervisor took in it."""
    return " ".join(
        f"{end:.0f}s:{cpu_shares(before, after)['steal']}%" for (_, before), (end, after) in itertools.pairwise(polls)
    )


def idle_rtt_tails() -> dict[tuple[str, str, str], tuple[float, float, float]]:
    """Idle RTT tails as tight as the path: every idle series (all 24) with its p50, its p99 and how far
    above p50 its p99 may be (`idle_tail_bound`)."""

    def by_series(q: str) -> dict[tuple[str, str, str], float]:
        found = query(f'pathprobe_rtt_seconds{{state="idle", quantile="{q}"}}')
        return {
            (s["metric"]["host"], s["metric"]["peer"], s["metric"]["protocol"]): float(s["value"][1]) for s in found
        }

    p50, p99 = by_series("0.5"), by_series("0.99")
    assert len(p50) == 24, p50  # 12 paths, TCP and UDP
    return {k: (p50[k], p99[k], idle_tail_bound(p50[k])) for k in p50}


def check_capacity_review() -> list[int]:
    """The capacity review from the demo's stored history (several tests of each path, whose median it
    takes): Tokyo -> Osaka, bound by the inter-region cap (c6gn.xlarge: 5 Gbps, 500 Mbit/s at the lab's
    scale) and, with one flow, the per-flow cap. The review leaves out tests that measured their own
    ends, at a 5-minute step: where this VM's hypervisor took their CPU at each step of the demo's ten
    minutes, a stream count has no stored result, and the review must say that steal is why. Returns
    those stream counts."""
    cap = subprocess.run(
        [
            *PATHPROBE,
            "capacity",
            "--from-prometheus",
            PROM,
            "--peer",
            "osaka-a",
            "--host",
            "tokyo-a",
            "--streams",
            "1,4",
            "--limit",
            "per_flow=500M",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    review = json.loads(cap.stdout)
    # Stream counts whose tests were steal-bound in the demo's history (the last one, or earlier ones).
    steal_bound = {
        int(s["metric"]["streams"])
        for s in query(
            'max_over_time(pathprobe_throughput_host_bound_info{host="tokyo-a", peer="osaka-a", direction="send", '
            f'remedy="steal"}}[{SILENT_SECONDS + 60}s])'
        )
    }
    stolen = [
        r["streams"]
        for r in review["rows"]
        if r["bits_per_second"] is None
        and r["error"] == "no stored results"
        and (r["remedy"] == "steal" or r["streams"] in steal_bound)
    ]
    rows = {r["streams"]: r["bits_per_second"] for r in review["rows"] if r["streams"] not in stolen}
    assert None not in rows.values(), review["rows"]  # a row without a result says steal is why
    assert cap.returncode == (0 if rows else 1), cap.stdout + cap.stderr  # 1: nothing measured
    if 1 in rows and not review["rows"][0]["ends_bound"]:
        # What Prometheus holds, as the review says...
        stored = query(
            'quantile_over_time(0.5, pathprobe_throughput_bytes_per_second{host="tokyo-a", peer="osaka-a", '
            'streams="1", direction="send"}[30d])'
        )
        assert rows[1] == pytest.approx(float(stored[0]["value"][1]) * 8, rel=0.01)
    # ...and a healthy path: one flow and four at their caps.
    assert all(rate == pytest.approx(500e6, rel=0.05) for rate in rows.values()), review["rows"]
    # The one-way delays each way as stored (the lab states its clocks' bound), with the bounds added.
    for direction in ("forward", "reverse"):
        stored = query(
            f'quantile_over_time(0.5, pathprobe_owd_seconds{{host="tokyo-a", peer="osaka-a", '
            f'state="idle", quantile="0.5", direction="{direction}"}}[30d])'
        )
        got = review["one_way"][f"{direction}_seconds"]["p50"]
        assert got == pytest.approx(float(stored[0]["value"][1]), rel=0.01), review["one_way"]
    assert review["one_way"]["error_bound_seconds"] == pytest.approx(2 * LAB_CLOCK_ERROR_BOUND)
    return stolen


# --- the demo ends cleanly however it ends ---------------------------------------------
SMALL = """
hosts:
  - {name: demo-a, region: r1}
  - {name: demo-b, region: r2, congestion: bbr}  # the lab extends the allowed list: put back after
paths:
  - {between: [r1, r2], one_way_delay: 2ms}
"""
SYSCTL = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def start_demo(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A small demo, once it says it is up, and the pids of every process it started."""
    topo = tmp_path / "topology.yaml"
    topo.write_text(SMALL)
    demo = subprocess.Popen(
        [*PATHPROBE, "demo", "--topology", str(topo), "--workdir", str(tmp_path / "work")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert demo.stdout is not None
    out, deadline = b"", time.monotonic() + 120
    while b"Ctrl-C stops" not in out:
        assert time.monotonic() < deadline and demo.poll() is None, out.decode(errors="replace")[-2000:]
        if select.select([demo.stdout], [], [], 1)[0]:
            out += os.read(demo.stdout.fileno(), 65536)
    state = State.load()
    assert state is not None
    return demo, [p["pid"] for p in state.processes]


def assert_nothing_left(pids: list[int], sysctl_before: str) -> None:
    assert root_leftovers() == []
    assert [p for p in pids if procs.alive(p)] == []
    assert SYSCTL.read_text() == sysctl_before


def test_a_hung_up_terminal_ends_the_demo_cleanly(tmp_path: Path) -> None:
    before = SYSCTL.read_text()
    demo, pids = start_demo(tmp_path)
    demo.send_signal(signal.SIGHUP)  # what a closed terminal or a dropped SSH session sends
    out, _ = demo.communicate(timeout=90)
    assert demo.returncode == 0, out[-2000:]
    assert_nothing_left(pids, before)


def test_ctrl_c_behind_a_closed_pipe_still_cleans_up(tmp_path: Path) -> None:
    # `demo | tee log` and Ctrl-C: tee dies first, then the demo's clean-up writes into the closed pipe.
    before = SYSCTL.read_text()
    demo, pids = start_demo(tmp_path)
    assert demo.stdout is not None
    demo.stdout.close()
    demo.send_signal(signal.SIGINT)
    assert demo.wait(timeout=90) == 0
    assert_nothing_left(pids, before)


def test_a_crashed_child_ends_the_demo_cleanly(tmp_path: Path) -> None:
    before = SYSCTL.read_text()
    demo, pids = start_demo(tmp_path)
    state = State.load()
    assert state is not None
    prometheus = next(p["pid"] for p in state.processes if p["what"] == "prometheus")
    os.kill(prometheus, signal.SIGKILL)
    out, _ = demo.communicate(timeout=90)
    assert demo.returncode == 1, out[-2000:]
    assert f"prometheus (pid {prometheus}) died" in out.decode(), out[-2000:]
    assert_nothing_left(pids, before)


def test_a_second_demo_refuses_a_taken_port_and_leaves_the_running_lab_alone(tmp_path: Path) -> None:
    """A demo started beside a running one used to tear the running one's lab down, then die on
    its webhook port with a traceback."""
    sentinel = PREFIX + "running-demo"  # stands for the running demo's lab: its clean-up would remove it
    subprocess.run(["ip", "netns", "add", sentinel], check=True)
    try:
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            port = held.getsockname()[1]
            got = subprocess.run(
                [*PATHPROBE, "demo", "--prometheus-port", str(port), "--duration", "5s", "--workdir", str(tmp_path)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        assert got.returncode != 0 and f"port(s) {port} on 127.0.0.1 already in use" in got.stderr, got.stderr
        assert "Traceback" not in got.stderr
        assert sentinel in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run(["ip", "netns", "delete", sentinel], check=False)
