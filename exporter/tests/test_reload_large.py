"""A reload of a 10,000-member config, and a burst of SIGHUPs during it, while a peer probes
this host: real `pathprobe run` exporters on loopback. The reload runs off the event loop, so
the responders answer throughout and the peer counts no failed RTT probe and no lost echo;
the burst costs two reloads, not ten; the schedule's gigabyte stays out of the exporter."""

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from loopback_mesh import samples, unused_port, wait_for

# Alone: its peer must count no failed RTT probe, a latency bound (a second) that the lowest priority
# beside labs breaks (CI's first phase: not even the four answers before the reload came within 20 s).
pytestmark = [pytest.mark.heavy, pytest.mark.alone]

MEMBERS = 10_000
REGIONS = 20


def members(n: int) -> list[dict[str, str]]:
    """Other regions' members at loopback addresses (nothing answers there: probes to them fail at once)."""
    return [
        {
            "name": f"m{i:05d}",
            "address": f"127.1.{i // 250}.{i % 250 + 1}",
            "region": f"r{1 + i % (REGIONS - 1)}",
            "path_class": "inter_region",
        }
        for i in range(n)
    ]


def config(host: dict, peers: list[dict], web: int, tmp: Path) -> dict:
    name, address = host["name"], host["address"]
    return {
        "host": {"name": name, "address": address, "region": "r0"},
        "peers": peers,
        "mesh": {"rtt": {"kind": "hierarchical"}},
        "probes": {
            "throughput": {"enabled": False},
            "rtt": {"interval_seconds": 0.5},
            "loss": {"rate_pps": 5},
            "mtu": {"enabled": False},
        },
        # Probes to 127.0.0.1 leave from 127.0.0.1 whatever the prober's host address: allowed here.
        "responders": {
            "listen": address,
            "rr_port": host["rr_port"],
            "echo_port": host["echo_port"],
            "allow": ["127.0.0.0/8"],
        },
        "iperf3": {"port": host["iperf3_port"]},
        "web": {"listen": f"127.0.0.1:{web}"},
        "budget": {"state_file": str(tmp / f"{name}-budget.json")},
    }


def failures(got: dict, peer: str) -> dict:
    """What the prober counted against `peer` when its responders did not answer: series -> count."""
    return {
        (n, ls): v
        for (n, ls), v in got.items()
        if v
        and ("peer", peer) in ls
        and (
            n in ("pathprobe_udp_packets_lost_forward_total", "pathprobe_udp_packets_lost_reverse_total")
            or (n == "pathprobe_probe_runs_total" and ("probe", "rtt") in ls and ("result", "ok") not in ls)
        )
    }


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[dict]:
    web = {h: unused_port() for h in "ab"}
    peer = {
        h: {
            "name": h,
            "address": address,
            "region": "r0",
            "path_class": "intra_region",
            "rr_port": unused_port(),
            "echo_port": unused_port(),
            "iperf3_port": unused_port(),
        }
        for h, address in (("a", "127.0.0.1"), ("b", "127.0.0.2"))
    }
    paths = {h: tmp_path / f"{h}.yaml" for h in "ab"}
    small = config(peer["a"], [peer["b"]], web["a"], tmp_path)
    large = config(peer["a"], [peer["b"], *members(MEMBERS - 2)], web["a"], tmp_path)
    paths["a"].write_text(yaml.safe_dump(small))
    paths["b"].write_text(yaml.safe_dump(config(peer["b"], [peer["a"]], web["b"], tmp_path)))
    run = [sys.executable, "-m", "pathprobe", "run", "--config"]
    procs = {
        h: subprocess.Popen([*run, str(paths[h])], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for h in "ab"
    }
    try:
        yield {"procs": procs, "web": web, "path": paths["a"], "small": small, "large": large}
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for h, p in procs.items():
            _, err = p.communicate(timeout=20)
            assert "Traceback" not in err, (h, err[-3000:])


def answered(got: dict) -> float:
    """RTT probes of a that b counted answered."""
    return got.get(("pathprobe_probe_runs_total", frozenset({("probe", "rtt"), ("peer", "a"), ("result", "ok")})), 0)


def worst_lateness(got: dict) -> str:
    """How late the exporter's event loop ran at worst: the least bucket of
    pathprobe_event_loop_lateness_seconds that holds every pass."""
    buckets = {dict(ls)["le"]: v for (n, ls), v in got.items() if n == "pathprobe_event_loop_lateness_seconds_bucket"}
    every = buckets["+Inf"]
    return next(f"<= {le} s" for le, n in sorted(buckets.items(), key=lambda b: float(b[0])) if n == every)


def reloads(got: dict) -> float:
    return got.get(("pathprobe_config_reloads_total", frozenset({("result", "success")})), 0.0)


def test_a_large_reload_and_a_sighup_burst_leave_the_responders_answering(pair: dict) -> None:
    a, web = pair["procs"]["a"], pair["web"]
    # b's probes of a run: RTT answered, echoes counted.
    got = wait_for(web["b"], "b's RTT probes of a answered", lambda got: answered(got) >= 4)
    before, answered_before = failures(got, "a"), answered(got)
    rss_small = rss_bytes(a.pid)

    pair["path"].write_text(yaml.safe_dump(pair["large"]))
    started = time.monotonic()
    for _ in range(10):  # a burst: the first starts a reload, the other nine ask for one more
        a.send_signal(signal.SIGHUP)
        time.sleep(0.1)
    got = wait_for(web["a"], "the burst's reloads", lambda got: reloads(got) >= 2, seconds=120)
    reload_seconds = time.monotonic() - started
    rss_large = rss_bytes(a.pid)
    time.sleep(2)  # a late third reload would be counted by now
    assert reloads(samples(web["a"])) == 2

    pair["path"].write_text(yaml.safe_dump(pair["small"]))
    a.send_signal(signal.SIGHUP)
    wait_for(web["a"], "back to one peer", lambda got: reloads(got) == 3, seconds=60)
    rss_back = rss_bytes(a.pid)
    # b went on probing a meanwhile: RTT answers and echoes, none failed or lost.
    got = wait_for(web["b"], "b's RTT probes after the reloads", lambda got: answered(got) > answered_before + 4)
    late = f"event loops late: a {worst_lateness(samples(web['a']))}, b {worst_lateness(got)}"
    print(
        f"\nreloads of {MEMBERS} members (burst of 10 SIGHUPs): {reload_seconds:.1f} s; RSS {rss_small / 2**20:.0f} "
        f"-> {rss_large / 2**20:.0f} -> {rss_back / 2**20:.0f} MiB; {late}"
    )
    assert failures(got, "a") == before, f"b counted failed RTT probes or lost echoes of a during a's reloads ({late})"
    # The schedule's 2.5 million pairs (a gigabyte) never enter the exporter: its own process computes them.
    assert rss_large - rss_small < 100 * 2**20, (rss_small, rss_large, rss_back)


def test_the_swap_on_the_event_loop_neither_chooses_the_mesh_nor_keeps_a_window_per_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a reload prepares off the loop is all the swap needs: choosing a large mesh's peers
    again on the loop (0.3 s of a busy VM at 10,000 members) or one RTT window per member (0.6 s)
    held the responders long enough for a peer's RTT probe of this host to time out."""
    from pathprobe import config as config_module
    from pathprobe import mesh
    from pathprobe.exporter import Exporter, Prepared, schedule_view
    from pathprobe.reloads import load_with_peers

    a = {"name": "a", "address": "127.0.0.1", "region": "r0", "rr_port": 7001, "echo_port": 7002, "iperf3_port": 7003}
    b = {"name": "b", "address": "127.0.0.2", "region": "r0", "path_class": "intra_region"}
    paths = {size: tmp_path / f"{size}.yaml" for size in ("small", "large")}
    paths["small"].write_text(yaml.safe_dump(config(a, [b], 9100, tmp_path)))
    paths["large"].write_text(yaml.safe_dump(config(a, [b, *members(500)], 9100, tmp_path)))
    exporter = Exporter(config_module.load(paths["small"], check_files=True))
    cfg = load_with_peers(paths["large"])
    prepared = Prepared(cfg, schedule_view(config_module.load(paths["large"])))  # a copy's, as in its own process

    def chosen_on_the_loop(*_: object) -> None:
        raise AssertionError("the mesh's peers were chosen during the swap")

    monkeypatch.setattr(mesh, "peers", chosen_on_the_loop)
    monkeypatch.setattr(mesh, "links", chosen_on_the_loop)
    exporter.apply(prepared)
    assert 2 < len(cfg.probed_peers) < 100
    assert set(exporter.tracker.windows) == {p.name for p in cfg.probed_peers}
    # A turn of the schedule in force until the new list's epoch can name a member the new config does
    # not probe: it is rated without a window (its test's own RTT), not failed.
    unprobed = next(p for p in cfg.peers if p not in cfg.probed_peers)
    exporter.tracker.rate_all(unprobed, cfg.throughput_for(unprobed).tests())
    assert exporter.tracker.rtt_median(unprobed.name) is None
