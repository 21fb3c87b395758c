"""Throughput prober: one iperf3 client test (iperf3_test.py: its settings and result), its
processes run (iperf3_run.py), parsing of `-J`, and both ends' figures."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, replace
from typing import Any, Protocol

from .. import ends, iperf3
from . import iperf3_run, peer_end
from .base import ProbeFailure, Reason, Target
from .iperf3_test import INTERVAL_SECONDS, ThroughputResult, ThroughputTest

# Substrings of iperf3's "error" field, first match wins.
_ERROR_REASONS: tuple[tuple[str, Reason], ...] = (
    ("busy", "busy"),
    # iperf3 3.12's server re-opens its listening socket after each test: a client that connects
    # in that moment (the next test of a turn, right after the last at a long RTT) is reset.
    ("unable to receive control message: connection reset", "busy"),
    # The control connection was accepted and the server was gone when the data stream connected:
    # cut by the peer's admission (below), before "connection refused" reads as no server at all.
    ("unable to connect stream: connection refused", "out_of_turn"),
    ("connection refused", "refused"),
    ("no route to host", "unreachable"),
    ("network is unreachable", "unreachable"),
    ("host is unreachable", "unreachable"),
    ("timed out", "timeout"),
    ("timeout", "timeout"),
    ("authentication failed", "not_allowed"),
    ("authorization failed", "not_allowed"),
    # A peer's admission cuts a test it refuses by killing its server as the test connects
    # (responders/iperf3.py): out of turn by the peer's clock. (A host the peer does not admit
    # at all is cut the same way; its RTT and loss probes then read not_allowed too.)
    # Seen as any of these, by how far the test had got (iperf3 3.12 on loopback):
    ("control socket has closed unexpectedly", "out_of_turn"),
    ("unable to write to stream socket", "out_of_turn"),  # connection reset, or broken pipe
    ("unable to initialize stream", "out_of_turn"),  # transport endpoint is not connected
)
# Reasons that only a test cut in its first second can have: later, the same message is a failure.
# The peer's admission kills its server as the test connects: 24-86 ms into the test on this
# project's idle loopback mesh, over 100 ms on a loaded machine. A fixed-length test has not reported
# its first (1 s) interval by then, but a steady-state test reports every 0.1 s: the test's own
# time decides, not its interval count.
_AT_START_ONLY: tuple[Reason, ...] = ("out_of_turn",)
AT_START_SECONDS = 1.0


def classify_error(message: str, ran_seconds: float = 0.0) -> Reason:
    """The reason for iperf3's error `message`, `ran_seconds` into the test (its last interval's end)."""
    low = message.lower()
    for needle, reason in _ERROR_REASONS:
        if needle in low:
            return "error" if ran_seconds >= AT_START_SECONDS and reason in _AT_START_ONLY else reason
    return "error"


def parse(output: str | bytes, test: ThroughputTest, now: float | None = None) -> ThroughputResult:
    """Parse iperf3 -J output; raise ProbeFailure for an error report or garbage."""
    try:
        doc = json.loads(output)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        snippet = (output[:80] if isinstance(output, str) else output[:80].decode(errors="replace")).strip()
        raise ProbeFailure("error", f"iperf3 output is not JSON ({exc}): {snippet!r}") from exc
    if not isinstance(doc, dict):
        raise ProbeFailure("error", "iperf3 output is not a JSON object")
    if doc.get("error"):
        message = str(doc["error"])
        raise ProbeFailure(classify_error(message, _ran_seconds(doc.get("intervals"))), message)
    try:
        result = _result(doc, test, now)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise ProbeFailure("error", f"iperf3 JSON lacks an expected field or has a bad value: {exc!r}") from exc
    problem = _impossible(result)
    if problem:
        raise ProbeFailure("error", f"iperf3 reported {problem}")
    return result


def _impossible(r: ThroughputResult) -> str:
    """What of an iperf3 report no test can have measured ("" when nothing): rates, counts and
    times that are negative or not finite, more datagrams lost than sent."""
    figures = {
        "rates": (r.receiver_bytes_per_second, r.sender_bytes_per_second),
        "bytes": (r.bytes_transferred,),
        "retransmits": (r.retransmits,),
        "datagrams": (r.udp_packets, r.udp_lost),
        "jitter": (r.jitter_seconds,),
        "RTT": (r.sender_rtt_seconds,),
    }
    for what, values in figures.items():
        if not all(v is None or (math.isfinite(v) and v >= 0) for v in values):
            return f"impossible {what}: {values}"
    if r.udp_lost is not None and r.udp_packets is not None and r.udp_lost > r.udp_packets:
        return f"more datagrams lost ({r.udp_lost}) than sent ({r.udp_packets})"
    return ""


def _ran_seconds(intervals: Any) -> float:
    """The end of the last interval of iperf3 -J's `intervals`: 0 for none; AT_START_SECONDS for
    intervals of a shape not iperf3's (the test had started)."""
    try:
        return float(intervals[-1]["sum"]["end"]) if intervals else 0.0
    except (LookupError, TypeError, ValueError):
        return AT_START_SECONDS  # an interval of unknown length: the test had started


# The fields of an iperf3 -J interval's stream (and sum) kept in the evidence, in iperf3's units.
INTERVAL_FIELDS = (
    "socket", "start", "end", "bytes", "bits_per_second", "retransmits", "snd_cwnd", "snd_wnd", "rtt", "rttvar",
    "pmtu", "packets", "lost_packets", "jitter_ms", "omitted",
)  # fmt: skip


def _intervals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """iperf3 -J's intervals, each its sum and its streams' figures (INTERVAL_FIELDS)."""

    def kept(figures: dict[str, Any]) -> dict[str, Any]:
        return {k: figures[k] for k in INTERVAL_FIELDS if k in figures}

    return [
        {**kept(i.get("sum", {})), "streams": [kept(s) for s in i.get("streams", [])]}
        for i in doc.get("intervals") or []
        if isinstance(i, dict)
    ]


def _cpu(end: dict[str, Any]) -> dict[str, float] | None:
    cpu = end.get("cpu_utilization_percent")
    return {str(k): float(v) for k, v in cpu.items()} if isinstance(cpu, dict) else None


def _stream_rtt(end: dict[str, Any]) -> float | None:
    rtts = [s["sender"].get("mean_rtt", 0) for s in end.get("streams", []) if "sender" in s]
    rtts = [float(r) for r in rtts if r and float(r) > 0]
    return sum(rtts) / len(rtts) / 1e6 if rtts else None  # iperf3 reports microseconds


def _result(doc: dict[str, Any], test: ThroughputTest, now: float | None) -> ThroughputResult:
    end = doc["end"]
    start = doc.get("start", {})
    sent = end["sum_sent"]
    common: dict[str, Any] = {
        "protocol": test.protocol,
        "streams": test.streams,
        "direction": test.direction,
        "duration_seconds": test.duration_seconds,
        "omit_seconds": test.omit_seconds,
        "congestion": test.congestion,
        "target_bits_per_second": test.udp_bitrate if test.protocol == "udp" else None,
        "sender_bytes_per_second": float(sent["bits_per_second"]) / 8,
        "bytes_transferred": int(sent["bytes"]),
        "timestamp": now if now is not None else time.time(),
        "iperf3_version": str(start.get("version", "")),
        "intervals": _intervals(doc),
        "iperf3_cpu_percent": _cpu(end),
    }
    if test.protocol == "udp":
        # iperf3 >= 3.7 has the receiver's view in sum_received; older ones only in sum.
        recv = end["sum_received"] if "lost_packets" in end.get("sum_received", {}) else end["sum"]
        packets = int(recv["packets"])
        lost = int(recv["lost_packets"])
        return ThroughputResult(
            **common,
            receiver_bytes_per_second=float(recv["bits_per_second"]) / 8,
            udp_packets=packets,
            udp_lost=lost,
            udp_loss_ratio=lost / packets if packets else 0.0,
            jitter_seconds=float(recv.get("jitter_ms", 0.0)) / 1000,
        )
    return ThroughputResult(
        **common,
        receiver_bytes_per_second=float(end["sum_received"]["bits_per_second"]) / 8,
        retransmits=int(sent["retransmits"]) if "retransmits" in sent else None,
        sender_rtt_seconds=_stream_rtt(end),
    )


class ThroughputSink(Protocol):
    """The outcome of one throughput test."""

    def result(self, result: ThroughputResult) -> None: ...
    def failure(self, reason: Reason, detail: str) -> None: ...


class ThroughputProber:
    """One iperf3 client test against `target`: `run()` reports its outcome to the sink (the
    scheduled turns), `measure()` returns the result or raises ProbeFailure (the CLI)."""

    def __init__(self, target: Target, settings: ThroughputTest, sink: ThroughputSink | None = None):
        self.target, self.test, self.sink = target, settings, sink

    async def run(self) -> ThroughputResult | Reason:
        """Run the test and report its outcome: the result, or the reason it gave none."""
        try:
            result = await self.measure()
        except ProbeFailure as exc:
            if self.sink is not None:
                self.sink.failure(exc.reason, exc.detail)
            return exc.reason
        if self.sink is not None:
            self.sink.result(result)
        return result

    async def measure(self) -> ThroughputResult:
        """Run the test; every process group of it is killed on timeout or cancellation."""
        test = self.test
        run = iperf3_run.Run(await self._parts())
        if test.kill_at is not None and time.monotonic() >= test.kill_at:  # the peer's report took the rest
            raise ProbeFailure("timeout", "iperf3 did not start by its turn's end")
        began = time.time()
        pids = await run.start()
        started = time.monotonic()
        own_end = ends.EndWatch(test.streams, version=None)  # read once the test has ended: a bad binary fails first
        own_end.start(pids)
        own_sampler = asyncio.ensure_future(own_end.sample_until_cancelled())
        try:
            outputs = await run.finish()
        finally:
            own_sampler.cancel()
            await asyncio.gather(own_sampler, return_exceptions=True)
        finished = time.time()
        own_end.stop()
        if run.steady is not None:
            result = _steady_result(run.steady, outputs)
        else:
            result = iperf3_run.combine([_parsed(o, part.test) for o, part in zip(outputs, run.parts, strict=True)])
        result = replace(result, started_timestamp=began, timestamp=finished)
        own_end.version = await asyncio.to_thread(iperf3.version_text, test.binary)
        return await self._with_ends(result, own_end.figures(), time.monotonic() - started)

    async def _parts(self) -> list[iperf3_run.Part]:
        """The test's processes: one, or one per server of the peer's (at most test.processes) where
        either end's iperf3 runs every stream of a process on one thread (before 3.16), as the
        peer's responder reports its iperf3 (an older responder reports none: one process)."""
        test, one = self.test, [iperf3_run.Part(self.target, self.test)]
        if test.processes <= 1 or test.streams <= 1 or test.report_port is None:
            return one
        peer = await peer_end.report(self._report_target(), test_seconds=0, wait=0)
        own = await asyncio.to_thread(iperf3.version_text, test.binary)
        ports = list(peer.ports[: test.processes])
        if (
            not ports
            or ports[0] != self.target.port
            or (ends.threads_per_stream(own) and ends.threads_per_stream(peer.version))
        ):
            return one
        return iperf3_run.split(self.target, test, ports)

    def _report_target(self) -> Target:
        assert self.test.report_port is not None
        return Target(self.target.address, self.test.report_port, self.target.source)

    async def _with_ends(self, result: ThroughputResult, own: ends.EndFigures, seconds: float) -> ThroughputResult:
        """The result with both ends' figures (this host's, and the peer's as its responder reports
        them) and what of them bound it."""
        test = self.test
        reported = peer_end.PeerEnd()
        if test.report_port is not None:
            reported = await peer_end.report(self._report_target(), seconds)
        sender, receiver = (own, reported.end) if test.direction == "send" else (reported.end, own)
        bound = ends.judge(test.protocol, sender, receiver, result.udp_lost)
        return replace(
            result,
            sender_end=sender,
            receiver_end=receiver,
            bound=bound.limit,
            remedy=bound.remedy,
            peer_report_rejected=reported.rejected,
        )


def _parsed(output: iperf3_run.Output, test: ThroughputTest) -> ThroughputResult:
    """A fixed-length test's process's result (iperf3 -J)."""
    if not output.out.strip():
        raise ProbeFailure(
            "error", f"iperf3 exited {output.returncode} with no output: {output.err.decode(errors='replace')[:200]}"
        )
    return parse(output.out, test)


def _steady_result(watch: iperf3_run.SteadyState, outputs: list[iperf3_run.Output]) -> ThroughputResult:
    """The converged result; or, for a test that ran to its maximum, the rate of its last windows
    with converged=False; ProbeFailure for one that stopped before either."""
    test, intervals = watch.test, watch.summed()
    ran = intervals[-1].end if intervals else 0.0
    if watch.rate is None and ran < test.duration_seconds - INTERVAL_SECONDS:
        said = [o for o in outputs if (o.err or o.out).strip()]
        message = (said[0].err or said[0].out).decode(errors="replace").strip().splitlines() if said else []
        detail = message[-1][:200] if message else f"exit {outputs[0].returncode}"
        reason = classify_error(detail, ran)
        raise ProbeFailure(
            reason, f"iperf3 stopped after {ran:g} of {test.duration_seconds:g} s without a steady rate: {detail}"
        )
    rate, converged = watch.rate_of(ran)
    return ThroughputResult(
        protocol=test.protocol,
        streams=sum(part.test.streams for part in watch.parts),
        direction=test.direction,
        duration_seconds=ran,
        omit_seconds=0,
        congestion=test.congestion,
        target_bits_per_second=None,
        # What the peer acknowledged ("send") or this host received (-R): the receiver's side
        # (iperf3's own intervals where no socket showed it; at a steady rate the same).
        receiver_bytes_per_second=rate / 8,
        sender_bytes_per_second=rate / 8,
        bytes_transferred=watch.sent_bytes(),
        retransmits=watch.retransmits(),
        timestamp=time.time(),
        iperf3_version="",
        converged=converged,
        receive_window_limited_ratio=watch.limited[0] if watch.limited else None,
        send_buffer_limited_ratio=watch.limited[1] if watch.limited else None,
        sender_rtt_seconds=sum(watch.rtts) / len(watch.rtts) if watch.rtts else None,
        intervals=[asdict(i) for i in intervals],
    )
