"""The exposition formats of /metrics, negotiated as client_python's own handler does
(`prometheus_client.exposition.choose_encoder`: OpenMetrics when the Accept header asks for it,
as Prometheus's does by default, else the text format; `gzip_accepted` for the compression).
The snapshot keeps one rendering per format asked for, all encoded from one collection of the
registry, each with its gzipped copy; the trailer that follows it (the snapshot's age, the web
server's counts) is encoded per scrape in the same format, and OpenMetrics' `# EOF` comes last."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

Encoder = Callable[[Collector], bytes]

EOF = b"# EOF\n"  # OpenMetrics' last line: after the trailer, not after the snapshot
# Formats kept rendered at once: the text format, OpenMetrics 1.0.0 and a few versions or
# escapings; one more asked for takes the place of the one asked for least recently.
MAX_FORMATS = 4

__all__ = ["EOF", "MAX_FORMATS", "Encoder", "choose_encoder", "default", "encode", "gzip_accepted", "trailer"]


class _Families(Collector):
    """Metric families collected once, to encode in each format."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def default() -> dict[str, Encoder]:
    """The format of a scrape that asks for none: the text format 0.0.4."""
    encoder, content_type = choose_encoder("")
    return {content_type: encoder}


def is_openmetrics(content_type: str) -> bool:
    return content_type.startswith("application/openmetrics-text")


def encode(registry: Collector, encoders: dict[str, Encoder]) -> dict[str, tuple[bytes, bytes]]:
    """Each format's body (OpenMetrics' without its `# EOF`) and its gzipped copy, by content
    type, from one collection of `registry` (compressed once here rather than per scrape:
    a 500-peer exposition is about 9 MB of text and 0.5 MB gzipped)."""
    source = registry if len(encoders) == 1 else _Families(registry.collect())
    bodies = {}
    for content_type, encoder in encoders.items():
        body = encoder(source).removesuffix(EOF)
        bodies[content_type] = (body, gzip.compress(body, compresslevel=1))
    return bodies


def trailer(encoder: Encoder, content_type: str, text: bytes) -> bytes:
    """The trailer, written in the text format, in the format of `content_type` (OpenMetrics:
    counters' families named without `_total`, and the `# EOF` that ends the exposition)."""
    if not is_openmetrics(content_type):
        return text
    return encoder(_Families(text_string_to_metric_families(text.decode())))
