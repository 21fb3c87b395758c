#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every check: lint, types, unit tests,
# then integration tests against real namespaces, iperf3, Prometheus and Alertmanager.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check exporter lab tests bench dashboards
.venv/bin/ruff format --check exporter lab tests bench dashboards
(cd exporter && ../.venv/bin/mypy src)
(cd lab && ../.venv/bin/mypy src)
(cd dashboards && ../.venv/bin/mypy --strict --ignore-missing-imports generate.py pathprobe_dashboards)
.venv/bin/pytest -v exporter/tests tests "$@"
