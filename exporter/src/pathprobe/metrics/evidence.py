"""The evidence room: the id of each test's last record (the dashboards' and alerts' link to
/tests/<id>), and what the evidence store holds and could not keep."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..config import Config
from ..evidence import ERRORS, EvidenceStore
from ..keys import TestKey
from .common import TEST, Room, counter, gauge, one


class EvidenceRoom(Room):
    def __init__(self, cfg: Config, store: EvidenceStore | None):
        super().__init__(cfg)
        self.store = store
        self.last: dict[TestKey, str] = {}
        if store is not None:  # a restart: the last ids are those the store kept
            for key, test_id in store.last_by_test().items():
                self.kept(TestKey(*key), test_id)

    def tables(self) -> list[MutableMapping[Any, Any]]:
        return [self.last]

    def kept(self, key: TestKey, test_id: str) -> None:
        if self.admits(key.peer):
            self.last[key] = test_id

    def collect(self) -> Iterator[Metric]:
        last = gauge(
            "pathprobe_evidence_last_test_info",
            "The id of the last kept record of each test (value 1): its whole result is at /tests/<test_id> on this "
            "exporter, behind the same authentication as /metrics.",
            [*TEST, "test_id"],
        )
        for peer, key, test_id in self.scope.entries(self.last):
            last.add_metric([*peer, *key.spec, test_id], 1)
        yield last
        if self.store is None:
            return
        records, size = self.store.stats()
        yield one(GaugeMetricFamily, "pathprobe_evidence_records", "Test records the evidence store holds.", records)
        yield one(GaugeMetricFamily, "pathprobe_evidence_bytes", "Bytes the evidence store's records take.", size)
        yield one(
            CounterMetricFamily,
            "pathprobe_evidence_evicted",
            "Records removed, the oldest first, to keep the store within evidence.max_tests and evidence.max_bytes.",
            self.store.evicted,
        )
        errors = counter(
            "pathprobe_evidence_errors",
            "Records not kept or not read, by reason: no_space (the disk is full), io_error (the directory cannot be "
            "used: the log says why), too_large (one record over evidence.max_bytes), corrupt (a record that does not "
            "parse, read back after a restart: skipped and removed).",
            ["reason"],
        )
        counts = dict(self.store.errors)
        for reason in ERRORS:
            errors.add_metric([reason], counts.get(reason, 0))
        yield errors
