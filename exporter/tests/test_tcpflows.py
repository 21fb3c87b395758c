"""The host's own TCP flows (tcpflows.py, flowreader.py, the flows room): parsed from real
loopback connections through sock_diag, and from built messages for what loopback cannot show
(a kernel before 4.10, ten thousand flows, a reused cookie)."""

import asyncio
import ipaddress
import json
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pathprobe import flowreader, limits, sockdiag, tcpflows
from pathprobe.config import Config
from pathprobe.metrics.flows import FlowsRoom
from pathprobe.tcpflows import Delta, Destination

# A loopback address of its own (all of 127/8 is loopback): other processes' loopback flows are not this test's.
LO = f"127.{random.randrange(64, 250)}.{random.randrange(1, 250)}.{random.randrange(1, 250)}"


def config(tmp_path: Path, **extra: object) -> Config:
    return Config.model_validate(
        {
            "host": {"name": "a", "address": "198.18.1.2", "region": "r1"},
            "peers": [{"name": "lo", "address": LO, "region": "r2", "path_class": "inter_region"}],
            "budget": {"state_file": str(tmp_path / "budget.json")},
            **extra,
        }
    )


def message(cookie: int, remote: str, dport: int, info: bytes, sport: int = 40000) -> bytes:
    """An inet_diag_msg of an IPv4 socket with its INET_DIAG_INFO attribute."""
    ids = struct.pack("!HH", sport, dport) + socket.inet_aton("198.18.1.2") + bytes(12)
    ids += socket.inet_aton(remote) + bytes(12) + struct.pack("=III", 0, cookie & 0xFFFFFFFF, cookie >> 32)
    head = struct.pack("=BBBB", socket.AF_INET, 1, 0, 0) + ids + bytes(20)
    return head + struct.pack("=HH", 4 + len(info), 2) + info + bytes(-len(info) % 4)


def info(acked: int = 0, size: int = 232) -> bytes:
    """A tcp_info of `size` bytes (232: Linux 5.x; 160: before 4.10) with these bytes acked, 74 ms srtt."""
    b = bytearray(size)
    struct.pack_into("=I", b, 68, 74000)
    struct.pack_into("=Q", b, 120, acked)
    return bytes(b)


def samples(room: FlowsRoom) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import CollectorRegistry

    r = CollectorRegistry(auto_describe=False)
    r.register(room)
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("peer_region", "path_class")))): s.value
        for family in text_string_to_metric_families(generate_latest(r).decode())
        for s in family.samples
    }


def test_a_real_connection_to_a_slow_reader_reads_receive_window_limited(tmp_path: Path) -> None:
    """A loopback flow to a reader that does not read: its bytes counted once, by difference,
    and its time limited by the receive window, on the peer's series."""
    cfg = config(tmp_path)

    async def go() -> tuple[flowreader.Reading, flowreader.Reading]:
        reading = asyncio.Event()

        async def slow_sink(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await reading.wait()
            while await r.read(1 << 20):
                pass
            w.close()

        server = await asyncio.start_server(slow_sink, LO, 0, limit=1 << 16)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection(LO, port)
        reader = flowreader.FlowReader(cfg)
        reader.read()  # the baseline: a flow older than the first read is counted from it on
        writer.write(b"x" * 64_000_000)
        await asyncio.sleep(0.5)
        first = reader.read()
        reading.set()
        await writer.drain()
        await asyncio.sleep(0.2)
        second = reader.read()
        writer.close()
        server.close()
        return first, second

    first, second = asyncio.run(go())
    lo = Destination("lo", "r2", "inter_region")
    s = first.sums[lo]
    assert s.flows == 1  # the sender (its receiver's end sees 127.0.0.1, the source the kernel chose)
    assert s.limited["receive_window"] > 0.25, s.limited
    assert s.rtt_stats()["min"] > 0
    total = s.acked + second.sums[lo].acked
    assert 64_000_000 <= total < 64_000_000 + 10_000, total  # each byte once (the handshake's bytes aside)
    room = FlowsRoom(cfg)
    room.record(first)
    room.record(second)
    got = samples(room)
    assert got[("pathprobe_tcp_flows_bytes_acked_total", (("peer", "lo"),))] == total
    assert got[("pathprobe_tcp_flows_limited_seconds_total", (("limit", "receive_window"), ("peer", "lo")))] > 0.25
    assert got[("pathprobe_tcp_flows_sampled_ratio", ())] == 1


def test_pathprobes_own_probe_and_responder_sockets_are_left_out(tmp_path: Path) -> None:
    """A connection to the peer's rr port is a probe's; one to this host's is a peer's probe."""
    with socket.create_server((LO, 0)) as server:
        port = server.getsockname()[1]
        cfg = config(tmp_path, responders={"rr_port": port, "echo_port": port})
        with socket.create_connection((LO, port)) as client:
            conn, _ = server.accept()
            with conn:
                client.sendall(b"x" * 1000)
                reading = flowreader.FlowReader(cfg).read()
    assert reading.matched == 0, reading
    assert reading.sockets >= 2


def test_the_kernel_returns_only_the_sockets_to_the_destinations_asked_for() -> None:
    """A filter of three conditions (a peer's address, a /24 around another, one nobody uses): the
    dump holds the connections to the first two, not the one to a third address."""
    first, second, third, _ = LO.split(".")
    a, b = LO, f"{first}.{second}.{third}.7" if LO[-2:] != ".7" else f"{first}.{second}.{third}.8"
    c = f"{first}.{second}.{int(third) % 249 + 1}.9"  # another /24
    wanted = [ipaddress.ip_network(a), ipaddress.ip_network(b + "/24", strict=False), ipaddress.ip_network("10.9.9.9")]
    servers = [socket.create_server((address, 0)) for address in (a, b, c)]
    clients = [socket.create_connection(s.getsockname()) for s in servers]
    accepted = [s.accept()[0] for s in servers]
    try:
        request = sockdiag.established_request(socket.AF_INET, wanted)
        remotes = {str(ipaddress.ip_address(tcpflows.remote_key(m)[1])) for m in sockdiag.dump(request)}
        every = sockdiag.dump(sockdiag.established_request(socket.AF_INET))
        unfiltered = {str(ipaddress.ip_address(tcpflows.remote_key(m)[1])) for m in every}
    finally:
        for sock in servers + clients + accepted:
            sock.close()
    assert {a, b} <= remotes and c not in remotes, remotes
    assert all(ipaddress.ip_address(r) in wanted[1] or r == a for r in remotes), remotes
    assert c in unfiltered


def test_a_kernel_before_4_10_gives_flows_and_bytes_without_limited_times(tmp_path: Path) -> None:
    flow = tcpflows.parse(message(7, "127.0.0.1", 443, info(acked=10, size=160)))
    assert flow is not None
    assert (flow.acked, flow.chrono, flow.cookie, flow.remote_port) == (10, False, 7, 443)


def test_limits_divide_the_interval() -> None:
    d = Delta(acked=1, received=0, retransmitted=0, busy_us=8_000_000, rwnd_limited_us=6_000_000, sndbuf_limited_us=0)
    assert tcpflows.limited(d, 10.0) == {
        "receive_window": 6.0,
        "send_buffer": 0.0,
        "network": 2.0,
        "application": 2.0,
    }
    idle = Delta(0, 0, 0, 0, 0, 0)
    assert tcpflows.limited(idle, 10.0)["application"] == 0.0  # idle: waiting, not limited
    assert tcpflows.bound(tcpflows.limited(d, 10.0)) == "receive_window"
    assert tcpflows.bound(tcpflows.limited(idle, 10.0)) == "none"


def test_time_a_window_no_larger_than_cwnd_bounded_is_the_windows() -> None:
    """The kernel counts it as cwnd-limited (its cwnd test comes first); the window bounds it."""
    b = bytearray(info(acked=5))
    struct.pack_into("=I", b, 16, 1448)  # mss
    struct.pack_into("=I", b, 80, 100)  # cwnd, segments
    struct.pack_into("=I", b, 228, 100 * 1448)  # the peer's window: as much
    flow = tcpflows.parse(message(3, LO, 443, bytes(b)))
    assert flow is not None and flow.window_bound
    d = Delta(acked=1, received=0, retransmitted=0, busy_us=10_000_000, rwnd_limited_us=0, sndbuf_limited_us=0)
    assert tcpflows.limited(d, 10.0, flow.window_bound)["receive_window"] == 10.0
    struct.pack_into("=I", b, 228, 1000 * 1448)  # a window ten times the cwnd: the network's
    wide = tcpflows.parse(message(3, LO, 443, bytes(b)))
    assert wide is not None and not wide.window_bound


def test_a_counter_that_goes_back_counts_from_zero() -> None:
    before = tcpflows.parse(message(1, "127.0.0.1", 80, info(acked=1000)))
    now = tcpflows.parse(message(1, "127.0.0.1", 80, info(acked=300)))
    assert before is not None and now is not None
    assert tcpflows.delta(now, before).acked == 300


def test_the_buffer_a_long_path_needs() -> None:
    """1 Gbps over 74 ms with half a buffer in flight: 18.5 MB, rounded up to 18 MiB."""
    assert tcpflows.buffer_needed(1e9, 0.074, 0.5) == 18 * 2**20


def test_past_max_sockets_a_stable_sample_is_read_and_scaled(tmp_path: Path) -> None:
    cfg = config(tmp_path, flows={"max_sockets": 1000})
    acked = [0]

    def dump(family: int) -> list[bytes]:
        if family != socket.AF_INET:
            return []
        return [message(c, LO, 8080, info(acked=acked[0])) for c in range(1, 10_001)]

    reader = flowreader.FlowReader(cfg, dump)
    first = reader.read()
    acked[0] = 100
    second = reader.read()
    lo = Destination("lo", "r2", "inter_region")
    assert first.ratio == second.ratio == 0.1
    assert 8_000 < second.sums[lo].flows < 12_000
    assert second.sums[lo].acked == second.sums[lo].flows * 100  # the same sockets both times
    assert len(reader.last) == second.sums[lo].flows * 0.1


def test_a_configured_network_is_one_destination(tmp_path: Path) -> None:
    cfg = config(tmp_path, flows={"networks": [{"name": "tokyo-a", "networks": ["10.1.0.0/16"], "region": "r9"}]})

    def dump(family: int) -> list[bytes]:
        if family != socket.AF_INET:
            return []
        return [message(1, "10.1.2.3", 5432, info()), message(2, "10.2.0.1", 5432, info())]

    reading = flowreader.FlowReader(cfg, dump).read()
    assert reading.sums.keys() == {Destination("tokyo-a", "r9", "inter_region")}


def test_pathprobe_flows_names_the_window_a_real_window_limited_flow_needs() -> None:
    """`pathprobe flows --to`, a real process, on a real loopback flow to a receiver whose buffer is
    small and which reads slowly: receive_window, and the tcp_rmem max that lifts it."""
    with socket.create_server((LO, 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection((LO, port)) as client:
            conn, _ = server.accept()
            with conn:
                client.setblocking(False)
                stop = time.monotonic() + 20

                def fill() -> None:  # keep the window full while the command reads, bounded in time
                    while time.monotonic() < stop:
                        try:
                            client.send(b"x" * 65536)
                        except BlockingIOError:
                            conn.recv(16384)
                            time.sleep(0.002)

                filler = threading.Thread(target=fill, daemon=True)
                filler.start()
                cmd = [str(Path(sys.executable).parent / "pathprobe"), "flows", "--to", LO, "--rate", "1G", "--json"]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
                stop = 0.0
                filler.join(5)
    flows = [f for f in json.loads(out)["flows"] if f["remote"] == f"{LO}:{port}"]
    assert len(flows) == 1, out
    assert flows[0]["limit"] == "receive_window", out
    rtt = flows[0]["rtt_seconds"]
    assert flows[0]["needed_bytes"] == tcpflows.buffer_needed(1e9, rtt, limits.window_share())
    assert "net.ipv4.tcp_rmem max >=" in flows[0]["setting"]


def test_a_reload_that_adds_a_peer_takes_its_open_flows_as_a_baseline(tmp_path: Path) -> None:
    """Flows to a peer added by a reload are older than it: their lifetime's bytes are not the next
    read's. Counted from the read after."""
    acked = {LO: 5_000, "198.18.9.9": 7_000_000}

    def dump(family: int) -> list[bytes]:
        if family != socket.AF_INET:
            return []
        return [
            message(1, LO, 8080, info(acked=acked[LO])),
            message(2, "198.18.9.9", 8080, info(acked=acked["198.18.9.9"])),
        ]

    reader = flowreader.FlowReader(config(tmp_path), dump)
    reader.read()
    added = {"name": "new", "address": "198.18.9.9", "region": "r3", "path_class": "inter_region"}
    peers = [{"name": "lo", "address": LO, "region": "r2", "path_class": "inter_region"}, added]
    reader.use(config(tmp_path, peers=peers))
    baseline = reader.read()
    acked["198.18.9.9"] += 1_000
    after = reader.read()
    new = Destination("new", "r3", "inter_region")
    assert baseline.sums[new].flows == 1 and baseline.sums[new].acked == 0
    assert after.sums[new].acked == 1_000


def test_a_socket_a_dump_lists_twice_is_counted_once(tmp_path: Path) -> None:
    acked = [0]

    def dump(family: int) -> list[bytes]:
        if family != socket.AF_INET:
            return []
        return [message(1, LO, 8080, info(acked=acked[0]))] * 2

    reader = flowreader.FlowReader(config(tmp_path), dump)
    reader.read()
    acked[0] = 500
    reading = reader.read()
    lo = Destination("lo", "r2", "inter_region")
    assert reading.sums[lo].flows == 1 and reading.sums[lo].acked == 500


def test_a_peer_whose_region_changes_keeps_one_series(tmp_path: Path) -> None:
    room = FlowsRoom(config(tmp_path))
    old, moved = Destination("lo", "r2", "inter_region"), Destination("lo", "r5", "inter_region")
    for d in (old, moved):
        sums = flowreader.Sums()
        sums.flows, sums.acked = 1, 100
        room.record(flowreader.Reading({d: sums}, 1, 1, 1.0, 0.0, 0.0))
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(room)
    families = text_string_to_metric_families(generate_latest(registry).decode())
    acked = [s.value for f in families for s in f.samples if s.name == "pathprobe_tcp_flows_bytes_acked_total"]
    assert acked == [200]  # one series, both reads' bytes


def test_a_socket_one_dump_missed_is_counted_from_its_last_figures_not_its_lifetime(tmp_path: Path) -> None:
    """A dump resumes by position and can miss a socket: seen again a read later, only what it did
    since the read that last saw it counts."""
    shown, acked = [True], [1_000_000]

    def dump(family: int) -> list[bytes]:
        if family != socket.AF_INET:
            return []
        return [message(1, LO, 8080, info(acked=acked[0]))] if shown[0] else []

    reader = flowreader.FlowReader(config(tmp_path), dump)
    reader.read()
    reader.read()
    shown[0] = False
    reader.read()
    shown[0], acked[0] = True, 1_000_500
    again = reader.read()
    assert again is not None
    assert again.sums[Destination("lo", "r2", "inter_region")].acked == 500


def test_a_reload_during_a_read_discards_that_read_and_the_next_is_a_baseline(tmp_path: Path) -> None:
    """The read in its thread was the old config's: it is handed to nobody, and its state does not
    overwrite the reload's (the flows to a peer the reload added are the next read's baseline)."""
    acked = {LO: 5_000, "198.18.9.9": 7_000_000}
    added = {"name": "new", "address": "198.18.9.9", "region": "r3", "path_class": "inter_region"}
    peers = [{"name": "lo", "address": LO, "region": "r2", "path_class": "inter_region"}, added]
    reloading = [False]

    def dump(family: int) -> list[bytes]:
        if family != socket.AF_INET:
            return []
        if reloading[0]:  # the reload lands while this read's dump runs
            reloading[0] = False
            reader.use(config(tmp_path, peers=peers))
        return [message(c, a, 8080, info(acked=n)) for c, (a, n) in enumerate(acked.items(), start=1)]

    reader = flowreader.FlowReader(config(tmp_path), dump)
    assert reader.read() is not None
    reloading[0] = True
    assert reader.read() is None
    baseline = reader.read()
    acked["198.18.9.9"] += 1_000
    after = reader.read()
    new = Destination("new", "r3", "inter_region")
    assert baseline is not None and after is not None
    assert baseline.sums[new].acked == 0 and after.sums[new].acked == 1_000
