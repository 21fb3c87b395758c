"""The UDP echo responder's stretch from an answer's clock read (the end of the hold it reports)
to the kernel's transmit stamp of the answer, and what the two-step answer (wire.ECHO_FOLLOW_UP)
takes off the RTT with it. A real EchoResponder on loopback answers a real EchoProber, with 0, 1
and 2 busy processes per core beside them (a lab host shares two cores with its tests): the
stretch as the responder's follow-ups give it, and the prober's RTTs of 64-byte echoes (no room
for a follow-up: the stretch counts as network) and of 80-byte ones (the default: it does not).
Loopback's own RTT is some microseconds, so the RTT's tail here is the two hosts' timing error.

Run: .venv/bin/python bench/responder_stretch.py [--seconds 20] [--rate 200]   (about a minute)
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import time

from pathprobe.allow import AllowList
from pathprobe.probe_settings import EchoSettings
from pathprobe.probes import EchoProber, Target
from pathprobe.probes.report import ReportSink, RttReport
from pathprobe.responders.echo import EchoResponder


class Recorded(dict[tuple[str, int], tuple[int, int]]):
    """The responder's follow-ups (flow -> (seq, stretch ns)), each stretch kept as it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.stretches: list[float] = []

    def __setitem__(self, flow: tuple[str, int], follow_up: tuple[int, int]) -> None:
        self.stretches.append(follow_up[1] / 1e9)
        super().__setitem__(flow, follow_up)


def busy(until: float) -> None:
    while time.monotonic() < until:
        pass


async def echoes(seconds: float, rate: float, size: int) -> tuple[list[float], list[float]]:
    """(the stretches the responder measured, the prober's RTTs)."""
    responder = EchoResponder(AllowList(["127.0.0.0/8"]), 10 * rate, lambda *_: None)
    await responder.start("127.0.0.1", 0)
    recorded = responder._follow_ups = Recorded()  # what the responder keeps, read as it is set
    report = RttReport("udp", 1 / rate, size)
    settings = EchoSettings(rate_pps=rate, size_bytes=size, timeout_seconds=1)
    await EchoProber(Target("127.0.0.1", responder.sockname()[1]), settings, ReportSink(report)).run(
        int(seconds * rate)
    )
    responder.close()
    return recorded.stretches, report.rtts


def us(values: list[float], q: int) -> str:
    return f"{statistics.quantiles(values, n=100)[q - 1] * 1e6:.0f}" if len(values) > 1 else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rate", type=float, default=200)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"{args.rate:g} echoes/s for {args.seconds:g} s per row, loopback")
    print("| busy processes | stretch p50 us | p99 us | RTT 64 B p50 us | p99 us | RTT 80 B p50 us | p99 us |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for per_core in (0, 1, 2):
        until = time.monotonic() + 2 * args.seconds + 10
        load = [multiprocessing.Process(target=busy, args=(until,)) for _ in range(per_core * cores)]
        for p in load:
            p.start()
        try:
            _, one_step = asyncio.run(echoes(args.seconds, args.rate, 64))
            stretches, two_step = asyncio.run(echoes(args.seconds, args.rate, 80))
        finally:
            for p in load:
                p.terminate()
                p.join()
        print(
            f"| {per_core * cores} | {us(stretches, 50)} | {us(stretches, 99)} | {us(one_step, 50)} | "
            f"{us(one_step, 99)} | {us(two_step, 50)} | {us(two_step, 99)} |"
        )


if __name__ == "__main__":
    main()
