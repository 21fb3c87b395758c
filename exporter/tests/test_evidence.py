"""The evidence store (evidence.py): records kept whole, bounded, read back after a restart, a
corrupt one skipped and a full disk counted; /tests and /tests/<id> behind /metrics' auth; the
turns keep every test's record and /metrics names the last one's id."""

import base64
import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from certs import bcrypt_hash
from loopback_mesh import request, serve, unused_port, wait_for
from prometheus_client import CollectorRegistry
from test_collector import StandIn, config, result, run_turns_until, samples, value
from virtual_time import VirtualTime

from pathprobe import evidence
from pathprobe.commands import main
from pathprobe.evidence import EvidenceStore, StoreError, new_id
from pathprobe.exporter import Exporter
from pathprobe.web import Snapshot, make_app
from pathprobe.webconfig import WebConfigSource

T0 = 1_764_000_000.0
RESULT = {"receiver_bytes_per_second": 5e8, "bound": "none", "intervals": [{"rtt": 70000}]}


def a_record(started: float, peer: str = "b", outcome: str = "ran", pad: int = 0) -> dict[str, Any]:
    return evidence.record(
        test_id=new_id(started),
        host="a",
        key=(peer, "tcp", "8", "send"),
        started=started,
        ended=started + 10,
        outcome=outcome,
        settings={"duration_seconds": 10.0, "note": "x" * pad},
        result=RESULT if outcome == "ran" else None,
        expected={"bits_per_second": 5e9, "limit": "per_flow"},
    )


def store(tmp_path: Path, max_tests: int = 100, max_bytes: int = 2**20) -> EvidenceStore:
    return EvidenceStore(tmp_path / "tests", max_tests, max_bytes).open()


def test_a_record_is_kept_whole_and_read_back_after_a_restart(tmp_path: Path) -> None:
    s = store(tmp_path)
    first, second = s.add(a_record(T0)), s.add(a_record(T0 + 60, outcome="timeout"))
    assert [x.id for x in s.summaries()] == [second.id, first.id]  # newest first
    again = store(tmp_path)  # a restart
    assert again.get(first.id) == s.get(first.id) and again.get(first.id)["outcome"] == "ran"  # type: ignore[index]
    assert [x.to_json()["result"] for x in again.summaries()] == ["timeout", "ran"]
    assert again.summaries()[1].bits_per_second == 4e9 and again.summaries()[1].limit == "per_flow"
    assert again.last_by_test() == {("b", "tcp", "8", "send"): second.id}
    assert not list((tmp_path / "tests").glob(".*"))  # no temporary file left


def test_the_oldest_go_first_by_count_and_by_bytes(tmp_path: Path) -> None:
    s = store(tmp_path, max_tests=3)
    ids = [s.add(a_record(T0 + i)).id for i in range(5)]
    assert [x.id for x in s.summaries()] == ids[:1:-1] and s.evicted == 2
    assert sorted(p.name for p in (tmp_path / "tests").iterdir()) == [f"{i}.json" for i in ids[2:]]
    big = store(tmp_path / "big", max_tests=100, max_bytes=2**20)
    kept = [big.add(a_record(T0 + i, pad=300_000)).id for i in range(5)]
    records, size = big.stats()
    assert records == 3 and size <= 2**20 and [x.id for x in big.summaries()] == kept[:1:-1]


def test_a_corrupt_record_is_skipped_counted_and_removed(tmp_path: Path) -> None:
    s = store(tmp_path)
    good = s.add(a_record(T0)).id
    cut = s.add(a_record(T0 + 1)).id
    path = tmp_path / "tests" / f"{cut}.json"
    path.write_bytes(path.read_bytes()[:40])  # a record cut short (not by the store: it renames whole files)
    other = tmp_path / "tests" / f"{new_id(T0 + 2)}.json"
    other.write_text(json.dumps({"id": "someone-else"}))
    (tmp_path / "tests" / ".x.json.abc.tmp").write_text("{")  # a write the machine's crash cut short
    again = store(tmp_path)
    assert [x.id for x in again.summaries()] == [good] and again.errors["corrupt"] == 2
    assert sorted(p.name for p in (tmp_path / "tests").iterdir()) == [f"{good}.json"]


def test_a_full_disk_is_counted_and_the_store_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = store(tmp_path)
    kept = s.add(a_record(T0)).id

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(evidence, "write_atomic", full)
    with pytest.raises(StoreError) as err:
        s.add(a_record(T0 + 1))
    assert err.value.reason == "no_space" and s.errors["no_space"] == 1
    monkeypatch.undo()
    assert s.add(a_record(T0 + 2)).id and kept in {x.id for x in s.summaries()}
    with pytest.raises(StoreError) as err:
        store(tmp_path, max_bytes=2**20).add(a_record(T0 + 3, pad=2**20))
    assert err.value.reason == "too_large"


def test_a_directory_that_cannot_be_made_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    s = EvidenceStore(tmp_path / "file" / "tests", 10, 2**20).open()
    assert s.problem is not None
    with pytest.raises(StoreError):
        s.add(a_record(T0))
    assert s.errors["io_error"] == 1


def call(app: Any, path: str, auth: str | None = None, query: str = "") -> tuple[str, Any]:
    environ = {"PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": "GET"}
    if auth:
        environ["HTTP_AUTHORIZATION"] = "Basic " + base64.b64encode(auth.encode()).decode()
    status: list[str] = []
    body = b"".join(app(environ, lambda s, h: status.append(s)))
    return status[0], json.loads(body) if body.startswith(b"{") else body


def test_tests_are_served_behind_the_same_auth_as_metrics(tmp_path: Path) -> None:
    s = store(tmp_path)
    old, new = s.add(a_record(T0, peer="c")).id, s.add(a_record(T0 + 60)).id
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prom": bcrypt_hash("s3cret")}}))
    snapshot = Snapshot(CollectorRegistry(), refresh=5)
    try:
        app = make_app(snapshot, WebConfigSource(web), evidence=s)
        assert call(app, "/tests")[0].startswith("401") and call(app, f"/tests/{new}")[0].startswith("401")
        status, listed = call(app, "/tests", auth="prom:s3cret")
        assert status.startswith("200") and [t["id"] for t in listed["tests"]] == [new, old]
        assert listed["tests"][0] | {"time": ""} == {
            "id": new, "peer": "b", "time": "", "protocol": "tcp", "streams": 8, "direction": "send", "result": "ran",
            "bits_per_second": 4e9, "bound": "none", "limit": "per_flow",
        }  # fmt: skip
        assert [t["id"] for t in call(app, "/tests", "prom:s3cret", "peer=c")[1]["tests"]] == [old]
        status, whole = call(app, f"/tests/{new}", auth="prom:s3cret")
        assert status.startswith("200") and whole["result"]["intervals"] == [{"rtt": 70000}]
        assert call(app, "/tests/../budget.json", auth="prom:s3cret")[0].startswith("404")
        assert call(app, f"/tests/{new_id(T0)}", auth="prom:s3cret")[0].startswith("404")
        assert call(app, "/tests", "prom:s3cret", "since=soon")[0].startswith("400")
    finally:
        snapshot.close()


def test_the_turns_keep_every_test_and_metrics_name_the_last(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        schedule={"slot_seconds": 4, "jitter_seconds": 0, "timeout_margin_seconds": 1},
        probes={"throughput": {"streams": [1], "duration_seconds": 0.5, "omit_seconds": 0}},
    )
    virtual = VirtualTime()
    e = Exporter(cfg, clock=virtual.time, sleep=virtual.sleep)
    outcomes = iter([result(rtt=0.07), "timeout"] * 10)
    e.turns.make_prober = StandIn(lambda test: next(outcomes))
    assert e.evidence is not None
    store = e.evidence

    def done() -> bool:  # three kept, and the room told of the last (after the store's write, in a thread)
        kept = store.summaries()
        return len(kept) >= 3 and kept[0].id in e.rooms.evidence.last.values()

    run_turns_until(e, virtual, done)
    kept = store.summaries()
    assert {k.result for k in kept} == {"ran", "timeout"}
    ran = store.get(next(k.id for k in kept if k.result == "ran"))
    assert ran is not None and ran["result"]["retransmits"] == 7 and ran["expected"]["limit"]
    failed = store.get(next(k.id for k in kept if k.result == "timeout"))
    assert failed is not None and failed["failure"] == "stand-in" and failed["settings"]["duration_seconds"] == 0.5
    got = samples(e)
    newest = {s.peer: s.id for s in reversed(kept)}
    for peer, test_id in newest.items():
        assert value(got, "pathprobe_evidence_last_test_info", peer=peer, test_id=test_id) == 1
    assert value(got, "pathprobe_evidence_records") == len(kept)
    # A restart: the last ids are the ones kept before it.
    restarted = samples(Exporter(cfg, clock=virtual.time, sleep=virtual.sleep))
    assert value(restarted, "pathprobe_evidence_last_test_info", peer="b", test_id=newest["b"]) == 1


FULL_DISK = """
import sys
import tarfile
import time
from pathprobe import evidence
s = evidence.EvidenceStore(evidence.Path(sys.argv[1]), 1000, 2**30).open()
ids = []
for i in range(200):
    try:
        ids.append(s.add(evidence.record(test_id=evidence.new_id(1.7e9 + i), host="a", key=("b", "tcp", "1", "send"),
            started=1.7e9 + i, ended=1.7e9 + i, outcome="ran", settings={"pad": "x" * 20000})).id)
    except evidence.StoreError as exc:
        assert exc.reason == "no_space", exc.reason
again = evidence.EvidenceStore(evidence.Path(sys.argv[1]), 1000, 2**30).open()
print(len(ids), s.errors["no_space"], len(again.summaries()), again.errors["corrupt"])
"""


@pytest.mark.lab
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_real_full_disk_leaves_every_kept_record_whole(tmp_path: Path) -> None:
    """A 256 KiB tmpfs in a mount namespace of its own (root): the writes that do not fit are
    counted as no_space, and every record kept reads back whole after a restart."""
    where = tmp_path / "small"
    where.mkdir()
    out = subprocess.run(
        ["unshare", "--mount", "--", "sh", "-c", 'mount -t tmpfs -o size=256k small "$1" && exec "$2" -c "$3" "$1"',
         "sh", str(where), sys.executable, FULL_DISK],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    kept, full, read_back, corrupt = map(int, out.stdout.split())
    assert 0 < kept < 200 and full == 200 - kept and read_back == kept and corrupt == 0


def test_the_bundle_holds_the_peers_tests_since_a_time_and_says_what_is_missing(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    path = tmp_path / "pathprobe.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_defaults=True)))
    s = EvidenceStore(cfg.evidence.path(cfg.budget, cfg.host.name), 100, 2**20).open()
    now = time.time()
    recent = s.add(a_record(now - 600)).id
    s.add(a_record(now - 300, peer="c"))
    s.add(a_record(now - 3 * 3600))  # before --since
    out = tmp_path / "bundle.tar.gz"
    unreachable = "http://127.0.0.1:9"  # nothing listens on the discard port
    assert main(["evidence", "--config", str(path), "--since", "2h", "--peer", "b", "--out", str(out),
                 "--prometheus", unreachable]) == 0  # fmt: skip
    with tarfile.open(out) as tar:
        names = sorted(tar.getnames())
        manifest = json.load(tar.extractfile("evidence/MANIFEST.json"))  # type: ignore[arg-type]
        record = json.load(tar.extractfile(f"evidence/tests/{recent}.json"))  # type: ignore[arg-type]
    assert names == sorted(["evidence/MANIFEST.json", "evidence/ena.json", f"evidence/tests/{recent}.json"])
    assert manifest["tests"] == 1 and manifest["peer"] == "b" and record["result"]["intervals"] == [{"rtt": 70000}]
    assert set(manifest["missing"]) == {"rtt_loss", "ena"} and unreachable in manifest["missing"]["rtt_loss"]
    assert main(["evidence", "--config", str(path), "--peer", "nobody", "--out", str(out)]) == 2


def test_a_real_exporter_keeps_its_tests_records_and_serves_them_after_a_restart(tmp_path: Path) -> None:
    """Real processes on loopback: `pathprobe run` (h0) tests `pathprobe serve` (h1) with real iperf3
    (fixed-length: iperf3 -J, its streams' cwnd and RTT). /tests lists the record, /tests/<id> has
    the whole result, /metrics names its id; a restart serves the same record and id."""
    h1 = {"rr_port": unused_port(), "echo_port": unused_port(), "iperf3_port": unused_port()}
    web = unused_port()
    cfg = tmp_path / "pathprobe.yaml"
    settings = {
        "host": {"name": "h0", "address": "127.0.0.1", "region": "r1"},
        "peers": [{"name": "h1", "address": "127.0.0.2", "region": "r2", "path_class": "inter_region", **h1}],
        "probes": {
            "throughput": {"streams": [2], "duration_seconds": 1, "omit_seconds": 0, "steady_state": FIXED},
            "rtt": {"interval_seconds": 0.5}, "loss": {"rate_pps": 2}, "mtu": {"enabled": False},
        },
        "schedule": {"slot_seconds": 10, "jitter_seconds": 0, "timeout_margin_seconds": 1},
        "responders": {"listen": "127.0.0.1", "rr_port": unused_port(), "echo_port": unused_port()},
        "iperf3": {"port": unused_port()},
        "web": {"listen": f"127.0.0.1:{web}"},
        "budget": {"state_file": str(tmp_path / "budget.json")},
    }  # fmt: skip
    cfg.write_text(yaml.safe_dump(settings))
    run = [sys.executable, "-m", "pathprobe", "run", "--config", str(cfg)]
    server = serve("127.0.0.2", h1)
    try:
        with running(run):
            got = wait_for(web, "a test's record named", lambda s: any(n == LAST for n, _ in s), seconds=60)
            [test_id] = [dict(labels)["test_id"] for n, labels in got if n == LAST]
            status, body = request(web, "GET", "/tests")
            assert status == 200 and json.loads(body)["tests"][0]["id"] == test_id
            status, body = request(web, "GET", f"/tests/{test_id}")
        record = json.loads(body)
        assert status == 200 and (record["peer"], record["streams"], record["outcome"]) == ("h1", 2, "ran")
        streams = record["result"]["intervals"][0]["streams"]
        assert len(streams) == 2 and all(s["snd_cwnd"] > 0 and s["rtt"] > 0 for s in streams), streams
        assert record["result"]["iperf3_cpu_percent"]["host_total"] > 0 and record["expected"]["limit"]
        # A restart that takes no test: the newest record kept before it is the id on /metrics.
        newest = max(p.name.removesuffix(".json") for p in (tmp_path / "tests" / "h0").glob("*.json"))
        settings["probes"]["throughput"]["enabled"] = False  # type: ignore[index]
        cfg.write_text(yaml.safe_dump(settings))
        with running(run):
            got = wait_for(web, "the kept id", lambda s: any(n == LAST for n, _ in s), seconds=20)
            assert dict(next(labels for n, labels in got if n == LAST))["test_id"] == newest
            assert request(web, "GET", f"/tests/{test_id}")[0] == 200
    finally:
        server.terminate()
        server.wait(timeout=10)


LAST = "pathprobe_evidence_last_test_info"
FIXED = {"enabled": False}  # iperf3 -J: each interval's streams with their cwnd and RTT


@contextlib.contextmanager
def running(command: list[str]) -> Iterator[None]:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err[-2000:]
