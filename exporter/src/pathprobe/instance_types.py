"""Every EC2 instance type's network bandwidth, from AWS's own data.

The EC2 API's DescribeInstanceTypes gives, per instance type and per network card, a
baseline and a peak bandwidth (`NetworkInfo.NetworkCards[].BaselineBandwidthInGbps`,
`.PeakBandwidthInGbps`), the default vCPUs (`VCpuInfo.DefaultVCpus`) and ENA support.
"Up to X Gbps" types reach the peak on network I/O credits and fall to the baseline
once the credits are spent; fixed-bandwidth types have baseline = peak.

`pathprobe limits import` turns a DescribeInstanceTypes response into a dated table
(`data/instance_types.json`, one type per line): the output of `aws ec2
describe-instance-types` (one or several pages, or several files), the snapshot that
ships in the `moto` package (a dict keyed by type, gzip-compressed), or the live API
through boto3 (the optional extra `pathprobe[aws]`). Bad input is an `InstanceDataError`
naming the file, the type and the field; nothing is written then.

The model (limits.py) uses the figures of an instance's DEFAULT network card: an
ENI, and so every flow pathprobe sends, is on one card (types with several cards have
a figure per card; the total is shown by `pathprobe limits show`).
"""

from __future__ import annotations

import datetime as dt
import gzip
import importlib
import json
import math
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .files import write_atomic

GBPS = 1e9
# Bigger than any DescribeInstanceTypes response (moto's whole snapshot is 5 MB unpacked).
MAX_BYTES = 256 * 2**20


class InstanceDataError(ValueError):
    """A DescribeInstanceTypes response or a table that cannot be used; the message names
    the file, the instance type and the field."""


class ApiError(InstanceDataError):
    """The live API could not be read (credentials, network, permissions)."""


class Card(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int = Field(ge=0)
    baseline_gbps: float = Field(gt=0)
    peak_gbps: float = Field(gt=0)


class InstanceType(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    vcpus: int = Field(ge=1)
    default_card: int = Field(default=0, ge=0)
    ena: str | None = None  # EnaSupport: required, supported, unsupported
    performance: str = ""  # NetworkPerformance, the marketing figure ("Up to 16 Gigabit")
    cards: tuple[Card, ...] = Field(min_length=1)
    # ProcessorInfo.SupportedArchitectures (arm64, x86_64, ...): what a vCPU of it carries differs.
    architectures: tuple[str, ...] = ()

    @property
    def card(self) -> Card:
        """The default network card (the one the primary ENI is on)."""
        return next((c for c in self.cards if c.index == self.default_card), self.cards[0])

    @property
    def baseline_bits_per_second(self) -> float:
        return self.card.baseline_gbps * GBPS

    @property
    def peak_bits_per_second(self) -> float:
        return self.card.peak_gbps * GBPS

    @property
    def burst(self) -> bool:
        return self.card.peak_gbps > self.card.baseline_gbps

    @property
    def total_baseline_bits_per_second(self) -> float:
        return sum(c.baseline_gbps for c in self.cards) * GBPS

    @property
    def total_peak_bits_per_second(self) -> float:
        return sum(c.peak_gbps for c in self.cards) * GBPS


class Table(BaseModel):
    """The generated table: where the data came from, its date, and every type."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal[1] = 1
    source: str = Field(min_length=1)
    as_of: dt.date  # the date of the data (the API call, or the snapshot's)
    generated: dt.date  # when `pathprobe limits import` wrote this table
    types: dict[str, InstanceType]

    def get(self, name: str) -> InstanceType | None:
        return self.types.get(name)

    def cited(self) -> str:
        return f"{self.source}, {self.as_of.isoformat()}"

    def to_json(self) -> str:
        """The table as JSON text, one instance type per line (diffs stay readable)."""
        head = {k: v for k, v in self.model_dump(mode="json").items() if k != "types"}
        lines = [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
        rows = [
            f"    {json.dumps(name)}: {json.dumps(t.model_dump(mode='json'), separators=(', ', ': '))}"
            for name, t in sorted(self.types.items())
        ]
        return "{\n" + "\n".join(lines) + '\n  "types": {\n' + ",\n".join(rows) + "\n  }\n}\n"


# --- reading DescribeInstanceTypes responses -------------------------------------


def read_documents(path: Path) -> list[Any]:
    """The JSON documents in a file: one (the usual), or several one after the other (pages
    saved into one file); gzip-compressed or not."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InstanceDataError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise InstanceDataError(f"{path}: not a valid gzip file: {exc}") from exc
    if len(raw) > MAX_BYTES:
        raise InstanceDataError(f"{path}: larger than {MAX_BYTES // 2**20} MiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InstanceDataError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    decoder, docs, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            break
        try:
            doc, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise InstanceDataError(f"{path}: not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from exc
        docs.append(doc)
    if not docs:
        raise InstanceDataError(f"{path}: empty")
    return docs


def _entries(where: str, doc: Any) -> Iterator[tuple[str, Any]]:
    """(where, instance type object) of one document: a DescribeInstanceTypes response
    ({"InstanceTypes": [...]}), a list of such pages, a bare list of instance types, or
    moto's snapshot (a dict keyed by type name)."""
    if isinstance(doc, list):
        for i, item in enumerate(doc):
            if isinstance(item, dict) and "InstanceTypes" in item:
                yield from _entries(f"{where}: page {i}", item)
            else:
                yield f"{where}: [{i}]", item
    elif isinstance(doc, dict) and "InstanceTypes" in doc:
        items = doc["InstanceTypes"]
        if not isinstance(items, list):
            raise InstanceDataError(f"{where}: InstanceTypes: not a list")
        for i, item in enumerate(items):
            yield f"{where}: InstanceTypes[{i}]", item
    elif isinstance(doc, dict) and doc and all(isinstance(v, dict) and "InstanceType" in v for v in doc.values()):
        for name, item in doc.items():
            yield f"{where}: [{name!r}]", item
    else:
        raise InstanceDataError(
            f"{where}: not a DescribeInstanceTypes response (no InstanceTypes list, "
            "and not a dict of instance types keyed by name)"
        )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _card(field: str, i: int, card: Any, bad: Callable[[str, str], InstanceDataError]) -> Card:
    """One entry of NetworkInfo.NetworkCards (the `i`th)."""
    if not isinstance(card, dict):
        raise bad(field, "not an object")
    index = card.get("NetworkCardIndex", i)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise bad(f"{field}.NetworkCardIndex", f"not a card index: {index!r}")
    figures = []
    for key in ("BaselineBandwidthInGbps", "PeakBandwidthInGbps"):
        if key not in card:
            raise bad(f"{field}.{key}", "missing")
        value = _number(card[key])
        if value is None or value <= 0:
            raise bad(f"{field}.{key}", f"not a positive number: {card[key]!r}")
        figures.append(value)
    baseline, peak = figures
    if peak < baseline:
        raise bad(f"{field}.PeakBandwidthInGbps", f"{peak:g} is below the baseline {baseline:g}")
    return Card(index=index, baseline_gbps=baseline, peak_gbps=peak)


def parse_instance_type(where: str, item: Any) -> tuple[str, InstanceType]:
    """One entry of `InstanceTypes` (the API's shape) as (name, InstanceType)."""
    if not isinstance(item, dict):
        raise InstanceDataError(f"{where}: not an object")
    name = item.get("InstanceType")
    if not isinstance(name, str) or not name:
        raise InstanceDataError(f"{where}: InstanceType: missing")

    def bad(field: str, problem: str) -> InstanceDataError:
        return InstanceDataError(f"{where}: instance type {name}: {field}: {problem}")

    vcpu_info = item.get("VCpuInfo")
    vcpus = vcpu_info.get("DefaultVCpus") if isinstance(vcpu_info, dict) else None
    if vcpus is None:
        raise bad("VCpuInfo.DefaultVCpus", "missing")
    if isinstance(vcpus, bool) or not isinstance(vcpus, int) or vcpus < 1:
        raise bad("VCpuInfo.DefaultVCpus", f"not a positive integer: {vcpus!r}")
    net = item.get("NetworkInfo")
    if not isinstance(net, dict):
        raise bad("NetworkInfo", "missing (no network data)")
    raw_cards = net.get("NetworkCards")
    if not isinstance(raw_cards, list) or not raw_cards:
        raise bad("NetworkInfo.NetworkCards", "missing (no network card data)")
    cards = [_card(f"NetworkInfo.NetworkCards[{i}]", i, card, bad) for i, card in enumerate(raw_cards)]
    default = net.get("DefaultNetworkCardIndex", 0)
    if default not in {c.index for c in cards}:
        raise bad("NetworkInfo.DefaultNetworkCardIndex", f"{default!r} names no card")
    ena = net.get("EnaSupport")
    performance = net.get("NetworkPerformance", "")
    processor = item.get("ProcessorInfo")
    architectures = processor.get("SupportedArchitectures", []) if isinstance(processor, dict) else []
    if not isinstance(architectures, list) or not all(isinstance(a, str) and a for a in architectures):
        raise bad("ProcessorInfo.SupportedArchitectures", f"not a list of names: {architectures!r}")
    return name, InstanceType(
        vcpus=vcpus,
        default_card=default,
        ena=ena if isinstance(ena, str) else None,
        performance=performance if isinstance(performance, str) else "",
        cards=tuple(cards),
        architectures=tuple(architectures),
    )


def parse(documents: Iterable[tuple[str, Any]]) -> dict[str, InstanceType]:
    """Every instance type of these (where, document) pairs. A type seen twice (the same
    type in two regions' pages) keeps its last entry."""
    types: dict[str, InstanceType] = {}
    for where, doc in documents:
        for at, item in _entries(where, doc):
            name, entry = parse_instance_type(at, item)
            types[name] = entry
    if not types:
        raise InstanceDataError("no instance types in the input")
    return types


def from_files(paths: Iterable[Path]) -> dict[str, InstanceType]:
    return parse((str(p), doc) for p in paths for doc in read_documents(p))


def moto_snapshot() -> tuple[Path, str]:
    """The DescribeInstanceTypes snapshot inside the installed moto package, and moto's version."""
    try:
        moto = importlib.import_module("moto")
    except ImportError as exc:
        raise InstanceDataError("the moto package is not installed (pip install 'pathprobe[aws]')") from exc
    path = Path(str(moto.__file__)).parent / "ec2" / "resources" / "instance_types.json.gz"
    if not path.is_file():
        raise InstanceDataError(f"moto {moto.__version__} has no {path}")
    return path, str(moto.__version__)


def fetch_live(region: str | None = None, endpoint_url: str | None = None) -> list[dict[str, Any]]:
    """Every page of DescribeInstanceTypes from the EC2 API (boto3, the default credential
    chain: on an instance, its role). Raises InstanceDataError on any failure."""
    try:
        boto3: Any = importlib.import_module("boto3")
        botocore_exceptions: Any = importlib.import_module("botocore.exceptions")
    except ImportError as exc:
        raise InstanceDataError("boto3 is not installed: pip install 'pathprobe[aws]'") from exc
    try:
        client = boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)
        return list(client.get_paginator("describe_instance_types").paginate())
    except (botocore_exceptions.BotoCoreError, botocore_exceptions.ClientError) as exc:
        raise ApiError(f"DescribeInstanceTypes in {region or 'the default region'}: {exc}") from exc


# --- the stored table -----------------------------------------------------------


def packaged_path() -> Path:
    """The table that ships with pathprobe (and that the model uses)."""
    return Path(str(resources.files("pathprobe") / "data" / "instance_types.json"))


def read(path: Path) -> Table:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InstanceDataError(f"{path}: cannot read the instance-type table: {exc}") from exc
    try:
        return Table.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise InstanceDataError(
            f"{path}: not an instance-type table ({exc.error_count()} problem(s)); {loc}: {first['msg']}"
        ) from exc


@cache
def load(path: Path | None = None) -> Table:
    """The table at `path`, or the packaged one (read once)."""
    return read(path or packaged_path())


def write(table: Table, path: Path) -> None:
    """All or nothing: a reader (or a running exporter) never sees half a table."""
    write_atomic(path, table.to_json())
