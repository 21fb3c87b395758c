"""What the shipped rules cost a Prometheus at 1,000 hosts: each rule group's evaluation time
against its interval, and the costliest rules, healthy and with three faults at once.

A real Prometheus scrapes one synthetic exposition of bench/fleet.py's 1,000 hosts in 30 regions
(hierarchical, two representatives per region pair: 34,080 paths; the series the culprit rules
read, as tests/test_culprits.py's 1,000-host test serves them) every 10 s, with the rules every
30 s (that test's parameters). After --healthy seconds, the same three faults as that test: a host
down, a region pair and a zone at 3% loss. Read from /api/v1/rules after each evaluation.

Run: .venv/bin/python bench/rule_cost.py [--healthy 150] [--faulted 180]
The exposition is built in this process: on a 2-core machine it and Prometheus share the cores,
as a Prometheus shares its host with its scrapes; the figures include that contention."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from pathprobe.monitoring import rules
from pathprobe_lab import demo

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
import culprit_paths as fleet_test  # the 1,000-host test's fleet and faults (tests/ is not a package)

PROM_PORT, FLEET_PORT = 19490, 19499
# The first evaluations read no history (the loss window not yet filled): left out.
WARM_UP_SECONDS = 60


def rule_name(rule: dict[str, Any]) -> str:
    """A rule's name, with its scope where several rules record the same name (one per scope)."""
    scope = rule.get("labels", {}).get("scope")
    return f'{rule["name"]}{{scope="{scope}"}}' if scope and rule["type"] == "recording" else rule["name"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--healthy", type=float, default=150, help="seconds before the faults")
    parser.add_argument("--faulted", type=float, default=180, help="seconds with the faults")
    args = parser.parse_args()
    params = fleet_test.FLEET_PARAMS
    exporters = fleet_test.FleetExporters(fleet_test.fleet_mesh())
    server = fleet_test.serve_exposition(exporters, FLEET_PORT)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "rules.yml").write_text(rules.dump(params))
        (work / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {
                        "scrape_interval": fleet_test.FLEET_SCRAPE_INTERVAL,
                        "evaluation_interval": params.evaluation_interval,
                    },
                    "rule_files": [str(work / "rules.yml")],
                    "scrape_configs": [
                        {
                            "job_name": "pathprobe",
                            "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{FLEET_PORT}"]}],
                        }
                    ],
                }
            )
        )
        prom = subprocess.Popen(
            [
                demo.binary("prometheus"),
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{PROM_PORT}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # (phase, group) -> each evaluation's seconds; (phase, group, rule) -> the same per rule.
        groups: dict[tuple[str, str], list[float]] = defaultdict(list)
        per_rule: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        intervals: dict[str, float] = {}
        try:
            demo.wait_ready(f"http://127.0.0.1:{PROM_PORT}/-/ready", "Prometheus")
            seen: dict[str, str] = {}  # group -> its last evaluation read
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < args.healthy + args.faulted:
                if exporters.fault_at is None and elapsed >= args.healthy:
                    exporters.fault(fleet_test.fleet_loss(exporters.paths), fleet_test.FLEET_DOWN)
                phase = "faulted" if exporters.fault_at is not None else "healthy"
                with urllib.request.urlopen(f"http://127.0.0.1:{PROM_PORT}/api/v1/rules", timeout=10) as response:
                    for g in json.load(response)["data"]["groups"]:
                        if g["lastEvaluation"] in (seen.get(g["name"]), "0001-01-01T00:00:00Z"):
                            continue
                        seen[g["name"]], intervals[g["name"]] = g["lastEvaluation"], g["interval"]
                        if elapsed < WARM_UP_SECONDS:
                            continue
                        groups[phase, g["name"]].append(g["evaluationTime"])
                        for r in g["rules"]:
                            per_rule[phase, g["name"], rule_name(r)].append(r["evaluationTime"])
                time.sleep(2)
        finally:
            prom.terminate()
            prom.wait(timeout=60)
            server.shutdown()
    print(
        f"\n{len(exporters.paths):,} paths; rules every {params.evaluation_interval} (baseline every "
        f"{params.baseline_evaluation_interval}), scrapes every {fleet_test.FLEET_SCRAPE_INTERVAL}\n"
    )
    print("| phase | group | evaluations | median (s) | max (s) | interval (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (phase, name), times in sorted(groups.items()):
        print(
            f"| {phase} | {name} | {len(times)} | {statistics.median(times):.2f} | {max(times):.2f} "
            f"| {intervals[name]:g} |"
        )
    print("\nThe costliest rules (median over the evaluations of both phases):\n")
    print("| group | rule | median (s) | max (s) |")
    print("| --- | --- | --- | --- |")
    merged: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (_, group, rule), times in per_rule.items():
        merged[group, rule] += times
    costliest = sorted(merged.items(), key=lambda item: -statistics.median(item[1]))[:12]
    for (group, rule), times in costliest:
        print(f"| {group} | {rule} | {statistics.median(times):.2f} | {max(times):.2f} |")


if __name__ == "__main__":
    main()
