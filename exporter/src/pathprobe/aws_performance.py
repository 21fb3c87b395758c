"""AWS's own round trip between Regions and Availability Zones: AWS Network Manager's
Infrastructure Performance, read through the EC2 API's GetAwsNetworkPerformanceData
(Metric=aggregate-latency, Statistic=p50, Period=five-minutes; 45 days of history; free). Set
beside pathprobe's own RTT, it answers "is it AWS or us": a path whose RTT rose while AWS's p50
for its Region pair stayed is this fleet's (its hosts, VPC, TGW); one where both rose is AWS's.

boto3 with the standard credential chain (environment, shared files, the instance's role); the
call needs ec2:GetAwsNetworkPerformanceData (docs/evidence.md has the policy). botocore's adaptive
retry mode keeps the calls within the account's EC2 request rate (a throttled call waits and is
tried again, then counted as throttled); each source Region's queries go in batches of
BATCH_QUERIES per call, page by page."""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# The failures of an import, by reason: pathprobe_aws_import_runs_total's `result`.
RESULTS = ("ok", "no_credentials", "throttled", "not_authorized", "not_enabled", "unreachable", "error")
# An AZ ID (apne1-az4), which the API takes; a zone's name (ap-northeast-1a) differs between accounts.
AZ_ID = re.compile(r"^[a-z]{2,5}[0-9]+-az[0-9]+$")
BATCH_QUERIES = 10
PERIOD = "five-minutes"
_THROTTLED = {"RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException"}
_NOT_AUTHORIZED = {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException"}
_NOT_ENABLED = {"OptInRequired", "AuthFailure", "InvalidClientTokenId", "SubscriptionRequiredException"}


class AwsError(Exception):
    """An import that failed; `reason` is one of RESULTS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Pair:
    """One source and destination: two Regions (scope "region") or two AZ IDs (scope "az")."""

    source: str
    destination: str
    source_region: str
    destination_region: str
    scope: str


@dataclass(frozen=True)
class Point:
    """AWS's p50 round trip of a pair over one five-minute period."""

    pair: Pair
    start: float
    end: float  # the period's end (Unix seconds): the figure's timestamp
    seconds: float
    status: str


def pairs_of(members: Iterable[tuple[str, str]]) -> list[Pair]:
    """Every ordered pair of the members' Regions, and of their AZ IDs where a zone is given as one
    (members: (region, zone))."""
    regions = sorted({r for r, _ in members})
    zones = sorted({(r, z) for r, z in members if AZ_ID.match(z)})
    found = [Pair(a, b, a, b, "region") for a in regions for b in regions if a != b]
    found += [Pair(za, zb, ra, rb, "az") for ra, za in zones for rb, zb in zones if za != zb]
    return found


def client_for(region: str) -> Any:
    """The EC2 client of `region` (boto3's standard credential chain, adaptive retries)."""
    boto3: Any = importlib.import_module("boto3")  # the `aws` extra: only where AWS's figures are asked for
    botocore_config: Any = importlib.import_module("botocore.config")
    retries = {"mode": "adaptive", "max_attempts": 5}
    return boto3.client("ec2", region_name=region, config=botocore_config.Config(retries=retries, connect_timeout=5))


def fetch(pairs: list[Pair], start: float, end: float, client: Callable[[str], Any] = client_for) -> list[Point]:
    """AWS's p50 of each pair for the five-minute periods between `start` and `end`; AwsError
    (its reason) where the call fails. Each source Region's pairs are asked of that Region."""
    by_source: dict[str, list[Pair]] = {}
    for p in pairs:
        by_source.setdefault(p.source_region, []).append(p)
    points: list[Point] = []
    for region, asked in sorted(by_source.items()):
        ec2 = client(region)
        for i in range(0, len(asked), BATCH_QUERIES):
            points += _query(ec2, asked[i : i + BATCH_QUERIES], start, end)
    return points


def _query(ec2: Any, batch: list[Pair], start: float, end: float) -> list[Point]:
    errors: Any = importlib.import_module("botocore.exceptions")
    queries = [
        {"Id": f"q{n}", "Source": p.source, "Destination": p.destination, "Metric": "aggregate-latency",
         "Statistic": "p50", "Period": PERIOD}
        for n, p in enumerate(batch)
    ]  # fmt: skip
    by_id = {q["Id"]: p for q, p in zip(queries, batch, strict=True)}
    window = {"StartTime": datetime.fromtimestamp(start, UTC), "EndTime": datetime.fromtimestamp(end, UTC)}
    points = []
    try:
        for page in ec2.get_paginator("get_aws_network_performance_data").paginate(DataQueries=queries, **window):
            for response in page.get("DataResponses", []):
                pair = by_id.get(response.get("Id", ""))
                if pair is not None:
                    points += [_point(pair, m) for m in response.get("MetricPoints", []) if "Value" in m]
    except (errors.NoCredentialsError, errors.PartialCredentialsError) as exc:
        raise AwsError("no_credentials", str(exc)) from exc
    except errors.EndpointConnectionError as exc:
        raise AwsError("unreachable", str(exc)) from exc
    except errors.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        reason = (
            "throttled" if code in _THROTTLED else
            "not_authorized" if code in _NOT_AUTHORIZED else
            "not_enabled" if code in _NOT_ENABLED else "error"
        )  # fmt: skip
        raise AwsError(reason, f"{code}: {exc}") from exc
    except errors.BotoCoreError as exc:
        raise AwsError("error", str(exc)) from exc
    return points


def _point(pair: Pair, m: dict[str, Any]) -> Point:
    start, end = m["StartDate"].timestamp(), m["EndDate"].timestamp()
    return Point(pair, start, end, float(m["Value"]) / 1000, m.get("Status", ""))  # the API's milliseconds


def latest(points: list[Point]) -> dict[Pair, Point]:
    """Each pair's newest point."""
    newest: dict[Pair, Point] = {}
    for p in points:
        if p.pair not in newest or p.end > newest[p.pair].end:
            newest[p.pair] = p
    return newest


def to_json(point: Point) -> dict[str, Any]:
    return {
        "source": point.pair.source,
        "destination": point.pair.destination,
        "scope": point.pair.scope,
        "start": point.start,
        "end": point.end,
        "p50_seconds": point.seconds,
        "status": point.status,
    }


def baseline(
    region: str, pairs: list[tuple[str, str]], start: float, end: float, client: Callable[[str], Any] = client_for
) -> dict[str, Any]:
    """AWS's p50 of Region pairs (source, destination) over a time, for the evidence bundle."""
    points = fetch([Pair(a, b, a, b, "region") for a, b in pairs], start, end, client)
    return {"asked_in": region, "period": PERIOD, "read_at": time.time(), "points": [to_json(p) for p in points]}


class Importer:
    """The scheduled import (`pathprobe aws-performance --serve`): AWS's newest p50 of every pair,
    read every `interval` seconds, as a custom collector of its own registry. One job for a fleet,
    not one per exporter: the figure is per Region (or AZ) pair, not per host."""

    def __init__(
        self, pairs: list[Pair], client: Callable[[str], Any] = client_for, clock: Callable[[], float] = time.time
    ):
        self.pairs, self.client, self.clock = pairs, client, clock
        self.newest: dict[Pair, Point] = {}
        self.runs = dict.fromkeys(RESULTS, 0)
        self.last_success: float | None = None
        self.last_error = ""  # what the last failed import said

    def run_once(self) -> str:
        """One import: the newest points of the last LOOKBACK_SECONDS; its result (RESULTS), counted."""
        now = self.clock()
        try:
            points = fetch(self.pairs, now - LOOKBACK_SECONDS, now, self.client)
        except AwsError as exc:
            self.runs[exc.reason] += 1
            self.last_error = str(exc)
            return exc.reason
        self.newest.update(latest(points))
        self.runs["ok"] += 1
        self.last_success = now
        return "ok"

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["source", "destination", "source_region", "destination_region", "scope"]
        p50 = GaugeMetricFamily(
            "pathprobe_aws_latency_p50_seconds",
            "AWS's own median round trip between the source and the destination (Regions, or AZ IDs with "
            "scope=az) over its newest five-minute period: Network Manager's Infrastructure Performance "
            "(GetAwsNetworkPerformanceData, aggregate-latency p50).",
            labels=labels,
        )
        at = GaugeMetricFamily(
            "pathprobe_aws_latency_timestamp_seconds",
            "The end of the five-minute period that pathprobe_aws_latency_p50_seconds covers (Unix seconds).",
            labels=labels,
        )
        for pair, point in dict(self.newest).items():
            values = [pair.source, pair.destination, pair.source_region, pair.destination_region, pair.scope]
            p50.add_metric(values, point.seconds)
            at.add_metric(values, point.end)
        runs = CounterMetricFamily(
            "pathprobe_aws_import_runs",
            "Imports of AWS's latency, by result: ok, no_credentials, throttled (after the retries), "
            "not_authorized (the IAM policy lacks ec2:GetAwsNetworkPerformanceData), not_enabled (an opt-in "
            "Region not enabled, or a rejected account), unreachable, error.",
            labels=["result"],
        )
        for result, n in self.runs.items():
            runs.add_metric([result], n)
        yield from (p50, at, runs)
        if self.last_success is not None:
            yield GaugeMetricFamily(
                "pathprobe_aws_import_last_success_timestamp_seconds",
                "When the last import of AWS's latency succeeded.",
                value=self.last_success,
            )


# An import reads this far back: AWS publishes a five-minute period some minutes after it ends.
LOOKBACK_SECONDS = 1800.0
