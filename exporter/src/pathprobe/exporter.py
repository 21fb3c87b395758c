"""`pathprobe run`: responders, continuous RTT/loss probes, scheduled throughput
tests, all feeding the metrics that /metrics serves."""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable

from . import iperf
from .allow import AllowList
from .budget import Budget
from .config import Config, Peer, ThroughputSettings
from .echo import EchoClient
from .limits import expected, host_buffer_max, window_share
from .metrics import Metrics, peer_labels, test_keys
from .responders import iperf3_server_command, start_rr_and_echo, supervise_iperf3
from .results import ProbeFailure, ThroughputResult
from .rr import RrClient
from .schedule import Schedule

log = logging.getLogger(__name__)


class RttMetricsSink:
    """Feeds TCP request/response outcomes of one peer into the metrics."""

    def __init__(self, m: Metrics, peer: Peer, size: int, recent: deque[float]):
        self.m, self.peer, self.size = m, peer.name, size
        self.hist = m.rtt.labels(*peer_labels(peer), "tcp")
        self.sent = m.bytes_sent.labels("rtt", peer.name)
        self.recent = recent  # for the receive-window bound

    def rtt(self, seconds: float) -> None:
        self.hist.observe(seconds)
        self.recent.append(seconds)
        self.sent.inc(self.size)
        self.m.success("rtt", self.peer)

    def failure(self, reason: str) -> None:
        self.m.runs.labels("rtt", self.peer, reason).inc()


class EchoMetricsSink:
    """Feeds UDP echo outcomes of one peer into the metrics."""

    def __init__(self, m: Metrics, peer: Peer):
        labels = peer_labels(peer)
        self.m, self.peer = m, peer.name
        self.hist = m.rtt.labels(*labels, "udp")
        self.bytes = m.bytes_sent.labels("loss", peer.name)
        self._sent, self._received = m.udp_sent.labels(*labels), m.udp_received.labels(*labels)
        self._lost, self._dup = m.udp_lost.labels(*labels), m.udp_duplicate.labels(*labels)
        self._reordered, self._late = m.udp_reordered.labels(*labels), m.udp_late.labels(*labels)
        self._jitter = m.udp_jitter.labels(*labels)

    def sent(self, size: int) -> None:
        self._sent.inc()
        self.bytes.inc(size)

    def received(self, rtt: float) -> None:
        self._received.inc()
        self.hist.observe(rtt)
        self.m.success("loss", self.peer)

    def lost(self) -> None:
        self._lost.inc()
        self.m.runs.labels("loss", self.peer, "timeout").inc()

    def duplicate(self) -> None:
        self._dup.inc()

    def reordered(self) -> None:
        self._reordered.inc()

    def late(self) -> None:
        self._late.inc()

    def jitter(self, seconds: float) -> None:
        self._jitter.set(seconds)

    def failure(self, reason: str) -> None:
        self.m.runs.labels("loss", self.peer, reason).inc()


class Exporter:
    def __init__(self, cfg: Config, metrics: Metrics, clock: Callable[[], float] = time.time):
        self.cfg, self.m, self.clock = cfg, metrics, clock
        self.peers = {p.name: p for p in cfg.peers}
        self.schedule = Schedule.of([cfg.host.name, *self.peers], cfg.schedule.slot_seconds)
        self.budget = Budget(cfg.budget.daily_bytes, cfg.budget.state_file, clock)
        self._last_bytes: dict[tuple[str, tuple[str, str, str]], int] = {}
        self.rmem_max = cfg.tcp_rmem_max_bytes or host_buffer_max("rmem")
        self.wmem_max = cfg.tcp_wmem_max_bytes or host_buffer_max("wmem")
        self.window_share = cfg.tcp_window_share or window_share()
        self.recent_rtts: dict[str, deque[float]] = {p: deque(maxlen=256) for p in self.peers}
        self._binding: dict[tuple[str, ...], str] = {}
        metrics.describe_mesh(
            cfg, self.schedule.fingerprint, self.schedule.rotation_seconds, len(self.schedule.members)
        )
        self._update_budget_metrics()
        for peer in cfg.peers:
            self.update_expected(peer)

    def update_expected(self, peer: Peer) -> None:
        """Expected throughput of every test against `peer`, with the binding limit as a label."""
        settings = self.cfg.throughput_for(peer)
        if not settings.enabled:
            return
        recent = self.recent_rtts[peer.name]
        rtt = statistics.median(recent) if len(recent) >= 10 else None
        for key in test_keys(settings):
            protocol, streams, direction = key
            if direction == "send":
                rmem, wmem = peer.tcp_rmem_max_bytes or self.rmem_max, self.wmem_max
            else:
                rmem, wmem = self.rmem_max, peer.tcp_wmem_max_bytes or self.wmem_max
            e = expected(peer, self.cfg.host.instance_type, protocol, int(streams), rmem, rtt, settings.udp_bitrate,
                         self.cfg.limits_scale, sender_wmem_max=wmem, share=self.window_share)  # fmt: skip
            labels = (*peer_labels(peer), *key)
            old = self._binding.get(labels)
            if old is not None and old != e.limit:
                self.m.expected.remove(*labels, old)
            self._binding[labels] = e.limit
            self.m.expected.labels(*labels, e.limit).set(e.bits_per_second / 8)
            if "receive_window" in e.candidates:
                self.m.receive_window_bound.labels(*labels).set(e.candidates["receive_window"] / 8)

    def allow_list(self) -> AllowList:
        return AllowList([*(str(p.address) for p in self.cfg.peers), *self.cfg.responders.allow])

    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.cfg
        running = await start_rr_and_echo(
            cfg.responders, self.allow_list(), lambda r, res: self.m.responder_requests.labels(r, res).inc()
        )
        tasks = [
            asyncio.create_task(
                supervise_iperf3(
                    iperf3_server_command(cfg.iperf3, str(cfg.responders.listen)),
                    up=lambda ok: self.m.iperf3_server_up.set(1 if ok else 0),
                    restarted=self.m.iperf3_server_restarts.inc,
                ),
                name="iperf3-server",
            )
        ]
        for peer in cfg.peers:
            addr = str(peer.address)
            if cfg.probes.rtt.enabled:
                r = cfg.probes.rtt
                client = RrClient(
                    addr,
                    peer.rr_port or cfg.responders.rr_port,
                    r.interval_seconds,
                    r.size_bytes,
                    r.timeout_seconds,
                    RttMetricsSink(self.m, peer, r.size_bytes, self.recent_rtts[peer.name]),
                )
                tasks.append(asyncio.create_task(client.run(), name=f"rtt-{peer.name}"))
            if cfg.probes.loss.enabled:
                lo = cfg.probes.loss
                echo = EchoClient(
                    addr,
                    peer.echo_port or cfg.responders.echo_port,
                    lo.rate_pps,
                    lo.size_bytes,
                    lo.timeout_seconds,
                    EchoMetricsSink(self.m, peer),
                )
                tasks.append(
                    asyncio.create_task(self._forever(echo.run, f"loss-{peer.name}"), name=f"loss-{peer.name}")
                )
        tasks.append(asyncio.create_task(self._throughput_loop(stop), name="throughput"))
        try:
            await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            # Bounded: SIGTERM must stop the exporter within 5 s whatever a task does.
            _, stuck = await asyncio.wait(tasks, timeout=4)
            for t in stuck:
                log.error("task %s did not stop", t.get_name())
            running.close()

    async def _forever(self, run: Callable[[], Awaitable[None]], what: str) -> None:
        """Restart a probe loop that stopped on an error (e.g. no route at start)."""
        while True:
            try:
                await run()
            except OSError as exc:
                log.warning("%s: %s; retrying", what, exc)
            await asyncio.sleep(5)

    # --- throughput
    async def _throughput_loop(self, stop: asyncio.Event) -> None:
        host = self.cfg.host.name
        while not stop.is_set():
            turn = self.schedule.next_turn(host, self.clock())
            if turn is None:
                return
            peer = self.peers[turn.peer]
            delay = turn.start - self.clock() + random.uniform(0, self.cfg.schedule.jitter_seconds)
            if delay > 0:
                await asyncio.sleep(delay)
            settings = self.cfg.throughput_for(peer)
            self._update_budget_metrics()
            if settings.enabled:
                self.m.schedule_turns.inc()
                self.update_expected(peer)
                await self.run_turn(peer, settings, turn.end)
            # Never take the same turn twice.
            await asyncio.sleep(max(0.0, turn.end - self.clock()))

    async def run_turn(self, peer: Peer, settings: ThroughputSettings, deadline: float) -> None:
        """Run every configured test against `peer` before `deadline` (Unix time)."""
        margin = self.cfg.schedule.timeout_margin_seconds
        for key in test_keys(settings):
            protocol, streams, direction = key
            test = self._test(peer, settings, protocol, int(streams), direction)
            estimate = self._last_bytes.get((peer.name, key), 0)
            if not self.budget.allows(estimate):
                self.m.skipped.labels(peer.name, "budget").inc()
                continue
            while True:
                if self.clock() + test.max_seconds(margin) > deadline:
                    self.m.skipped.labels(peer.name, "slot_over").inc()
                    break
                try:
                    result = await iperf.run(test, self.cfg.iperf3.binary, margin)
                except ProbeFailure as exc:
                    self.m.runs.labels("throughput", peer.name, exc.reason).inc()
                    log.info("throughput %s %s: %s", peer.name, key, exc)
                    if exc.reason == "busy":
                        await asyncio.sleep(random.uniform(1, 3))
                        continue
                    break
                self._record(peer, key, result)
                log.info(
                    "throughput -> %s %s x%s %s: %.4g Mbit/s",
                    peer.name,
                    protocol,
                    streams,
                    direction,
                    result.receiver_bytes_per_second * 8e-6,
                )
                break

    def _test(
        self, peer: Peer, s: ThroughputSettings, protocol: str, streams: int, direction: str
    ) -> iperf.ThroughputTest:
        auth = self.cfg.iperf3.auth
        return iperf.ThroughputTest(
            address=str(peer.address), port=peer.iperf3_port or self.cfg.iperf3.port,
            protocol=protocol, streams=streams, direction=direction,
            duration_seconds=s.duration_seconds, omit_seconds=s.omit_seconds,
            congestion=s.congestion, udp_bitrate=s.udp_bitrate, window_bytes=s.window_bytes,
            username=auth.username if auth else None,
            password_file=auth.password_file if auth else None,
            public_key_file=auth.public_key_file if auth else None,
        )  # fmt: skip

    def _record(self, peer: Peer, key: tuple[str, str, str], result: ThroughputResult) -> None:
        # iperf3 leaves the omitted seconds out of its byte count; they were still sent.
        moved = int(
            result.bytes_transferred * (result.duration_seconds + result.omit_seconds) / result.duration_seconds
        )
        self.m.record_throughput(peer, result, moved)
        self._last_bytes[(peer.name, key)] = moved
        self.budget.spend(moved)
        self._update_budget_metrics()

    def _update_budget_metrics(self) -> None:
        self.m.budget_remaining.set(self.budget.remaining())
        self.m.budget_period_end.set(self.budget.period_end())
