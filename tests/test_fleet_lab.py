"""Fleet scale in the lab: a 6-host mesh in 3 regions, rolled from 5 to 6 members one host at a
time by reloads (SIGHUP) with a shared epoch, under three regional Prometheus servers and a
global one fed by remote write.

Checked from the hosts' own test logs ("throughput test -> PEER KEY: from S to E (ran)"): no host is
ever in two tests at once, the new host takes no test before the epoch, and every pair of
the new mesh meets within one rotation after it. Checked in Prometheus: each regional server
holds its region's exporters only; the global one holds every region pair's aggregates and
nothing per host."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import time
from collections.abc import Iterator
from itertools import combinations, pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import SIX_HOSTS_THREE_REGIONS, scrape, start_exporter, value, wait_for
from pathprobe import promql
from pathprobe.monitoring import prometheus, rules
from pathprobe_lab import demo, net
from pathprobe_lab.configs import exporter_config, lab_alert_params, scrape_targets
from pathprobe_lab.state import spawn
from pathprobe_lab.topology import address

pytestmark = pytest.mark.lab

TOPO = SIX_HOSTS_THREE_REGIONS
NEW = "c2"  # joins the mesh of the other five
SLOT = 6.0
ROTATION = 5 * SLOT  # 5 and 6 members: 5 rounds each
REGIONS = ["r1", "r2", "r3"]
GLOBAL_PORT, REGIONAL_PORTS = 19190, {"r1": 19191, "r2": 19192, "r3": 19193}
# Tests that ran: an attempt the peer's server cut as it connected (out of turn) held nobody.
TEST_LINE = re.compile(r"throughput test -> (\S+) (\S+): from ([0-9.]+) to ([0-9.]+) \(ran\)")


def config(host: str, work: Path, members: list[str], epoch: float | None = None) -> dict[str, Any]:
    cfg = exporter_config(
        TOPO,
        host,
        work,
        SLOT,
        {
            "throughput": {"streams": [1], "duration_seconds": 1, "omit_seconds": 0},
            "rtt": {"interval_seconds": 0.5},
            "loss": {"rate_pps": 5},
        },
    )
    cfg["peers"] = [p for p in cfg["peers"] if p["name"] in members]
    cfg["schedule"] = {"slot_seconds": SLOT, "jitter_seconds": 0.5, "timeout_margin_seconds": 1}
    if epoch is not None:
        cfg["mesh"] = {"epoch": epoch}
    return cfg


def start_prometheus(name: str, work: Path, port: int, cfg: dict[str, Any], *flags: str) -> str:
    (work / f"{name}.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    data = work / f"{name}-data"
    shutil.rmtree(data, ignore_errors=True)
    spawn(
        [
            demo.binary("prometheus"),
            f"--config.file={work / f'{name}.yml'}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            *flags,
        ],
        work / f"{name}.log",
        name,
    )
    url = f"http://127.0.0.1:{port}"
    demo.wait_ready(f"{url}/-/ready", name)
    return url


def metrics_of(host: str) -> str:
    return f"{address([h.name for h in TOPO.hosts].index(host) + 1)}:9469"


def logged_tests(work: Path) -> list[tuple[float, float, str, str]]:
    """(start, end, client, server) of every throughput test the hosts logged."""
    found = []
    for h in TOPO.hosts:
        log = work / f"{h.name}.log"
        for peer, _, start, end in TEST_LINE.findall(log.read_text() if log.exists() else ""):
            found.append((float(start), float(end), h.name, peer))
    return found


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("fleet")
    net.up(TOPO)
    try:
        rule_file = work / "pathprobe.rules.yml"
        rule_file.write_text(rules.dump(lab_alert_params(ROTATION)))
        global_url = start_prometheus(
            "global",
            work,
            GLOBAL_PORT,
            prometheus.render("global", interval="5s"),
            "--web.enable-remote-write-receiver",
        )
        regional = {}
        for region in REGIONS:
            targets = work / f"targets-{region}.json"
            targets.write_text(json.dumps([t for t in scrape_targets(TOPO) if t["labels"]["region"] == region]))
            cfg = prometheus.render(
                "regional",
                file_sd=str(targets),
                rule_files=[str(rule_file)],
                interval="5s",
                remote_write_url=f"{global_url}/api/v1/write",
                external_labels={"prometheus": f"regional-{region}"},
            )
            regional[region] = start_prometheus(f"regional-{region}", work, REGIONAL_PORTS[region], cfg)
        old = [h.name for h in TOPO.hosts if h.name != NEW]
        procs = {h: start_exporter(h, config(h, work, old), work) for h in old}
        # One rotation of the old mesh: every old host has run tests.
        wait_for(
            "a rotation of the 5-host mesh",
            lambda: {c for _, _, c, _ in logged_tests(work)} == set(old),
            timeout=3 * ROTATION,
        )
        epoch = math.ceil((time.time() + 20) / SLOT) * SLOT
        reloaded = {}
        for h in old:  # a rolling change: one host at a time, the next once this one has applied it
            (work / f"{h}.yaml").write_text(yaml.safe_dump(config(h, work, [*old, NEW], epoch)))
            procs[h].send_signal(signal.SIGHUP)
            wait_for(
                f"{h}'s reload applied",
                lambda h=h: "config reloaded" in (work / f"{h}.log").read_text(),
                timeout=10,
                every=0.1,
            )
            reloaded[h] = time.time()
        procs[NEW] = start_exporter(NEW, config(NEW, work, [*old, NEW], epoch), work)
        assert max(reloaded.values()) < epoch, "the rollout ran past the epoch: lengthen it"
        wait_for(
            "one rotation of the new mesh",
            lambda: time.time() > epoch + ROTATION + 2 * SLOT,
            timeout=epoch + ROTATION + 3 * SLOT - time.time(),
        )
        yield {"work": work, "epoch": epoch, "procs": procs, "global": global_url, "regional": regional}
    finally:
        net.down()


def test_no_host_is_ever_in_two_tests_during_the_rolling_change(fleet: dict[str, Any]) -> None:
    tests = logged_tests(fleet["work"])
    assert len(tests) > 20, tests
    for h in TOPO.hosts:
        mine = sorted((s, e, c, p) for s, e, c, p in tests if h.name in (c, p))
        overlapping = [(x, y) for x, y in pairwise(mine) if y[0] < x[1]]
        assert not overlapping, f"{h.name} was in two tests at once: {overlapping}"
    for h in TOPO.hosts:  # the servers agree: no test met a busy server
        got = scrape(metrics_of(h.name))
        assert value(got, "pathprobe_probe_runs_total", probe="throughput", result="busy") == 0, h.name
        assert value(got, "pathprobe_config_last_reload_successful") == 1, h.name


def test_the_new_member_waits_for_the_epoch_then_meets_every_host_within_a_rotation(fleet: dict[str, Any]) -> None:
    tests, epoch = logged_tests(fleet["work"]), fleet["epoch"]
    assert all(s >= epoch for s, _, c, p in tests if NEW in (c, p)), "the new host tested before the epoch"
    first_rotation = {(c, p) for s, _, c, p in tests if epoch <= s < epoch + ROTATION}
    every = {(a, b) for a, b in combinations([h.name for h in TOPO.hosts], 2)}
    assert every | {(b, a) for a, b in every} == first_rotation  # every pair, both directions, once per rotation


def test_the_global_prometheus_holds_every_region_pair_and_nothing_per_host(fleet: dict[str, Any]) -> None:
    pairs = {(r, p) for r in REGIONS for p in REGIONS}

    def region_pairs_in_global() -> bool:
        got = promql.query(fleet["global"], "region_pair:pathprobe_throughput_bits_per_second:max")
        return {(s["metric"]["region"], s["metric"]["peer_region"]) for s in got} == pairs

    wait_for("every region pair's throughput in the global Prometheus", region_pairs_in_global, timeout=60)
    names = promql.query(fleet["global"], 'count by (__name__) ({__name__=~".+"})')
    assert names and all(s["metric"]["__name__"].startswith("region_pair:") for s in names), names
    per_host = promql.query(fleet["global"], 'count({instance!=""} or {host!=""} or {peer!=""})')
    assert per_host == [], per_host
    loss = promql.query(fleet["global"], "region_pair:pathprobe_udp_loss_ratio:max_rate5m")
    assert {(s["metric"]["region"], s["metric"]["peer_region"]) for s in loss} == pairs
    for region, url in fleet["regional"].items():  # each regional server: its own region's exporters only
        got = promql.query(url, "count by (region) (pathprobe_peer_info)")
        assert [s["metric"]["region"] for s in got] == [region], got
        alerts = promql.query(url, 'ALERTS{alertstate="firing", alertname!~"PathprobeScheduleMismatch"}')
        assert not [a for a in alerts if a["metric"]["alertname"] == "PathprobeExporterDown"], alerts
    sources = promql.query(fleet["global"], "count by (prometheus) (region_pair:pathprobe_paths:count)")
    assert sorted(s["metric"]["prometheus"] for s in sources) == [f"regional-{r}" for r in REGIONS]
