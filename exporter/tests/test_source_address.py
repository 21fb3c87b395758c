"""A multi-homed host: its peers know it by an address that is not the one the route picks.
Real processes on loopback (loopback_mesh.py): h0 is known as 127.0.0.3, h1 as 127.0.0.2,
each admits only the other. Every probe and test of h0 must reach h1's responders from
127.0.0.3, so h1 admits them all and refuses none."""

from pathlib import Path

from loopback_mesh import SLOT, Samples, config, count, exporter, member, unused_port, wait_for


def test_a_host_known_by_a_second_address_is_admitted_by_its_peer(tmp_path: Path) -> None:
    h0, h1 = member("h0", "127.0.0.3"), member("h1", "127.0.0.2")
    web0, web1 = unused_port(), unused_port()
    with (
        exporter(config(tmp_path, h1, [h0], web1), tmp_path / "h1.log"),
        exporter(config(tmp_path, h0, [h1], web0), tmp_path / "h0.log"),
    ):
        requests = "pathprobe_responder_requests_total"

        def admitted_everything(got: Samples) -> bool:
            return all(
                count(got, requests, responder=r, result=ok) > 0
                for r, ok in (("rr", "accepted"), ("echo", "accepted"), ("iperf3", "ok"))
            )

        got = wait_for(web1, "h1 admitted h0's rr, echo and iperf3 tests", admitted_everything, seconds=4 * SLOT)
        refused = {r: count(got, requests, responder=r, result="not_allowed") for r in ("rr", "echo", "iperf3")}
        assert refused == {"rr": 0, "echo": 0, "iperf3": 0}
        runs = "pathprobe_probe_runs_total"
        got = wait_for(
            web0, "h0's throughput test against h1 ran", lambda g: count(g, runs, probe="throughput", result="ok") > 0
        )
        failed = {p: count(got, runs, probe=p, result="not_allowed") for p in ("rtt", "loss", "throughput")}
        assert failed == {"rtt": 0, "loss": 0, "throughput": 0}
