"""What every prober shares: its shape, its target and the failure reasons.

One shape for every prober, as blackbox_exporter's prober/ has one probe function: a prober is
built from its `Target`, its settings model and its sink (`ProberFactory`; kinds.KINDS names each
kind's), and `run()` hands every outcome to that sink as it comes, never raising for a failure of
the probe: a failure is handed on with its reason. A continuous prober (rtt, loss, mtu) backs off
and goes on until cancelled and returns nothing; the scheduled one (throughput) runs one test and
also returns its outcome, for the turn that waits on it. Each sink protocol sits beside its prober.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

# The `result` label of pathprobe_probe_runs_total; order is the documented one.
REASONS = (
    "ok",
    "busy",
    "timeout",
    "refused",
    "unreachable",
    "not_allowed",
    "out_of_turn",
    "fragmentation_needed",
    "error",
)
Reason = Literal[
    "busy", "timeout", "refused", "unreachable", "not_allowed", "out_of_turn", "fragmentation_needed", "error"
]

# Why a field of a peer's answer was not taken (the `reason` label of
# pathprobe_probe_answers_rejected_total): a peer's answer is its word, and a responder can be old,
# buggy, half upgraded, behind a middlebox that rewrites bytes, or hostile. Each is checked against
# what is physically possible before it becomes a number.
REJECTIONS = (
    "hold_beyond_rtt",  # the responder's hold at or beyond the whole round trip: no sample
    "follow_up_out_of_bounds",  # a two-step follow-up's stretch negative or beyond its sample's RTT: ignored
    "count_beyond_sent",  # a flow's received count above what was sent on it: that flow's direction split withheld
    "count_not_monotonic",  # a flow's received count fell (a restarted or broken responder): its split withheld
    "clock_implausible",  # the responder's clock stamps reversed, or a day or more from this host's: no offset
    "delay_impossible",  # an exchange's on-wire delay negative or beyond its round trip: no offset from it
    "bound_implausible",  # a stated clock error bound beyond 10 s: taken as none
    "malformed",  # an answer of the wrong shape (a hello's reply not Y or N)
    "report_rejected",  # a served test's report not possible (probes/peer_end.py): that end unknown
)
Rejection = Literal[
    "hold_beyond_rtt", "follow_up_out_of_bounds", "count_beyond_sent", "count_not_monotonic", "clock_implausible",
    "delay_impossible", "bound_implausible", "malformed", "report_rejected",
]  # fmt: skip

# A failing peer is not probed faster than this.
BACKOFF_SECONDS = 1.0


@dataclass(frozen=True)
class Target:
    """Where a prober sends: the peer's address and the port of its responder, and the
    address it sends from (None: the kernel's choice by the route)."""

    address: str
    port: int
    source: str | None = None


class ProbeFailure(Exception):
    """A probe that did not give a result, with the reason used as a metric label."""

    def __init__(self, reason: Reason, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason: Reason = reason
        self.detail = detail


def reason_of_oserror(exc: OSError) -> Reason:
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL):
        return "unreachable"
    if exc.errno == errno.EMSGSIZE:  # an ICMP "fragmentation needed" (or the local MTU)
        return "fragmentation_needed"
    return "error"


class Prober(Protocol):
    """A prober of one peer. `run()` takes nothing more (what it needs came with the prober) and
    hands every outcome to the prober's sink; it returns None (a continuous prober, cancelled) or
    the outcome of its one test (the scheduled prober: a result, or the reason it gave none)."""

    async def run(self) -> object: ...


Settings_contra = TypeVar("Settings_contra", contravariant=True)
Sink_contra = TypeVar("Sink_contra", contravariant=True)


class ProberFactory(Protocol[Settings_contra, Sink_contra]):
    """How every prober is built: from where it sends, its settings and its sink."""

    def __call__(self, target: Target, settings: Settings_contra, sink: Sink_contra, /) -> Prober: ...
