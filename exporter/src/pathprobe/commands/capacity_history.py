"""`pathprobe capacity --from-prometheus`: the capacity review from 30 days of an exporter's
stored results instead of a sweep."""

from __future__ import annotations

import argparse
from typing import Any

from .. import ends
from ..capacity import Review, Row
from ..config import Peer
from ..promql import query
from .common import empty_review


def _stored(args: argparse.Namespace, sel: str) -> tuple[dict[int, float], dict[int, tuple[str, str]], list[Any]]:
    """Per stream count: the median rate of the tests whose own ends did not bind them, and what
    bound its last test; and the path's median idle RTT. Raises OSError when Prometheus does not answer."""
    # Tests that measured their own ends (a host's CPU, a receive buffer) say nothing of the path: the
    # median leaves them out (a subquery, at the step of the shortest rotation a fleet runs).
    host_bound = f'pathprobe_throughput_host_bound_info{{{sel},limit=~"{"|".join(ends.HOST_LIMITS)}"}}'
    path_rate = f"pathprobe_throughput_bytes_per_second{{{sel}}} unless on (instance, streams) {host_bound}"
    rates = {
        int(s["metric"]["streams"]): float(s["value"][1]) * 8
        for s in query(args.from_prometheus, f"max by (streams) (quantile_over_time(0.5, ({path_rate})[30d:5m]))")
    }
    # What bound each stream count's last test, of its own ends.
    last_bound = {
        int(s["metric"]["streams"]): (s["metric"].get("limit", ""), s["metric"].get("remedy", ""))
        for s in query(
            args.from_prometheus,
            f"max by (streams, limit, remedy) (pathprobe_throughput_host_bound_info{{{sel}}})",
        )
    }
    # The median of the exporter's 5-minute idle medians over 30 days.
    rtt = query(
        args.from_prometheus,
        "max(quantile_over_time(0.5, pathprobe_rtt_seconds"
        f'{{peer="{args.peer}",protocol="tcp",state="idle",quantile="0.5"}}[30d]))',
    )
    return rates, last_bound, rtt


def from_prometheus(
    args: argparse.Namespace, streams: list[int], peer: Peer, buffers: tuple[int | None, int | None], volume: float
) -> Review:
    """The review from 30 days of stored results: the median of each stream count's tests.
    `buffers`: the receiver's tcp_rmem and the sender's tcp_wmem max."""
    direction = "receive" if args.reverse else "send"
    sel = f'peer="{args.peer}",protocol="{args.protocol}",direction="{direction}"'
    if args.source_host:
        sel += f',host="{args.source_host}"'
    review = empty_review(args, args.peer, buffers, volume, f"median of 30 days in {args.from_prometheus}")
    try:
        rates, last_bound, rtt = _stored(args, sel)
    except OSError as exc:
        review.notes.append(f"Prometheus at {args.from_prometheus} did not answer: {exc}")
        return review
    review.rtt_seconds = float(rtt[0]["value"][1]) if rtt and rtt[0]["value"][1] != "NaN" else None
    review.one_way = stored_one_way(args, review)
    review.rows = [
        Row(
            n,
            rates.get(n),
            error=None if n in rates else "no stored results",
            ends_bound=last_bound.get(n, ("", ""))[0] or None,
            remedy=last_bound.get(n, ("", ""))[1],
        )
        for n in sorted(set(streams) | set(rates))
    ]
    return review


def stored_one_way(args: argparse.Namespace, review: Review) -> dict[str, Any] | None:
    """The medians over 30 days of the exporter's idle one-way p50 and p99 each way, and the widest
    error bound it stated (None, with a note, when it exported none: it withholds untrusted ones)."""
    peer = f'peer="{args.peer}"' + (f',host="{args.source_host}"' if args.source_host else "")
    figures: dict[str, dict[str, float]] = {"forward": {}, "reverse": {}}
    try:
        for quantile, name in (("0.5", "p50"), ("0.99", "p99")):
            for s in query(
                args.from_prometheus,
                "max by (direction) (quantile_over_time(0.5, pathprobe_owd_seconds"
                f'{{{peer},state="idle",quantile="{quantile}"}}[30d]))',
            ):
                figures.setdefault(s["metric"].get("direction", ""), {})[name] = float(s["value"][1])
        bound = query(args.from_prometheus, f"max(max_over_time(pathprobe_owd_error_bound_seconds{{{peer}}}[30d]))")
    except OSError as exc:
        review.notes.append(f"Prometheus at {args.from_prometheus} did not answer for one-way delays: {exc}")
        return None
    if not all(len(figures[d]) == 2 for d in ("forward", "reverse")) or not bound:
        review.notes.append(
            "no one-way delays stored for the peer (its exporter withholds untrusted ones: "
            "pathprobe_owd_untrusted_info says why)"
        )
        return None
    return {
        "error_bound_seconds": float(bound[0]["value"][1]),
        "untrusted": None,
        "forward_seconds": figures["forward"],
        "reverse_seconds": figures["reverse"],
    }
