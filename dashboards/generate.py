"""Grafana dashboards for pathprobe, as code (grafana-foundation-sdk): one module per
dashboard in pathprobe_dashboards/, built from the monitoring parameters that the rules
use too (pathprobe.monitoring.params: selector, thresholds, windows).

    .venv/bin/python dashboards/generate.py                       # writes dashboards/json/*.json
    .venv/bin/python dashboards/generate.py --check               # exit 1 if the committed JSON differs
    .venv/bin/python dashboards/generate.py --params my.yaml --out-dir DIR   # a fleet's parameters
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from pathprobe.files import write_atomic
from pathprobe.monitoring.params import Params, load_params
from pathprobe.yamlfile import ConfigError
from pathprobe_dashboards import capacity, exporter_health, overview, path_detail

OUT = Path(__file__).parent / "json"
DASHBOARDS = {
    "overview": overview,
    "path-detail": path_detail,
    "capacity": capacity,
    "exporter-health": exporter_health,
}


def render(p: Params) -> dict[str, str]:
    return {
        f"{name}.json": json.dumps(module.build(p).build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"
        for name, module in DASHBOARDS.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed JSON instead of writing")
    parser.add_argument("--params", help="YAML of monitoring parameters (see alerts/README.md)")
    parser.add_argument("--out-dir", type=Path, default=OUT, help="where to write the JSON")
    args = parser.parse_args()
    try:
        rendered = render(load_params(args.params))
    except ConfigError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return 2
    if args.check:
        stale = [n for n, text in rendered.items() if not (OUT / n).exists() or (OUT / n).read_text() != text]
        if stale:
            print(f"dashboards out of date: {', '.join(stale)} (run dashboards/generate.py)", file=sys.stderr)
            return 1
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        write_atomic(args.out_dir / name, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
