"""AWS's own latency (aws_performance.py) against botocore's Stubber: moto does not implement
GetAwsNetworkPerformanceData, and the Stubber checks every request's parameters and every
response against the EC2 service model that botocore ships (the shapes the API documents)."""

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from prometheus_client import CollectorRegistry, generate_latest

from pathprobe import aws_performance
from pathprobe.aws_performance import AwsError, Importer, Pair, fetch, pairs_of

OP = "get_aws_network_performance_data"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()
TOKYO_SINGAPORE = Pair("ap-northeast-1", "ap-southeast-1", "ap-northeast-1", "ap-southeast-1", "region")
SINGAPORE_TOKYO = Pair("ap-southeast-1", "ap-northeast-1", "ap-southeast-1", "ap-northeast-1", "region")


def client(region: str) -> Any:
    return boto3.client("ec2", region_name=region, aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x")


def query(n: int, pair: Pair) -> dict[str, str]:
    return {"Id": f"q{n}", "Source": pair.source, "Destination": pair.destination, "Metric": "aggregate-latency",
            "Statistic": "p50", "Period": "five-minutes"}  # fmt: skip


def point(minute: int, ms: float) -> dict[str, Any]:
    return {
        "StartDate": datetime(2026, 12, 1, 11, minute, tzinfo=UTC),
        "EndDate": datetime(2026, 12, 1, 11, minute + 5, tzinfo=UTC),
        "Value": ms,
        "Status": "OK",
    }


def response(pair: Pair, *points: dict[str, Any], n: int = 0, token: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"DataResponses": [{**query(n, pair), "MetricPoints": list(points)}]}
    if token:
        body["NextToken"] = token
    return body


def expected(pairs: list[Pair], token: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {
        "DataQueries": [query(n, p) for n, p in enumerate(pairs)],
        "StartTime": datetime.fromtimestamp(NOW - 1800, UTC),
        "EndTime": datetime.fromtimestamp(NOW, UTC),
    }
    if token:
        params["NextToken"] = token
    return params


class Stubbed:
    """One stubbed client per Region, made as fetch() asks for them."""

    def __init__(self, answers: dict[str, list[tuple[str, Any, dict[str, Any] | None]]]):
        self.answers, self.stubbers = answers, []

    def __call__(self, region: str) -> Any:
        c = client(region)
        stubber = Stubber(c)
        for kind, answer, params in self.answers[region]:
            if kind == "ok":
                stubber.add_response(OP, answer, params)
            else:
                stubber.add_client_error(OP, service_error_code=answer, http_status_code=400, expected_params=params)
        stubber.activate()
        self.stubbers.append(stubber)
        return c

    def all_answered(self) -> None:
        for s in self.stubbers:
            s.assert_no_pending_responses()


def test_the_pairs_are_every_region_pair_and_the_az_pairs_given_as_az_ids() -> None:
    pairs = pairs_of([("ap-northeast-1", "apne1-az4"), ("ap-southeast-1", "apse1-az2"), ("ap-southeast-1", "b")])
    assert {(p.source, p.destination, p.scope) for p in pairs} == {
        ("ap-northeast-1", "ap-southeast-1", "region"),
        ("ap-southeast-1", "ap-northeast-1", "region"),
        ("apne1-az4", "apse1-az2", "az"),
        ("apse1-az2", "apne1-az4", "az"),
    }


def test_good_data_becomes_the_newest_p50_per_pair_with_its_timestamp() -> None:
    two = response(TOKYO_SINGAPORE, point(40, 68.9), point(45, 69.4))
    stubbed = Stubbed({
        "ap-northeast-1": [("ok", two, expected([TOKYO_SINGAPORE]))],
        "ap-southeast-1": [("ok", response(SINGAPORE_TOKYO, point(45, 69.1)), expected([SINGAPORE_TOKYO]))],
    })  # fmt: skip
    importer = Importer([TOKYO_SINGAPORE, SINGAPORE_TOKYO], client=stubbed, clock=lambda: NOW)
    assert importer.run_once() == "ok"
    stubbed.all_answered()
    newest = importer.newest[TOKYO_SINGAPORE]
    assert (
        newest.seconds == pytest.approx(0.0694) and newest.end == datetime(2026, 12, 1, 11, 50, tzinfo=UTC).timestamp()
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(importer)
    text = generate_latest(registry).decode()
    assert (
        'pathprobe_aws_latency_p50_seconds{destination="ap-southeast-1",destination_region="ap-southeast-1",'
        'scope="region",source="ap-northeast-1",source_region="ap-northeast-1"} 0.0694' in text
    )
    assert 'pathprobe_aws_import_runs_total{result="ok"} 1.0' in text
    assert "pathprobe_aws_latency_timestamp_seconds{" in text


def test_pages_are_followed() -> None:
    stubbed = Stubbed(
        {
            "ap-northeast-1": [
                ("ok", response(TOKYO_SINGAPORE, point(40, 68.9), token="page-2"), expected([TOKYO_SINGAPORE])),
                ("ok", response(TOKYO_SINGAPORE, point(45, 70.2)), expected([TOKYO_SINGAPORE], token="page-2")),
            ]
        }
    )
    points = fetch([TOKYO_SINGAPORE], NOW - 1800, NOW, client=stubbed)
    stubbed.all_answered()
    assert [p.seconds for p in points] == pytest.approx([0.0689, 0.0702])


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("RequestLimitExceeded", "throttled"),
        ("UnauthorizedOperation", "not_authorized"),
        ("OptInRequired", "not_enabled"),
        ("InvalidParameterValue", "error"),
    ],
)
def test_a_failed_call_is_counted_by_reason(code: str, reason: str) -> None:
    stubbed = Stubbed({"ap-northeast-1": [("error", code, expected([TOKYO_SINGAPORE]))]})
    importer = Importer([TOKYO_SINGAPORE], client=stubbed, clock=lambda: NOW)
    assert importer.run_once() == reason
    stubbed.all_answered()
    assert importer.runs[reason] == 1 and importer.runs["ok"] == 0 and importer.newest == {}


def test_no_credentials_is_counted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A real boto3 client with no credential anywhere in the standard chain (the instance's
    metadata service turned off): it fails before any request leaves."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(AwsError) as err:
        fetch([TOKYO_SINGAPORE], NOW - 1800, NOW)
    assert err.value.reason == "no_credentials"


def test_many_pairs_go_in_batches() -> None:
    regions = [f"ap-northeast-{i}" for i in range(1, 4)] + [f"r{i}" for i in range(12)]
    pairs = [Pair("ap-northeast-1", r, "ap-northeast-1", r, "region") for r in regions[1:]]
    first, rest = pairs[: aws_performance.BATCH_QUERIES], pairs[aws_performance.BATCH_QUERIES :]
    empty = {"DataResponses": []}
    stubbed = Stubbed({"ap-northeast-1": [("ok", empty, expected(first)), ("ok", empty, expected(rest))]})
    assert fetch(pairs, NOW - 1800, NOW, client=stubbed) == []
    stubbed.all_answered()
